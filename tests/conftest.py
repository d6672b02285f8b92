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


@pytest.fixture(scope="session")
def built_drafter(checkpoint):
    """name -> a built model drafter's directory in .cache/drafters: a full build if one is there,
    else the quick build (what the tests need: they check correctness, not quality), distilled the
    first time a test asks for it (build_engines/on_demand.py) and kept for every later run."""
    from build_engines.on_demand import DRAFTER_DIR, ensure_drafter
    return lambda name: ensure_drafter(name, DRAFTER_DIR, checkpoint, preset="quick")


@pytest.fixture(scope="session")
def model_drafters(built_drafter) -> Path:
    """.cache/drafters with every model drafter the server can serve built (chat, code, chat-feature)."""
    from build_engines.on_demand import DRAFTER_DIR, MODEL_DRAFTERS
    for name in MODEL_DRAFTERS:
        built_drafter(name)
    return DRAFTER_DIR


@pytest.fixture(scope="session")
def load_tool():
    """name -> the path of perf_analyzer or genai-perf, installed the first time a test needs them
    (scripts/setup_loadtools.sh, through build_engines/on_demand.py)."""
    from build_engines.on_demand import load_tool as ensure
    return ensure
