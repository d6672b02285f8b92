"""The model repository's other names for the engine stay in step with `llm`: `ensemble` and
`tensorrt_llm_bls` (Triton ensembles of one step) and `llm_unary` (the BLS forwarder) declare
exactly llm's text interface (llm's inputs and outputs but the token-level ones, text_input
required), map every one of them, and hold no engine of their own. NVIDIA's token-level models
(`preprocessing`, `tensorrt_llm`, `postprocessing`) keep NVIDIA's names, dtypes and shapes, and
`tensorrt_llm` forwards to llm only what llm declares."""
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

REPO = Path(__file__).resolve().parents[2] / "model_repository"
TOKEN_INPUTS = ("input_ids", "stop_words_list", "bad_words_list")  # llm's token-level prompt (tensorrt_llm's)
TOKEN_OUTPUTS = ("output_ids", "sequence_length")


def load(name: str) -> mc.ModelConfig:
    return text_format.Parse((REPO / name / "config.pbtxt").read_text(), mc.ModelConfig())


def signature(tensors) -> list:
    return [(t.name, t.data_type, list(t.dims), getattr(t, "optional", False)) for t in tensors]


@pytest.fixture(scope="module")
def llm():
    cfg = load("llm")
    assert cfg.model_transaction_policy.decoupled
    return cfg


def text_interface(llm):
    """llm's inputs and outputs without the token-level ones; text_input required."""
    inputs = [(n, t, d, o and n != "text_input") for n, t, d, o in signature(llm.input) if n not in TOKEN_INPUTS]
    return inputs, [s for s in signature(llm.output) if s[0] not in TOKEN_OUTPUTS]


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls", "llm_unary"])
def test_same_interface_as_llm(llm, name):
    cfg = load(name)
    assert cfg.name == name
    assert (signature(cfg.input), signature(cfg.output)) == text_interface(llm)
    assert 0 < cfg.max_batch_size <= llm.max_batch_size


@pytest.mark.parametrize("name", ["ensemble", "tensorrt_llm_bls"])
def test_ensembles_forward_every_tensor_to_llm(llm, name):
    cfg = load(name)
    assert cfg.platform == "ensemble"
    (step,) = cfg.ensemble_scheduling.step
    assert step.model_name == "llm"
    names = [t.name for t in llm.input if t.name not in TOKEN_INPUTS]
    assert dict(step.input_map) == dict(zip(names, names))
    names = [t.name for t in llm.output if t.name not in TOKEN_OUTPUTS]
    assert dict(step.output_map) == dict(zip(names, names))
    assert [p.name for p in (REPO / name / "1").iterdir()] == ["README.md"]  # no model file: no second copy


def test_unary_model_forwards_to_llm_and_is_not_decoupled():
    cfg = load("llm_unary")
    assert not cfg.model_transaction_policy.decoupled
    assert cfg.backend == "python"
    assert cfg.parameters["forward_to"].string_value == "llm"
    model_py = (REPO / "llm_unary" / "1" / "model.py").read_text()
    assert "from backend.frontend.triton_models.forward import TritonPythonModel" in model_py


def test_tensorrt_llm_unary_is_tensorrt_llm_answering_once():
    cfg, target = load("tensorrt_llm_unary"), load("tensorrt_llm")
    assert not cfg.model_transaction_policy.decoupled and target.model_transaction_policy.decoupled
    assert (signature(cfg.input), signature(cfg.output)) == (signature(target.input), signature(target.output))
    assert cfg.parameters["forward_to"].string_value == "tensorrt_llm"
    assert cfg.parameters["stream_input"].string_value == "streaming"
    model_py = (REPO / "tensorrt_llm_unary" / "1" / "model.py").read_text()
    assert "from backend.frontend.triton_models.forward import TritonPythonModel" in model_py


# NVIDIA's token-level models (all_models/inflight_batcher_llm/*/config.pbtxt): name, dtype, dims
# and optional flag of what we declare, and what each must declare.
T = mc.DataType


def nvidia(*rows):
    return {n: (t, d, o) for n, t, d, o in rows}


PREPROCESSING_IN = nvidia(("QUERY", T.TYPE_STRING, [1], False), ("REQUEST_OUTPUT_LEN", T.TYPE_INT32, [1], False),
                          ("BAD_WORDS_DICT", T.TYPE_STRING, [-1], True), ("STOP_WORDS_DICT", T.TYPE_STRING, [-1], True),
                          ("END_ID", T.TYPE_INT32, [1], True), ("PAD_ID", T.TYPE_INT32, [1], True))
PREPROCESSING_OUT = nvidia(("INPUT_ID", T.TYPE_INT32, [-1], False), ("REQUEST_INPUT_LEN", T.TYPE_INT32, [1], False),
                           ("DECODER_INPUT_ID", T.TYPE_INT32, [-1], False),
                           ("REQUEST_DECODER_INPUT_LEN", T.TYPE_INT32, [1], False),
                           ("BAD_WORDS_IDS", T.TYPE_INT32, [2, -1], False), ("STOP_WORDS_IDS", T.TYPE_INT32, [2, -1], False),
                           ("EMBEDDING_BIAS", T.TYPE_FP32, [-1], False), ("REQUEST_OUTPUT_LEN", T.TYPE_INT32, [-1], False),
                           ("OUT_END_ID", T.TYPE_INT32, [1], False), ("OUT_PAD_ID", T.TYPE_INT32, [1], False))
TRTLLM_IN = nvidia(("input_ids", T.TYPE_INT32, [-1], False), ("input_lengths", T.TYPE_INT32, [1], False),
                   ("request_output_len", T.TYPE_INT32, [1], False), ("end_id", T.TYPE_INT32, [1], True),
                   ("pad_id", T.TYPE_INT32, [1], True), ("streaming", T.TYPE_BOOL, [1], True),
                   ("runtime_top_k", T.TYPE_INT32, [1], True), ("runtime_top_p", T.TYPE_FP32, [1], True),
                   ("temperature", T.TYPE_FP32, [1], True), ("seed", T.TYPE_UINT64, [1], True),
                   ("beam_width", T.TYPE_INT32, [1], True), ("stop_words_list", T.TYPE_INT32, [2, -1], True),
                   ("bad_words_list", T.TYPE_INT32, [2, -1], True), ("decoder_input_ids", T.TYPE_INT32, [-1], True),
                   ("guided_decoding_guide_type", T.TYPE_STRING, [1], True),
                   ("guided_decoding_guide", T.TYPE_STRING, [1], True))
TRTLLM_OUT = nvidia(("output_ids", T.TYPE_INT32, [-1, -1], False), ("sequence_length", T.TYPE_INT32, [-1], False),
                    ("cum_log_probs", T.TYPE_FP32, [-1], False), ("output_log_probs", T.TYPE_FP32, [-1, -1], False))
POSTPROCESSING_IN = nvidia(("TOKENS_BATCH", T.TYPE_INT32, [-1, -1], False), ("SEQUENCE_LENGTH", T.TYPE_INT32, [-1], False))
POSTPROCESSING_OUT = nvidia(("OUTPUT", T.TYPE_STRING, [-1], False))


@pytest.mark.parametrize("name,inputs,outputs", [("preprocessing", PREPROCESSING_IN, PREPROCESSING_OUT),
                                                 ("tensorrt_llm", TRTLLM_IN, TRTLLM_OUT),
                                                 ("postprocessing", POSTPROCESSING_IN, POSTPROCESSING_OUT)])
def test_token_models_keep_nvidias_interface(name, inputs, outputs):
    cfg = load(name)
    assert cfg.name == name and cfg.backend == "python" and cfg.max_batch_size > 0
    declared = {n: (t, d, o) for n, t, d, o in signature(cfg.input)}
    assert {n: declared.get(n) for n in inputs} == inputs
    declared = {n: (t, d, o) for n, t, d, o in signature(cfg.output)}
    assert {n: declared.get(n) for n in outputs} == outputs
    assert cfg.model_transaction_policy.decoupled == (name == "tensorrt_llm")
    model_py = (REPO / name / "1" / "model.py").read_text()
    assert "from backend.frontend.triton_models.tokens import" in model_py


def test_tensorrt_llm_forwards_to_llm_what_llm_declares(llm):
    from backend.frontend.triton_models.token_models import RENAMED, SAME

    cfg = load("tensorrt_llm")
    assert cfg.parameters["forward_to"].string_value == "llm"
    llm_inputs = {t.name: (t.data_type, list(t.dims)) for t in llm.input}
    mine = {t.name: (t.data_type, list(t.dims)) for t in cfg.input}
    guided = ("guided_decoding_guide_type", "guided_decoding_guide")  # llm learns them elsewhere (issue 32)
    for name in list(SAME) + list(RENAMED) + ["input_ids"]:
        if name in guided and name not in llm_inputs:
            continue
        assert mine[name] == llm_inputs[RENAMED.get(name, name)], name
    llm_outputs = {t.name: (t.data_type, list(t.dims)) for t in llm.output}
    for t in cfg.output:  # relayed as llm sends them
        assert llm_outputs[t.name] == (t.data_type, list(t.dims)), t.name


def test_tokenizer_models_use_llms_checkpoint(llm):
    for name in ("preprocessing", "postprocessing"):
        assert load(name).parameters["checkpoint"].string_value == llm.parameters["checkpoint"].string_value


def test_the_served_drafters_include_every_model_free_one_the_policy_lists(llm):
    """The served config once listed `ngram,suffix` only, so the default policy never drafted a
    grammar's forced tokens through the server: every model-free drafter the served policy's
    config names (model drafters are served where they are built) is served."""
    import yaml

    from backend.drafters import DRAFTERS
    served = llm.parameters["drafters"].string_value.split(",")
    policy = yaml.safe_load((REPO.parent / llm.parameters["policy"].string_value).read_text())
    listed = [d for d in policy["params"]["drafters"] if d in DRAFTERS and not DRAFTERS[d].is_model]
    assert "grammar" in listed and set(listed) <= set(served), (listed, served)
