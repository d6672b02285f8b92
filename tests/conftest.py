from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    if not (CHECKPOINT / "manifest.json").exists():
        pytest.fail(f"default model not built at {CHECKPOINT}: run scripts/setup.sh (scripts/test.sh does)")
    return CHECKPOINT


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(checkpoint)
