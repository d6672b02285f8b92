"""The model repository's other names for the engine stay in step with `llm`: `ensemble` and
`tensorrt_llm_bls` (Triton ensembles of one step) and `llm_unary` (the BLS forwarder) declare
exactly llm's inputs and outputs, map every one of them, and hold no engine of their own."""
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

REPO = Path(__file__).resolve().parents[2] / "model_repository"


def load(name: str) -> mc.ModelConfig:
    return text_format.Parse((REPO / name / "config.pbtxt").read_text(), mc.ModelConfig())


def signature(tensors) -> list:
    return [(t.name, t.data_type, list(t.dims), getattr(t, "optional", False)) for t in tensors]


@pytest.fixture(scope="module")
def llm():
    cfg = load("llm")
    assert cfg.model_transaction_policy.decoupled
    return cfg


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls", "llm_unary"])
def test_same_interface_as_llm(llm, name):
    cfg = load(name)
    assert cfg.name == name
    assert signature(cfg.input) == signature(llm.input)
    assert signature(cfg.output) == signature(llm.output)
    assert 0 < cfg.max_batch_size <= llm.max_batch_size


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls"])
def test_ensembles_forward_every_tensor_to_llm(llm, name):
    cfg = load(name)
    assert cfg.platform == "ensemble"
    (step,) = cfg.ensemble_scheduling.step
    assert step.model_name == "llm"
    names = [t.name for t in llm.input]
    assert dict(step.input_map) == dict(zip(names, names))
    names = [t.name for t in llm.output]
    assert dict(step.output_map) == dict(zip(names, names))
    assert [p.name for p in (REPO / name / "1").iterdir()] == ["README.md"]  # no model file: no second copy


def test_unary_model_forwards_to_llm_and_is_not_decoupled():
    cfg = load("llm_unary")
    assert not cfg.model_transaction_policy.decoupled
    assert cfg.backend == "python"
    assert cfg.parameters["forward_to"].string_value == "llm"
    model_py = (REPO / "llm_unary" / "1" / "model.py").read_text()
    assert "from backend.frontend.triton_forward import TritonPythonModel" in model_py
