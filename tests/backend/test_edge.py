"""The HTTP edge's checks (backend/edge.py), without a server: tests/integration/test_hostile_input.py
runs them against the real one."""
import pytest

from backend.edge import EdgeError, check_generate, json_depth, parse_json, status_for_model_error

TYPES = {"text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32", "random_seed": "TYPE_UINT64",
         "temperature": "TYPE_FP32", "stream": "TYPE_BOOL", "stop_words": "TYPE_STRING"}


def test_depth():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [[1]]}) == 3
    assert json_depth(parse_json(b"[" * 32 + b"]" * 32, 32)) == 32
    with pytest.raises(EdgeError, match="deeper than 32"):
        parse_json(b"[" * 33 + b"]" * 33, 32)
    with pytest.raises(EdgeError, match="deeper than 32"):
        parse_json(b"[" * 40000 + b"]" * 40000, 32)  # Python's parser stops at its recursion limit


@pytest.mark.parametrize("raw,words", [(b"", "empty"), (b"  \n", "empty"), (b'{"a": ', "not valid JSON"),
                                       (b"\xff\xfe", "not valid JSON")])
def test_unparsable(raw, words):
    with pytest.raises(EdgeError, match=words) as e:
        parse_json(raw, 32)
    assert e.value.status == 400


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


def test_model_error_status():
    assert status_for_model_error(400, "server overloaded: 3 requests are waiting") == 503
    assert status_for_model_error(400, "internal error while accepting this request") == 500
    assert status_for_model_error(400, "max_tokens must be a positive integer") == 400
    assert status_for_model_error(404, "server overloaded") == 404


def test_infer_on_a_decoupled_model_goes_to_the_unary_model():
    """Triton answers 501 to /infer on a decoupled model: the edge sends it to llm_unary (if served)."""
    import asyncio

    from aiohttp.test_utils import make_mocked_request

    from backend.edge import Edge

    edge = Edge("http://127.0.0.1:9")
    served = {"llm_unary": {"text_input": "TYPE_STRING"}}

    async def inputs(model):
        return served.get(model, {})

    edge._model_inputs = inputs

    def route(path):
        return asyncio.run(edge._route(make_mocked_request("POST", path)))

    assert route("/v2/models/llm/infer") == "/v2/models/llm_unary/infer"
    assert route("/v2/models/ensemble/versions/1/infer?a=b") == "/v2/models/llm_unary/versions/1/infer?a=b"
    assert route("/v2/models/tensorrt_llm_bls/infer") == "/v2/models/llm_unary/infer"
    assert route("/v2/models/llm/generate") == "/v2/models/llm/generate"
    assert route("/v2/models/other/infer") == "/v2/models/other/infer"
    served.clear()  # a repository without the unary model: Triton's own answer
    assert route("/v2/models/llm/infer") == "/v2/models/llm/infer"
