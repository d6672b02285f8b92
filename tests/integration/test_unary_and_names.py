"""Unary inference and the model names NVIDIA's TensorRT-LLM clients use, against the real server.

- `llm_unary` (non-decoupled, BLS to `llm`): HTTP /infer, gRPC ModelInfer, `client.infer()`,
  `perf_analyzer -i http`; the HTTP edge sends /infer on llm / ensemble / tensorrt_llm_bls to it.
- `ensemble` and `tensorrt_llm_bls` (Triton ensembles over `llm`): requests shaped as NVIDIA's
  `end_to_end_grpc_client.py` (stream API, [1, 1] tensors, its defaults) and its
  `end_to_end_test.py` (unary `client.infer`) sends them.
- one rule for an unknown input on every protocol: an error naming it.

Same engine everywhere: a greedy or seeded request gives the same text under every name.
"""
import json
import os
import queue
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog."
DTYPES = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32",
          np.dtype(bool): "BOOL", np.dtype(np.uint64): "UINT64"}


def tensors(module, values: dict) -> list:
    """{name: numpy array} as InferInputs of tritonclient.grpc or .http (dtype from the array)."""
    out = []
    for name, arr in values.items():
        t = module.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def batch1(value, dtype) -> np.ndarray:
    return np.array([[value.encode() if isinstance(value, str) else value]], dtype=dtype)


def request(prompt, max_tokens=16, **fields) -> dict:
    """Our interface: text_input, max_tokens and any of the optional inputs, shaped [1, 1]."""
    kinds = {"stream": bool, "temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
             "random_seed": np.uint64, "exclude_input_in_output": bool, "end_id": np.int32,
             "return_perf_metrics": bool}
    values = {"text_input": batch1(prompt, object), "max_tokens": batch1(max_tokens, np.int32)}
    for name, v in fields.items():
        values[name] = v if isinstance(v, np.ndarray) else batch1(v, kinds[name])
    return values


def nvidia_e2e_request(prompt, output_len=100, streaming=False, temperature=1.0, **extra) -> dict:
    """What end_to_end_grpc_client.py sends with its defaults: every tensor [1, 1]; beam_width,
    temperature (1.0), stream and exclude_input_in_output (false) always; the rest only when
    asked for (stop_words / bad_words as [1, n] BYTES)."""
    values = {"text_input": batch1(prompt, object), "max_tokens": batch1(output_len, np.int32),
              "stream": batch1(streaming, bool), "beam_width": batch1(1, np.int32),
              "temperature": batch1(temperature, np.float32), "exclude_input_in_output": batch1(False, bool)}
    for name, v in extra.items():
        if name in ("stop_words", "bad_words"):
            values[name] = np.array([[w.encode() for w in v]], dtype=object)
        else:
            values[name] = v
    return values


def text_of(result) -> str:
    return result.as_numpy("text_output").reshape(-1)[0].decode()


def stream_like_nvidia(url, model, values, outputs=("text_output",), request_id="1"):
    """The e2e client's exchange: open a stream, send one request (no empty final response asked
    for), stop_stream() (waits until the server closes it), then read what arrived.
    -> (list of results, list of error strings)."""
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, tensors(grpcclient, values), request_id=request_id,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
        client.stop_stream()
    finally:
        client.close()
    results, errors = [], []
    while not got.empty():
        result, error = got.get()
        if error is not None:
            errors.append(str(error))
        else:
            results.append(result)
    return results, errors


def http_generate(server, model, payload, stream=False):
    url = f"http://{server.http}/v2/models/{model}/generate" + ("_stream" if stream else "")
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text[5:] if text.startswith("data:") else text)  # /generate_stream: an event
    if stream:
        return status, [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    return status, json.loads(body)


@pytest.fixture(scope="module")
def greedy(server):
    """The reference: llm's greedy output for PROMPT over /generate (non-streaming, echoed prompt)."""
    status, body = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16})
    assert status == 200, body
    assert body["text_output"].startswith(PROMPT) and len(body["text_output"]) > len(PROMPT)
    return body


@pytest.fixture(scope="module")
def http_client(server):
    c = httpclient.InferenceServerClient(server.http, network_timeout=120, connection_timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    yield c
    c.close()


# -- unary inference --------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llm_unary", "llm", "ensemble", "tensorrt_llm_bls"])
def test_http_infer_is_the_same_engine(server, http_client, greedy, model):
    """tritonclient.http's client.infer (binary tensors) on the unary model, and on the decoupled
    names, which the edge sends to it."""
    result = http_client.infer(model, tensors(httpclient, request(PROMPT)))
    assert text_of(result) == greedy["text_output"]
    assert result.as_numpy("num_output_tokens").reshape(-1)[0] == greedy["num_output_tokens"]
    assert result.as_numpy("finish_reason").reshape(-1)[0].decode() == greedy["finish_reason"]


def test_http_infer_json_with_curl_shape(server, greedy):
    """The plain JSON form of /infer (what curl sends): no binary data."""
    body = {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPT]},
                       {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [16]}]}
    req = urllib.request.Request(f"http://{server.http}/v2/models/llm/infer", data=json.dumps(body).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    texts = {o["name"]: o["data"] for o in out["outputs"]}
    assert texts["text_output"] == [greedy["text_output"]]


def test_grpc_model_infer(grpc_client, greedy):
    result = grpc_client.infer("llm_unary", tensors(grpcclient, request(PROMPT)))
    assert text_of(result) == greedy["text_output"]


def test_unary_stream_true_joins_the_steps(server, grpc_client):
    """stream=true through the unary model: the concatenated step texts (no echoed prompt), equal
    to what a streaming client accumulates."""
    status, events = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16, "stream": True},
                                   stream=True)
    assert status == 200 and len(events) > 1
    streamed = "".join(e["text_output"] for e in events)
    result = grpc_client.infer("llm_unary", tensors(grpcclient, request(PROMPT, stream=True)))
    assert text_of(result) == streamed
    assert result.as_numpy("finish_reason").reshape(-1)[0].decode() == events[-1]["finish_reason"]


def test_unary_seeded_sampling_matches_llm(server, grpc_client):
    fields = dict(temperature=0.9, top_p=0.95, random_seed=11, exclude_input_in_output=True)
    a = text_of(grpc_client.infer("llm_unary", tensors(grpcclient, request("Tell me a story.", 12, **fields))))
    status, body = http_generate(server, "llm", {"text_input": "Tell me a story.", "max_tokens": 12, **{
        k: (int(v) if k == "random_seed" else v) for k, v in fields.items()}})
    assert status == 200 and a == body["text_output"]


def test_unary_errors_keep_their_message_and_status(http_client, grpc_client):
    bad = request(PROMPT, max_tokens=0)
    with pytest.raises(InferenceServerException) as e:
        http_client.infer("llm_unary", tensors(httpclient, bad))
    assert e.value.status() == "400" and "max_tokens must be a positive integer" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_client.infer("llm_unary", tensors(grpcclient, bad))
    assert "INVALID_ARG" in str(e.value.status()) and "max_tokens must be a positive integer" in e.value.message()


def test_concurrent_unary_requests_share_steps(server):
    """Unary requests are not served one at a time: they join the engine's batch together.

    Judged by the requests' own times (return_perf_metrics), not by the mean batch size: the
    four arrive a few ms apart, and with the engine at ~5 ms a step a request can be half
    done before the last arrives (CI saw a mean of 1.44). Served one at a time, each would be
    scheduled only after the one before had finished; joined, the last is scheduled before
    the first has finished, so there is a step in which all four run."""
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    before = server.metrics()
    client = grpcclient.InferenceServerClient(server.grpc)
    done = queue.Queue()
    try:
        for i in range(4):
            values = request(f"Count from {i} to {i + 40}:", 32, return_perf_metrics=True)
            client.async_infer("llm_unary", tensors(grpcclient, values),
                               callback=lambda result, error: done.put((result, error)))
        results = [done.get(timeout=180) for _ in range(4)]
    finally:
        client.close()
    assert all(err is None for _, err in results), results
    assert all(r.as_numpy("num_output_tokens").reshape(-1)[0] > 0 for r, _ in results)
    scheduled = [int(r.as_numpy("first_scheduled_time_ns").reshape(-1)[0]) for r, _ in results]
    finished = [int(r.as_numpy("last_token_time_ns").reshape(-1)[0]) for r, _ in results]
    assert max(scheduled) < min(finished), (scheduled, finished)
    time.sleep(0.5)  # metrics are published a few times a second
    after = server.metrics()
    steps = after["specserve_steps_total"] - before["specserve_steps_total"]
    seq_steps = after["specserve_step_sequences_total"] - before["specserve_step_sequences_total"]
    assert seq_steps / steps > 1.0, (seq_steps, steps)  # the metric agrees: some step ran more than one


# -- the names NVIDIA's clients use ------------------------------------------------------------------
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_nvidia_e2e_client_request_non_streaming(server, greedy, model):
    """end_to_end_grpc_client.py's defaults, greedy (--temperature 0): one response, the prompt
    echoed, the same text as llm."""
    results, errors = stream_like_nvidia(server.grpc, model, nvidia_e2e_request(PROMPT, 16, temperature=0.0))
    assert errors == []
    assert [text_of(r) for r in results] == [greedy["text_output"]]


def test_nvidia_e2e_client_request_streaming(server):
    """-S: one response per step, each with the new text; joined they are llm's streamed text."""
    status, events = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16, "stream": True},
                                   stream=True)
    assert status == 200
    results, errors = stream_like_nvidia(server.grpc, "ensemble",
                                         nvidia_e2e_request(PROMPT, 16, streaming=True, temperature=0.0))
    assert errors == [] and len(results) > 1
    assert "".join(text_of(r) for r in results) == "".join(e["text_output"] for e in events)


def test_nvidia_e2e_client_defaults_sample_like_llm(server):
    """Its default temperature 1.0 samples; with a seed the ensemble and llm give the same text."""
    seed = np.array([[5]], dtype=np.uint64)
    texts = []
    for model in ("ensemble", "llm"):
        results, errors = stream_like_nvidia(server.grpc, model,
                                             nvidia_e2e_request("Once upon a time", 12, random_seed=seed))
        assert errors == [] and len(results) == 1
        texts.append(text_of(results[0]))
    assert texts[0] == texts[1] and texts[0].startswith("Once upon a time")


def test_nvidia_e2e_client_stop_words(server):
    results, errors = stream_like_nvidia(server.grpc, "ensemble",
                                         nvidia_e2e_request("1, 2, 3, 4, 5,", 40, temperature=0.0,
                                                            stop_words=["9"]))
    assert errors == [] and len(results) == 1
    text = text_of(results[0])
    assert text.startswith("1, 2, 3, 4, 5,") and "8" in text and "9" not in text


def test_nvidia_end_to_end_test_unary_request(http_client, greedy):
    """end_to_end_test.py's `ensemble` request: client.infer with text_input, max_tokens and
    empty bad_words / stop_words, asking for text_output, read as as_numpy(...)[0]."""
    values = {"text_input": np.array([[PROMPT]]).astype(object), "max_tokens": np.array([[16]], dtype=np.int32),
              "bad_words": np.array([[""]], dtype=object), "stop_words": np.array([[""]], dtype=object)}
    result = http_client.infer("ensemble", tensors(httpclient, values),
                               outputs=[httpclient.InferRequestedOutput("text_output")])
    assert result.as_numpy("text_output")[0].decode() == greedy["text_output"]
    assert result.as_numpy("finish_reason") is None  # only what was asked for


def test_generate_endpoints_on_ensemble(server, greedy):
    status, body = http_generate(server, "ensemble", {"text_input": PROMPT, "max_tokens": 16})
    assert status == 200 and body["text_output"] == greedy["text_output"]
    status, events = http_generate(server, "ensemble", {"text_input": PROMPT, "max_tokens": 16, "stream": True},
                                   stream=True)
    assert status == 200 and len(events) > 1
    assert PROMPT + "".join(e["text_output"] for e in events) == greedy["text_output"]


def test_tensorrt_llm_docs_generate_request(server):
    """The /generate request of TensorRT-LLM's documentation, empty bad_words / stop_words strings
    included, on `ensemble`."""
    status, body = http_generate(server, "ensemble", {"text_input": "What is machine learning?", "max_tokens": 8,
                                                      "bad_words": "", "stop_words": ""})
    assert status == 200, body
    assert body["text_output"].startswith("What is machine learning?") and body["num_output_tokens"] == 8


def test_model_errors_pass_through_the_ensemble(server):
    results, errors = stream_like_nvidia(server.grpc, "ensemble", nvidia_e2e_request(PROMPT, 0))
    assert results == [] and len(errors) == 1 and "max_tokens must be a positive integer" in errors[0]


# -- one rule for unknown inputs ---------------------------------------------------------------------
UNKNOWN = "length_penalty"  # a TensorRT-LLM input we do not serve


@pytest.mark.parametrize("model,stream", [("llm", False), ("llm", True), ("ensemble", False)])
def test_unknown_input_http_generate(server, model, stream):
    status, body = http_generate(server, model, {"text_input": PROMPT, "max_tokens": 4, UNKNOWN: 1.2},
                                 stream=stream)
    assert status == 400 and f"unexpected input '{UNKNOWN}'" in body["error"]


def test_input_sent_as_generate_parameter_is_refused(server):
    status, body = http_generate(server, "llm", {"text_input": PROMPT, "parameters": {"max_tokens": 4}})
    assert status == 400 and "send max_tokens as a top-level field" in body["error"]


def _with_unknown():
    values = request(PROMPT, 4)
    values[UNKNOWN] = np.array([[1.2]], dtype=np.float32)
    return values


@pytest.mark.parametrize("model", ["llm_unary", "llm", "ensemble"])
def test_unknown_input_http_infer(http_client, model):
    with pytest.raises(InferenceServerException) as e:
        http_client.infer(model, tensors(httpclient, _with_unknown()))
    assert e.value.status() == "400" and f"unexpected inference input '{UNKNOWN}'" in e.value.message()


def test_unknown_input_grpc_infer(grpc_client):
    with pytest.raises(InferenceServerException) as e:
        grpc_client.infer("llm_unary", tensors(grpcclient, _with_unknown()))
    assert f"unexpected inference input '{UNKNOWN}'" in e.value.message()


@pytest.mark.parametrize("model", ["llm", "ensemble"])
def test_unknown_input_grpc_stream(server, model):
    results, errors = stream_like_nvidia(server.grpc, model, _with_unknown())
    assert results == [] and len(errors) == 1 and f"unexpected inference input '{UNKNOWN}'" in errors[0]


# -- NVIDIA's load tool over HTTP ----------------------------------------------------------------------
def test_perf_analyzer_http_unary(server, tmp_path, load_tool):
    tool = load_tool("perf_analyzer")
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [
        {"text_input": {"content": ["Write a haiku about the sea."], "shape": [1]},
         "max_tokens": {"content": [12], "shape": [1]}},
        {"text_input": {"content": ["Summarise: the committee approved the budget."], "shape": [1]},
         "max_tokens": {"content": [12], "shape": [1]}}]}))
    before = server.metrics().get("specserve_requests_finished_total", 0)
    out = subprocess.run([str(tool), "-m", "llm_unary", "-u", server.http, "-i", "http", "--input-data", str(data),
                          "--concurrency-range", "2", "--request-count", "6"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Throughput:" in out.stdout
    time.sleep(0.5)
    assert server.metrics().get("specserve_requests_finished_total", 0) >= before + 6  # the engine ran them
