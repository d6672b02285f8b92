"""Fixtures for the services: the fake `tensorrt_llm` of trtllm/ (installed into sys.modules per
test, removed after) and the record of the real upstream names it is built from; and the skip
of trtllm/'s `gpu`-marked tests where no real `tensorrt_llm` is importable."""
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

TRTLLM = Path(__file__).resolve().parent / "trtllm"
FAKE_ROOT = TRTLLM / "fake_tensorrt_llm"


def _real_trtllm() -> bool:
    try:
        spec = importlib.util.find_spec("tensorrt_llm")
    except (ImportError, ValueError):
        return False
    return spec is not None and not str(spec.origin or "").startswith(str(FAKE_ROOT))


def pytest_collection_modifyitems(config, items):
    if _real_trtllm():
        return
    skip = pytest.mark.skip(reason="needs a GPU and the real tensorrt_llm (run inside the TensorRT-LLM container)")
    for item in items:
        if item.get_closest_marker("gpu") and TRTLLM in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def _drop_trtllm_modules():
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch):
    """The fake package as `tensorrt_llm`; its access log starts empty."""
    if _real_trtllm():
        pytest.skip("a real tensorrt_llm is importable here; the fake is not installed over it")
    _drop_trtllm_modules()
    monkeypatch.syspath_prepend(str(FAKE_ROOT))
    mod = importlib.import_module("tensorrt_llm")
    fake = importlib.import_module("tensorrt_llm._fake")
    fake.ACCESSES.clear()
    yield mod
    fake.EXECUTOR_FACTORY = None
    _drop_trtllm_modules()


@pytest.fixture(scope="session")
def upstream_record():
    return json.loads((TRTLLM / "upstream_api.json").read_text())
