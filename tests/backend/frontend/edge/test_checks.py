"""The edge's checks of Triton-protocol bodies (backend/frontend/edge/checks.py), without a server:
tests/integration/test_hostile_input.py runs them against the real one."""
import pytest

from backend.frontend.edge.checks import check_generate, check_infer
from backend.frontend.http_body import EdgeError

TYPES = {"text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32", "random_seed": "TYPE_UINT64",
         "temperature": "TYPE_FP32", "stream": "TYPE_BOOL", "stop_words": "TYPE_STRING"}


@pytest.mark.parametrize("body,words", [
    ([1], "JSON object"),
    ({"max_tokens": 2**32 + 8}, "max_tokens 4294967304 is out of range"),
    ({"max_tokens": -2**31 - 1}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens must be an integer"),
    ({"max_tokens": 2.0}, "max_tokens must be an integer"),
    ({"random_seed": -1}, "random_seed -1 is out of range"),
    ({"random_seed": 2**64}, "random_seed"),
    ({"temperature": 1e300}, r"temperature 1e\+300 is out of range for FP32"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"stream": 1}, "stream must be true or false"),
    ({"stop_words": ["a", 3]}, "stop_words must be a string"),
    ({"text_input": None}, "text_input must be a string, got null"),
])
def test_wrong_types_and_ranges_name_the_field(body, words):
    with pytest.raises(EdgeError, match=words):
        check_generate(body, TYPES)


def test_valid_bodies_pass():
    check_generate({"text_input": "hi", "max_tokens": 2**31 - 1, "random_seed": 2**64 - 1, "temperature": 0.7,
                    "stream": True, "stop_words": ["a", "b"], "id": "r1", "parameters": {"priority": 1}}, TYPES)
    check_generate({"temperature": float("nan")}, TYPES)  # the model refuses it, naming it
    check_generate({"anything": 1}, {})  # a model the edge does not know: Triton answers


@pytest.mark.parametrize("body,words", [
    ({"text_input": "hi", "repetition_penalty": 1.2}, "unexpected input 'repetition_penalty'"),
    ({"text_input": "hi", "min_length": 4}, "unexpected input 'min_length'.*max_tokens"),
    ({"text_input": "hi", "parameters": {"max_tokens": 4}}, "parameters.max_tokens is not read"),
])
def test_unknown_inputs_are_refused_naming_them(body, words):
    with pytest.raises(EdgeError, match=words) as e:
        check_generate(body, TYPES)
    assert e.value.status == 400


def _tensor(name, shape, datatype, data):
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


TEXT = _tensor("text_input", [1, 1], "BYTES", ["hi"])


@pytest.mark.parametrize("body,words", [
    ({"inputs": {"text_input": TEXT}}, "inputs must be an array of tensor objects, got an object"),
    ({"inputs": [TEXT], "outputs": {"name": "text_output"}}, "outputs must be an array"),
    ({"inputs": [TEXT, 3]}, r"inputs\[1\] must be a tensor object"),
    ({"inputs": [_tensor("text_input", [-1, 1], "BYTES", ["hi"])]}, "input 'text_input': shape must be an array of "
                                                                     r"non-negative integers, got \[-1, 1\]"),
    ({"inputs": [_tensor("text_input", [1.5, 1], "BYTES", ["hi"])]}, "input 'text_input': shape"),
    ({"inputs": [_tensor("text_input", [True], "BYTES", ["hi"])]}, "input 'text_input': shape"),
    ({"inputs": [TEXT, _tensor("max_tokens", [1, 1], "INT32", [8.7])]}, "max_tokens must be an integer, got a number"),
    ({"inputs": [TEXT, _tensor("max_tokens", [1, 1], "INT32", ["8"])]}, "max_tokens must be an integer, got a string"),
    ({"inputs": [TEXT, _tensor("max_tokens", [1, 1], "INT32", [2**32 + 8])]}, "max_tokens 4294967304 is out of range"),
    ({"inputs": [TEXT, _tensor("stream", [1, 1], "BOOL", ["yes"])]}, "stream must be true or false, got a string"),
    ({"inputs": [_tensor("text_input", [1, 1], "BYTES", [5])]}, "text_input must be a string"),
    ({"inputs": [{"name": 3, "shape": [1], "datatype": "INT32", "data": [1]}]}, r"inputs\[0\].name must be a string"),
    ([TEXT], "must be a JSON object"),
])
def test_infer_body_mistakes_are_400s_naming_the_field(body, words):
    """Triton 2.51 answers 500 for each of these (or wraps max_tokens 2^32+8 to 8)."""
    with pytest.raises(EdgeError, match=words) as e:
        check_infer(body)
    assert e.value.status == 400


def test_valid_infer_bodies_pass():
    check_infer({"inputs": [_tensor("text_input", [2, 1], "BYTES", [["a"], ["b"]]),
                            _tensor("max_tokens", [2, 1], "INT32", [[4], [4]]),
                            _tensor("temperature", [1, 1], "FP32", [0.5]), _tensor("stream", [1, 1], "BOOL", [False])],
                 "outputs": [{"name": "text_output"}], "parameters": {"priority": 1}})
    # the JSON header of a binary request: the data follows it
    check_infer({"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES",
                             "parameters": {"binary_data_size": 6}}]})
    check_infer({"inputs": [_tensor("x", [1], "STRANGE", ["?"])]})  # an unknown datatype: Triton names it
