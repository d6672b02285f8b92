"""Fixtures for the TensorRT-LLM path beside those of tests/backend/services/conftest.py (the fake
`tensorrt_llm`, the upstream record, the skip of `gpu` tests): a small fp32 torch engine."""
import pytest


@pytest.fixture(scope="module")
def trt_engine(checkpoint):
    from backend.engines.torch_llama import TorchLlama
    return TorchLlama(checkpoint, dtype="fp32", max_slots=3, max_context=128)
