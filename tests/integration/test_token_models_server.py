"""NVIDIA's token-level models against the real server: `preprocessing` (text -> ids),
`tensorrt_llm` (ids -> ids on llm's engine, streaming and not) and `postprocessing` (ids -> text),
with requests shaped as NVIDIA's end_to_end_test.py (unary calls chained by hand) and
inflight_batcher_llm_client.py (a gRPC stream to tensorrt_llm with input_ids) send them. Greedy
tokens through tensorrt_llm equal the text path's; bad requests are refused naming the field."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_unary_and_names import PROMPT, http_generate, stream_like_nvidia, tensors

OUT = ("output_ids", "sequence_length")


@pytest.fixture(scope="module")
def text_path(server):
    """llm's greedy answer to PROMPT over /generate, with its token ids (return_log_probs)."""
    status, body = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16, "return_log_probs": True,
                                                 "exclude_input_in_output": True})
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def pre(server):
    """preprocessing's answer for PROMPT, as end_to_end_test.py asks for it (client.infer)."""
    client = httpclient.InferenceServerClient(server.http, network_timeout=120, connection_timeout=120)
    try:
        result = client.infer("preprocessing", tensors(httpclient, {
            "QUERY": np.array([[PROMPT.encode()]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[16]], np.int32),
            "BAD_WORDS_DICT": np.array([[b""]], dtype=object), "STOP_WORDS_DICT": np.array([[b""]], dtype=object)}))
    finally:
        client.close()
    return {n: result.as_numpy(n) for n in ("INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "OUT_END_ID",
                                            "OUT_PAD_ID", "DECODER_INPUT_ID", "STOP_WORDS_IDS", "BAD_WORDS_IDS")}


def trtllm_request(pre, streaming=False, **extra) -> dict:
    """What end_to_end_test.py sends tensorrt_llm: preprocessing's outputs under NVIDIA's input names."""
    values = {"input_ids": pre["INPUT_ID"], "input_lengths": pre["REQUEST_INPUT_LEN"],
              "request_output_len": pre["REQUEST_OUTPUT_LEN"], "end_id": pre["OUT_END_ID"],
              "pad_id": pre["OUT_PAD_ID"], "decoder_input_ids": pre["DECODER_INPUT_ID"],
              "streaming": np.array([[streaming]])}
    values.update(extra)
    return values


def test_preprocessing_outputs(pre, tokenizer):
    ids = pre["INPUT_ID"]
    assert ids.dtype == np.int32 and ids.shape == (1, int(pre["REQUEST_INPUT_LEN"][0][0]))
    assert ids[0].tolist() == tokenizer(PROMPT).input_ids
    assert pre["OUT_END_ID"].tolist() == [[tokenizer.eos_token_id]] and pre["REQUEST_OUTPUT_LEN"].tolist() == [[16]]
    assert pre["STOP_WORDS_IDS"].shape == (1, 2, 1) and pre["STOP_WORDS_IDS"][0][1][0] == -1  # no words


def test_tensorrt_llm_greedy_equals_the_text_path(server, pre, text_path):
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm", trtllm_request(pre), OUT)
    assert errors == [] and len(results) == 1
    ids, n = results[0].as_numpy("output_ids"), results[0].as_numpy("sequence_length")
    prompt = pre["INPUT_ID"][0].tolist()
    assert ids.shape == (1, 1, n[0][0]) and ids[0][0].tolist() == prompt + text_path["output_token_ids"]


@pytest.mark.parametrize("protocol, model", [(httpclient, "tensorrt_llm"), (grpcclient, "tensorrt_llm_unary")],
                         ids=["http-edge-route", "grpc-unary"])
def test_unary_calls_like_end_to_end_test(server, pre, text_path, protocol, model):
    """end_to_end_test.py calls client.infer("tensorrt_llm") over HTTP: the edge sends it to
    tensorrt_llm_unary, which gRPC clients call by name (Triton refuses ModelInfer on a decoupled model)."""
    url = server.http if protocol is httpclient else server.grpc
    client = protocol.InferenceServerClient(url, **({"network_timeout": 120, "connection_timeout": 120}
                                                   if protocol is httpclient else {}))
    try:
        result = client.infer(model, tensors(protocol, trtllm_request(pre, streaming=True)))
    finally:
        client.close()
    ids, n = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
    assert ids.shape == (1, 1, n[0][0]) and ids[0][0].tolist() == pre["INPUT_ID"][0].tolist() + text_path["output_token_ids"]


def test_tensorrt_llm_streaming_gives_the_new_ids_each_step(server, pre, text_path):
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm", trtllm_request(pre, streaming=True), OUT)
    assert errors == [] and len(results) > 1
    streamed = []
    for r in results:
        assert r.as_numpy("sequence_length")[0][0] == r.as_numpy("output_ids").shape[2]
        streamed += r.as_numpy("output_ids")[0][0].tolist()
    assert streamed == text_path["output_token_ids"]


def test_inflight_batcher_client_flow(server, tokenizer, text_path):
    """inflight_batcher_llm_client.py -S with its defaults (top_k 1, top_p 0, temperature 1.0):
    its tensors, a gRPC stream, output_ids[0][0] added up while sequence_length > 0."""
    input_ids = np.array([tokenizer.encode(PROMPT)], dtype=np.int32)
    values = {"input_ids": input_ids, "input_lengths": np.array([[input_ids.shape[1]]], np.int32),
              "request_output_len": np.array([[16]], np.int32), "beam_width": np.array([[1]], np.int32),
              "temperature": np.array([[1.0]], np.float32), "streaming": np.array([[True]]),
              "end_id": np.array([[tokenizer.eos_token_id]], np.int32), "pad_id": np.array([[tokenizer.pad_token_id]], np.int32),
              "runtime_top_k": np.array([[1]], np.int32), "runtime_top_p": np.array([[0.0]], np.float32)}
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm", values, OUT, request_id="7")
    assert errors == []
    tokens = list(input_ids[0])
    for r in results:
        if r.as_numpy("sequence_length")[0][0] > 0:
            tokens += list(r.as_numpy("output_ids")[0][0])
    assert tokens[input_ids.shape[1]:] == text_path["output_token_ids"]
    assert tokenizer.decode(tokens[input_ids.shape[1]:]) == text_path["text_output"]


def test_end_to_end_chain_and_postprocessing(server, pre, text_path):
    """preprocessing -> tensorrt_llm -> postprocessing by hand, as end_to_end_test.py chains them."""
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm",
                                         trtllm_request(pre, exclude_input_in_output=np.array([[True]])), OUT)
    assert errors == []
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        out = client.infer("postprocessing", tensors(grpcclient, {
            "TOKENS_BATCH": results[0].as_numpy("output_ids"), "SEQUENCE_LENGTH": results[0].as_numpy("sequence_length")}))
    finally:
        client.close()
    assert out.as_numpy("OUTPUT").tolist() == [text_path["text_output"].encode()]


def test_postprocessing_with_split_character(server, tokenizer):
    ids = tokenizer("ok 🦊", add_special_tokens=False).input_ids
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        outs = [client.infer("postprocessing", tensors(grpcclient, {
            "TOKENS_BATCH": np.array([[ids]], np.int32), "SEQUENCE_LENGTH": np.array([[n]], np.int32)})
        ).as_numpy("OUTPUT")[0].decode("utf-8") for n in (len(ids) - 1, len(ids))]
    finally:
        client.close()
    assert outs[0].endswith("\ufffd") and outs[1] == "ok 🦊"


def test_token_stop_and_bad_words(server, pre, text_path, tokenizer):
    """stop_words_list / bad_words_list as preprocessing makes them (STOP_WORDS_DICT / BAD_WORDS_DICT)."""
    greedy = text_path["output_token_ids"]
    stop = np.array([[greedy[2:4], [2, -1]]], np.int32)  # the 3rd and 4th generated ids, one word
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm",
                                         trtllm_request(pre, stop_words_list=stop,
                                                        exclude_input_in_output=np.array([[True]])), OUT)
    assert errors == [] and results[0].as_numpy("output_ids")[0][0].tolist() == greedy[:4]
    bad = np.array([[[greedy[0]], [1]]], np.int32)
    # min_tokens 1: the end id cannot take the banned token's place (whether it is the runner-up
    # depends on the kernels' last bits)
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm",
                                         trtllm_request(pre, bad_words_list=bad, min_tokens=np.array([[1]], np.int32),
                                                        exclude_input_in_output=np.array([[True]])), OUT)
    out = results[0].as_numpy("output_ids")[0][0].tolist() if errors == [] else []
    assert errors == [] and out and out[0] != greedy[0]


@pytest.mark.parametrize("change,words", [
    (dict(input_lengths=np.array([[999]], np.int32)), "input_lengths 999 is outside"),
    (dict(input_ids=np.array([[1 << 20]], np.int32), input_lengths=np.array([[1]], np.int32)),
     "input_ids holds token id 1048576"),
    (dict(request_output_len=np.array([[0]], np.int32)), "max_tokens must be a positive integer"),
    (dict(beam_width=np.array([[2]], np.int32)), "beam_width 2 is not supported"),
    (dict(stop_words_list=np.array([[[1, 2], [5, -1]]], np.int32)), "stop_words_list offsets must increase"),
    (dict(return_context_logits=np.array([[True]])), "return_context_logits is not served"),
    (dict(lora_task_id=np.array([[1]], np.uint64)), "unexpected inference input 'lora_task_id'"),
])
def test_tensorrt_llm_refusals_name_the_field_and_spare_other_requests(server, pre, text_path, change, words):
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm", trtllm_request(pre, **change), OUT)
    assert results == [] and len(errors) == 1 and words in errors[0], errors
    results, errors = stream_like_nvidia(server.grpc, "tensorrt_llm",
                                         trtllm_request(pre, exclude_input_in_output=np.array([[True]])), OUT)
    assert errors == [] and results[0].as_numpy("output_ids")[0][0].tolist() == text_path["output_token_ids"]


def test_preprocessing_refusal_over_http(server):
    client = httpclient.InferenceServerClient(server.http, network_timeout=120, connection_timeout=120)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer("preprocessing", tensors(httpclient, {
                "QUERY": np.array([[b"hi"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
                "EMBEDDING_BIAS_WORDS": np.array([[b"x"]], dtype=object)}))
    finally:
        client.close()
    assert e.value.status() == "400" and "EMBEDDING_BIAS_WORDS is not served" in e.value.message()
