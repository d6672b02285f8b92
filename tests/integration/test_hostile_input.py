"""Nothing a client sends takes the server down or fails another client's request (issue 20).

Against the real server (launcher: HTTP edge + Triton), with its own small limits: every
hostile request gets the right status class and a message naming the problem, the server is
healthy afterwards, and a well-behaved streaming request running alongside completes
normally. Without the edge (backend/frontend/edge/) the 40,000-deep body and the 4 MiB upload kill
Triton 2.51 (SIGSEGV), so those cases fail.
"""
import gzip
import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend.frontend.supervisor.server_secrets import unix_http
from server_helpers import running_server
from test_server import Stream, grpc_generate

MAX_QUEUE = 2
HOSTILE_ENV = dict(SPECSERVE_MAX_CONTEXT="512", SPECSERVE_MAX_TOKENS_LIMIT="256", SPECSERVE_MAX_BATCH="2", SPECSERVE_MAX_QUEUE=str(MAX_QUEUE),
                   SPECSERVE_MAX_BODY_BYTES=str(1 << 20), OMP_NUM_THREADS="1", SPECSERVE_HTTP_READ_TIMEOUT_S="4",
                   # plain decoding: the admission test's long streams must outlast its checks
                   SPECSERVE_POLICY="off")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, checkpoint):
    with running_server(HOSTILE_ENV, tmp_path_factory.mktemp("hostile")) as srv:
        yield srv


def post(srv, path, body: bytes, headers=None, timeout=60):
    """Raw POST (bodies json.dumps cannot make); -> (status, text)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.ports.http, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace"), dict(r.getheaders())
    finally:
        c.close()


def healthy(srv) -> bool:
    try:
        with urllib.request.urlopen(f"http://{srv.http}/v2/health/ready", timeout=10) as r:
            http_ok = r.status == 200
    except OSError:
        return False
    client = grpcclient.InferenceServerClient(srv.grpc)
    try:
        return http_ok and client.is_server_ready() and client.is_model_ready("llm") and srv.proc.poll() is None
    finally:
        client.close()


class GoodClient:
    """A well-behaved streaming request running while the hostile one is sent."""

    def __init__(self, srv, max_tokens=8):
        self.result, self.max_tokens = None, max_tokens
        payload = {"text_input": "Count from 1 to 20:", "max_tokens": max_tokens, "stream": True,
                   "exclude_input_in_output": True}
        self.thread = threading.Thread(target=lambda: setattr(self, "result", srv.generate(payload, stream=True)))
        self.thread.start()

    def check(self):
        self.thread.join(120)
        status, events = self.result
        assert status == 200, events
        assert events and "error" not in events[-1], events
        assert events[-1]["finish_reason"] == "length" and events[-1]["num_output_tokens"] == self.max_tokens


def deep(d: int, inner: bytes = b"2") -> bytes:
    return b"[" * d + inner + b"]" * d


GEN = "/v2/models/llm/generate"
INFER, UNARY = "/v2/models/llm/infer", "/v2/models/llm_unary/infer"


def tensor(name, shape, datatype, data):
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def infer(*tensors) -> bytes:
    return json.dumps({"inputs": [tensor("text_input", [1, 1], "BYTES", ["hi"]), *tensors]}).encode()


HOSTILE_HTTP = [  # (id, path, body, status, words the error must contain)
    ("deep-40000-in-a-field", GEN, b'{"text_input": "hi", "max_tokens": ' + deep(40000) + b"}", 400, "nests deeper"),
    ("deep-40000-top-level", GEN, deep(40000, b""), 400, "nests deeper"),
    ("deep-40000-stream", GEN + "_stream", b'{"text_input": ' + deep(40000, b'"hi"') + b"}", 400, "nests deeper"),
    ("deep-40000-infer", "/v2/models/llm/infer", b'{"inputs": ' + deep(40000, b"") + b"}", 400, "nests deeper"),
    ("oversized-2MB", GEN, json.dumps({"text_input": "a" * (2 << 20)}).encode(), 413, "bytes"),
    ("malformed-json", GEN, b'{"text_input": "hi", ', 400, "not valid JSON"),
    ("empty-body", GEN, b"", 400, "empty"),
    ("not-an-object", GEN, b"[1, 2, 3]", 400, "JSON object"),
    ("string-for-int", GEN, json.dumps({"text_input": "hi", "max_tokens": "four"}).encode(), 400, "max_tokens"),
    ("float-for-int", GEN, json.dumps({"text_input": "hi", "max_tokens": 2.5}).encode(), 400, "max_tokens"),
    ("int-for-string", GEN, json.dumps({"text_input": 5, "max_tokens": 2}).encode(), 400, "text_input"),
    ("string-for-bool", GEN, json.dumps({"text_input": "hi", "stream": "yes"}).encode(), 400, "stream"),
    ("max_tokens-2^32+8", GEN, json.dumps({"text_input": "hi", "max_tokens": 2**32 + 8}).encode(), 400, "max_tokens"),
    ("top_k-2^32+5", GEN, json.dumps({"text_input": "hi", "max_tokens": 2, "top_k": 2**32 + 5}).encode(), 400, "top_k"),
    ("end_id-2^32+2", GEN, json.dumps({"text_input": "hi", "max_tokens": 2, "end_id": 2**32 + 2}).encode(), 400, "end_id"),
    ("random_seed-negative", GEN, json.dumps({"text_input": "hi", "max_tokens": 2, "random_seed": -1}).encode(), 400,
     "random_seed"),
    ("temperature-nan", GEN, b'{"text_input": "hi", "max_tokens": 2, "temperature": NaN}', 400, "temperature"),
    ("temperature-inf", GEN, b'{"text_input": "hi", "max_tokens": 2, "temperature": Infinity}', 400, "temperature"),
    ("temperature-1e300", GEN, b'{"text_input": "hi", "max_tokens": 2, "temperature": 1e300}', 400, "temperature"),
    ("temperature-denormal", GEN, b'{"text_input": "hi", "max_tokens": 2, "temperature": 1e-40}', 400, "temperature"),
    ("top_p-nan", GEN, b'{"text_input": "hi", "max_tokens": 2, "top_p": NaN}', 400, "top_p"),
    ("huge-prompt", GEN, json.dumps({"text_input": "a" * 900_000, "max_tokens": 2}).encode(), 400, "text_input"),
    ("stream-true-on-generate", GEN, json.dumps({"text_input": "hi", "max_tokens": 2, "stream": True}).encode(), 400,
     "/generate_stream"),
    ("lone-surrogate-generate", GEN, b'{"text_input": "\\ud800", "max_tokens": 2}', 400, "text_input is not valid Unicode"),
    # /infer: Triton 2.51 wrapped the first to 8 tokens and answered 500 for the others
    ("infer-max_tokens-2^32+8", INFER, infer(tensor("max_tokens", [1, 1], "INT32", [2**32 + 8])), 400, "max_tokens"),
    ("unary-max_tokens-2^32+8", UNARY, infer(tensor("max_tokens", [1, 1], "INT32", [2**32 + 8])), 400, "max_tokens"),
    ("infer-lone-surrogate", INFER, b'{"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", '
                                    b'"data": ["\\ud800"]}]}', 400, "inputs[0].data[0] is not valid Unicode"),
    ("infer-negative-shape", INFER, json.dumps({"inputs": [tensor("text_input", [-1, 1], "BYTES", ["hi"])]}).encode(),
     400, "input 'text_input': shape"),
    ("infer-fractional-shape", UNARY, json.dumps({"inputs": [tensor("text_input", [1.5, 1], "BYTES", ["hi"])]}).encode(),
     400, "input 'text_input': shape"),
    ("infer-int32-float", INFER, infer(tensor("max_tokens", [1, 1], "INT32", [8.7])), 400, "max_tokens must be an integer"),
    ("infer-int32-string", INFER, infer(tensor("max_tokens", [1, 1], "INT32", ["8"])), 400, "max_tokens must be an integer"),
    ("infer-bool-string", INFER, infer(tensor("stream", [1, 1], "BOOL", ["yes"])), 400, "stream must be true or false"),
    ("infer-inputs-object", INFER, json.dumps({"inputs": {"text_input": tensor("text_input", [1, 1], "BYTES", ["hi"])}}
                                              ).encode(), 400, "inputs must be an array"),
]


@pytest.mark.parametrize("path,body,status,words", [c[1:] for c in HOSTILE_HTTP], ids=[c[0] for c in HOSTILE_HTTP])
def test_hostile_http(hostile, path, body, status, words):
    good = GoodClient(hostile)
    got, text, _ = post(hostile, path, body)
    assert got == status, text
    message = json.loads(text[5:] if text.startswith("data:") else text)["error"]
    assert words in message, message
    assert "/work/" not in message and str(hostile.log_path.parent) not in message  # no absolute paths
    good.check()
    assert healthy(hostile)


COMPLETION = json.dumps({"model": "llm", "prompt": "hi", "max_tokens": 2}).encode()
CHAT = json.dumps({"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
GENERATE = json.dumps({"text_input": "hi", "max_tokens": 2}).encode()
STREAM = json.dumps({"text_input": "hi", "max_tokens": 2, "stream": True}).encode()
JSON_TYPE = {"Content-Type": "application/json"}
BODIES = [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT), (GEN, GENERATE), (GEN + "_stream", STREAM)]

HOSTILE_FORMAT = [  # (id, path, headers, body, status, words): the body's format or the headers are wrong
    # each was a 500 (aiohttp's payload error escaped the body reader; on chat the message blamed the template)
    *[(f"{coding}-labelled-plain-{path.rsplit('/', 1)[-1]}", path, dict(JSON_TYPE, **{"Content-Encoding": coding}), body,
       400, f"does not match its Content-Encoding: it is not {coding} data")
      for path, body in BODIES for coding in ("gzip", "deflate", "br")],
    ("zstd-coding", GEN, {"Content-Encoding": "zstd"}, GENERATE, 415, "Content-Encoding zstd is not supported"),
    ("unknown-coding-v1", "/v1/completions", dict(JSON_TYPE, **{"Content-Encoding": "foo"}), COMPLETION, 415,
     "Content-Encoding foo is not supported"),
    ("gzip-bomb", GEN, {"Content-Encoding": "gzip"}, gzip.compress(b" " * (8 << 20)), 413, "once decoded"),
    # JSON labelled or encoded otherwise: served before
    ("text-plain-v1", "/v1/completions", {"Content-Type": "text/plain"}, COMPLETION, 415, "application/json"),
    ("no-content-type-v1", "/v1/chat/completions", {}, CHAT, 415, "application/json"),
    ("form-v1", "/v1/completions", {"Content-Type": "application/x-www-form-urlencoded"}, COMPLETION, 415,
     "application/json"),
    ("utf16-v1", "/v1/completions", JSON_TYPE, COMPLETION.decode().encode("utf-16"), 415, "UTF-8"),
    ("text-plain-v2", GEN, {"Content-Type": "text/plain"}, GENERATE, 415, "application/json"),
    ("multipart-v2", GEN + "_stream", {"Content-Type": "multipart/form-data; boundary=x"}, STREAM, 415,
     "application/json"),
    ("utf16-v2", GEN, JSON_TYPE, GENERATE.decode().encode("utf-16"), 415, "UTF-8"),
    ("utf32-infer", INFER, JSON_TYPE, infer().decode().encode("utf-32"), 415, "UTF-8"),
    ("latin1-charset-v2", GEN, {"Content-Type": "application/json; charset=iso-8859-1"}, GENERATE, 415, "UTF-8"),
    # aiohttp's plain-text 400 (one 64 KB header), or forwarded to Triton (16 of 4 KB)
    ("64KB-header-v1", "/v1/completions", dict(JSON_TYPE, **{"X-Big": "a" * 65536}), COMPLETION, 431, "headers"),
    ("64KB-header-v2", GEN, {"X-Big": "a" * 65536}, GENERATE, 431, "headers"),
    ("64KB-of-headers-stream", GEN + "_stream", {f"X-H{i}": "a" * 4096 for i in range(16)}, STREAM, 431, "headers"),
]


@pytest.mark.parametrize("path,headers,body,status,words", [c[1:] for c in HOSTILE_FORMAT],
                         ids=[c[0] for c in HOSTILE_FORMAT])
def test_hostile_format_is_a_4xx_in_the_interfaces_shape(hostile, path, headers, body, status, words):
    good = GoodClient(hostile)
    got, text, _ = post(hostile, path, body, headers)
    assert got == status, text
    if path.startswith("/v1"):  # OpenAI's shape
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
        message = error["message"]
    else:  # Triton's, an event on /generate_stream
        assert text.startswith("data: ") == path.endswith("_stream"), text
        message = json.loads(text[5:] if text.startswith("data:") else text)["error"]
    assert words in message, message
    good.check()
    assert healthy(hostile)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_requests_are_served(hostile, algorithm):
    """tritonclient.http's request_compression_algorithm: the edge decodes the body and hands it to
    Triton decoded."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(hostile.http)
    text = httpclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"The capital of France is"]], dtype=object))
    max_tokens = httpclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[4]], dtype=np.int32))
    try:
        result = client.infer("llm", [text, max_tokens], request_compression_algorithm=algorithm)
    finally:
        client.close()
    assert result.as_numpy("text_output").reshape(-1)[0].decode().startswith("The capital of France is")
    assert healthy(hostile)


def test_chunked_oversized_body_is_refused(hostile):
    """No Content-Length to check: the edge counts the chunks."""
    good = GoodClient(hostile)
    c = http.client.HTTPConnection("127.0.0.1", hostile.ports.http, timeout=60)
    chunks = (b'{"text_input": "' if i == 0 else b"a" * 65536 for i in range(40))  # ~2.5 MB
    c.request("POST", GEN, body=chunks, encode_chunked=True)
    r = c.getresponse()
    assert r.status == 413, r.read()
    c.close()
    good.check()
    assert healthy(hostile)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_4mib_upload_the_way_curl_sends_it(hostile, tmp_path):
    """curl's upload of a 4 MiB body (Expect: 100-continue) is what killed Triton 2.51."""
    body = tmp_path / "big.json"
    body.write_text(json.dumps({"text_input": "a" * (4 << 20), "max_tokens": 2}))
    good = GoodClient(hostile)
    out = subprocess.run(["curl", "-s", "-m", "60", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                          f"http://{hostile.http}{GEN}", "--data-binary", f"@{body}"],
                         capture_output=True, text=True, timeout=90)
    assert out.stdout == "413", out
    good.check()
    assert healthy(hostile)


HOSTILE_GRPC = [  # (id, fields, words): gRPC streams carry only a message (no status code) per request
    ("temperature-nan", {"temperature": float("nan")}, "temperature"),
    ("temperature-inf", {"temperature": float("inf")}, "temperature"),
    ("temperature-denormal", {"temperature": np.array([[1e-40]], dtype=np.float32)}, "temperature"),
    ("top_k-int64", {"top_k": np.array([[2**32 + 5]], dtype=np.int64)}, "top_k"),
    ("max_tokens-shape", {"max_tokens": np.array([[4, 4]], dtype=np.int32)}, "max_tokens"),
]


@pytest.mark.parametrize("fields,words", [c[1:] for c in HOSTILE_GRPC], ids=[c[0] for c in HOSTILE_GRPC])
def test_hostile_grpc(hostile, fields, words):
    good = GoodClient(hostile)
    out, err = grpc_generate(hostile, "hi", stream=True, **fields)
    assert out is None and err is not None and words in err, err
    good.check()
    assert healthy(hostile)


def test_huge_grpc_prompt_is_refused_before_tokenizing(hostile):
    t0 = time.monotonic()
    out, err = grpc_generate(hostile, "a" * 4_000_000, stream=True, max_tokens=2)
    assert out is None and "text_input" in err and "context window" in err, err
    assert time.monotonic() - t0 < 3.0  # tokenizing 4 MB would take seconds
    assert healthy(hostile)


def test_restricted_apis(hostile):
    """Model control, the repository index, shared memory, logging and trace are closed to clients."""
    for method, path in [("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/llm/unload"),
                         ("GET", "/v2/logging"), ("POST", "/v2/logging"), ("GET", "/v2/trace/setting"),
                         ("GET", "/v2/systemsharedmemory/status"),
                         ("POST", "/v2/systemsharedmemory/region/x/register")]:
        c = http.client.HTTPConnection("127.0.0.1", hostile.ports.http, timeout=10)
        c.request(method, path, body=b"{}" if method == "POST" else None)
        r = c.getresponse()
        assert r.status == 403, (path, r.status, r.read())
        c.close()
    client = grpcclient.InferenceServerClient(hostile.grpc)
    try:
        for call in (client.get_model_repository_index, lambda: client.unload_model("llm"),
                     client.get_log_settings, client.get_trace_settings, client.get_system_shared_memory_status):
            with pytest.raises(Exception, match="restricted"):
                call()
        assert client.is_model_ready("llm")  # health and metadata stay open
        assert client.get_model_config("llm").config.name == "llm"
    finally:
        client.close()
    assert healthy(hostile)


def _open_stream(srv, max_tokens, prompt="1, 2, 3, 4, 5, 6, 7, 8,"):  # counts on: no early EOS
    c = http.client.HTTPConnection("127.0.0.1", srv.ports.http, timeout=120)
    c.request("POST", GEN + "_stream", body=json.dumps({"text_input": prompt, "max_tokens": max_tokens,
                                                         "stream": True}))
    return c


def test_admission_overflow_and_dropped_waiters(hostile):
    """max_batch 2 running + max_queue 2 waiting: the next request is refused at once with 503
    (gRPC: the same message); waiting requests whose clients cancel are dropped, not computed
    (HTTP clients that leave: the tests below)."""
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == 0)
    before = hostile.metrics().get("specserve_requests_cancelled_total", 0)
    runners = [_open_stream(hostile, 250) for _ in range(2)]
    for c in runners:
        assert c.getresponse().read1(64).startswith(b"data:")  # running
    waiters = [Stream(hostile.grpc) for _ in range(MAX_QUEUE)]
    for w in waiters:
        w.infer("1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=250, stream=True)
    hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == MAX_QUEUE)

    t0 = time.monotonic()
    status, text, headers = post(hostile, GEN, json.dumps({"text_input": "hi", "max_tokens": 4}).encode())
    assert status == 503 and "overloaded" in text and "retry later" in text, text
    assert headers.get("Retry-After") == "1"
    assert time.monotonic() - t0 < 2.0  # refused at once, not queued
    out, err = grpc_generate(hostile, "hi", stream=True, max_tokens=4)
    assert out is None and "overloaded" in err, err

    assert hostile.metrics()['specserve_sequences{state="running"}'] == 2
    for w in waiters:  # the waiting clients give up
        w.close(cancel=True)
    hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == 0)
    after = hostile.metrics()
    assert after['specserve_sequences{state="running"}'] == 2  # the slots were never theirs
    assert after["specserve_requests_cancelled_total"] >= before + MAX_QUEUE
    for c in runners:
        c.sock.close()
        c.close()
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    good = GoodClient(hostile)
    good.check()
    assert healthy(hostile)


def _send_and_leave_later(srv, path, body: dict) -> http.client.HTTPConnection:
    """Send a request whose answer will not be read: the caller closes the connection (leaves)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.ports.http, timeout=120)
    c.request("POST", path, body=json.dumps(body).encode())
    return c


def _leave(c: http.client.HTTPConnection) -> None:
    c.sock.close()
    c.close()


@pytest.mark.parametrize("path", [GEN, GEN + "_stream"], ids=["generate", "generate_stream"])
def test_http_client_that_leaves_while_waiting_is_dropped_before_it_runs(hostile, path):
    """Triton 2.51 notices a gone HTTP client only when it writes to it: a request waiting behind
    a full batch would still be computed. The edge marks it cancelled (backend/frontend/edge/cancel_marks.py),
    so it is dropped from the queue like a cancelled gRPC stream, never prefilled."""
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == 0)
    runners = [_open_stream(hostile, 250) for _ in range(2)]
    try:
        for c in runners:
            assert c.getresponse().read1(64).startswith(b"data:")  # running, prefill done
        waiter = _send_and_leave_later(hostile, path, {"text_input": "Tell me a long story about a cat.",
                                                       "max_tokens": 200, "stream": path.endswith("_stream")})
        hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == 1)
        before = hostile.metrics()  # published together (every 0.5 s): the runners' prefill is in
        _leave(waiter)
        hostile.wait_metric('specserve_sequences{state="waiting"}', lambda v: v == 0, timeout=15)
        after = hostile.metrics()
        assert after["specserve_requests_cancelled_total"] == before.get("specserve_requests_cancelled_total", 0) + 1
        assert after['specserve_sequences{state="running"}'] == 2  # the slots stayed the runners'
        assert after["specserve_prefill_tokens_total"] == before["specserve_prefill_tokens_total"]  # never computed
    finally:
        for c in runners:
            _leave(c)
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    assert healthy(hostile)


INFER_BODY = {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["1, 2, 3, 4, 5, 6, 7, 8,"]},
                         {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [250]}]}


@pytest.mark.parametrize("path,body", [
    (GEN, {"text_input": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 250}),
    ("/v2/models/llm/infer", INFER_BODY),  # the edge sends it to llm_unary, which asks llm (BLS)
], ids=["generate", "infer"])
def test_http_client_that_leaves_while_generating_stops_it(hostile, path, body):
    """A non-streaming request sends nothing until it ends, so Triton 2.51 would generate all 250
    tokens for a client that left; the edge's cancel mark stops it at the next poll."""
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    before = hostile.metrics()
    c = _send_and_leave_later(hostile, path, body)
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 1)  # generating
    _leave(c)
    hostile.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0, timeout=15)
    after = hostile.metrics()
    assert after["specserve_requests_cancelled_total"] == before.get("specserve_requests_cancelled_total", 0) + 1
    assert after.get("specserve_requests_finished_total", 0) == before.get("specserve_requests_finished_total", 0)
    assert after["specserve_tokens_emitted_total"] - before.get("specserve_tokens_emitted_total", 0) < 200
    assert healthy(hostile)


def test_non_utf8_header_is_a_400_naming_it(hostile):
    c = http.client.HTTPConnection("127.0.0.1", hostile.ports.http, timeout=30)
    c.putrequest("GET", "/v2/logging")
    c.putheader("specserve-admin-key", b"\xff\xfe")
    c.endheaders()
    r = c.getresponse()
    assert r.status == 400 and "specserve-admin-key" in json.loads(r.read())["error"]
    c.close()
    assert healthy(hostile)


def test_head_answers_what_get_would_without_a_body(hostile):
    for path, status in [("/v2/health/ready", 200), ("/v2/models/llm", 200), ("/v2/models/llm/config", 200),
                         (GEN, 405), ("/v2/models/nope", 404), ("/v1/models", 200)]:
        c = http.client.HTTPConnection("127.0.0.1", hostile.ports.http, timeout=30)
        c.request("GET", path)
        r = c.getresponse()
        get_status = r.status
        r.read()
        c.request("HEAD", path)
        r = c.getresponse()
        assert (r.status, get_status) == (status, status) and r.read() == b"", path
        c.close()
    assert healthy(hostile)


def test_batched_infer_answers_each_prompt(hostile):
    """[B, 1] inputs on /infer: one response holding each prompt's outputs (batch_index by row)."""
    body = {"inputs": [tensor("text_input", [2, 1], "BYTES", ["1, 2, 3,", "a, b, c,"]),
                       tensor("max_tokens", [2, 1], "INT32", [3, 3]),
                       tensor("exclude_input_in_output", [2, 1], "BOOL", [True, True])]}
    for path in (INFER, UNARY):
        status, text, _ = post(hostile, path, json.dumps(body).encode())
        assert status == 200, text
        out = {o["name"]: o for o in json.loads(text)["outputs"]}
        assert len(out["text_output"]["data"]) == 2 and out["batch_index"]["data"] == [0, 1]
        assert out["num_output_tokens"]["data"] == [3, 3]
    assert healthy(hostile)


def test_stalled_clients_are_dropped(hostile):
    """Slow loris: a client that stops mid-headers is disconnected, one that stops mid-body gets 408
    and is disconnected, after SPECSERVE_HTTP_READ_TIMEOUT_S (4 s here) on every interface (/v1 kept
    the connection another 10 s); nobody else notices."""
    good = GoodClient(hostile)
    for partial, answer in [(b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\nContent-Le", b""),
                            (b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                             b"HTTP/1.1 408"),
                            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100\r\n\r\n{", b"HTTP/1.1 408")]:
        with socket.create_connection(("127.0.0.1", hostile.ports.http), timeout=30) as sock:
            sock.sendall(partial)
            t0, got = time.monotonic(), b""
            while chunk := sock.recv(4096):
                got += chunk
            assert got.startswith(answer) and 3 < time.monotonic() - t0 < 8, (got, time.monotonic() - t0)
    good.check()
    assert healthy(hostile)


def connect_as(uid: int, sock_path: str) -> str:
    """What connecting to `sock_path` gives a process of user `uid`: 'connected' or the error's name."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only makes system calls, then leaves without any cleanup
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock_path)
            answer = "connected"
        except OSError as e:
            answer = type(e).__name__
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 100).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    return answer


def test_tritons_private_http_is_closed_to_local_clients(hostile):
    """Triton's HTTP (which dies on some 4 MiB bodies before any check) listens on no TCP port, only
    on a Unix socket in a directory of mode 0700: another local user cannot connect at all, and a
    process of this same user gets 403 for every API without the edge's key, before its body is
    parsed (so the 40,000-deep JSON that kills Triton 2.51 is refused too)."""
    sock_path = re.findall(r"Started HTTPService at unix:(\S+):0", hostile.log_path.read_text())[-1]
    assert not re.search(r"Started HTTPService at \d", hostile.log_path.read_text())
    directory = os.stat(os.path.dirname(sock_path))
    assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()
    if os.getuid() == 0:  # can act as another user: show it is refused
        assert connect_as(65534, sock_path) == "PermissionError"
    for method, path, body in [("GET", "/v2/health/ready", None), ("GET", "/v2/models/llm/config", None),
                               ("POST", GEN, deep(40000)), ("POST", UNARY, infer())]:
        status, text = unix_http(sock_path, method, path, body, timeout_s=30)
        assert status == 403 and b"restricted" in text, path
    assert healthy(hostile)


LONG_ENV = dict(HOSTILE_ENV, SPECSERVE_MAX_CONTEXT="2048", SPECSERVE_MAX_QUEUE="8")


def test_a_short_request_does_not_wait_for_a_long_prefill(tmp_path, tokenizer):
    """Fairness: a short request arriving 0.5 s into a 2,047-token prompt's prefill gets its first
    token after about one 128-token chunk of it, not after the whole prompt (it waited 15.8 s for
    it vs 0.04 s alone before chunked prefill). Generous bound for a shared machine: under half
    the long prompt's own time to its first token (waiting for it whole: all of it, less 0.5 s)."""
    ids = tokenizer(" ".join(f"w{i}" for i in range(3000)))["input_ids"][:2047]
    long_prompt = tokenizer.decode(ids)
    assert len(tokenizer(long_prompt)["input_ids"]) == 2047
    with running_server(LONG_ENV, tmp_path) as srv:
        def ttft(prompt, out, key):
            c = http.client.HTTPConnection("127.0.0.1", srv.ports.http, timeout=600)
            t0 = time.monotonic()
            c.request("POST", GEN + "_stream", body=json.dumps({"text_input": prompt, "max_tokens": 2, "stream": True}))
            r = c.getresponse()
            assert r.status == 200
            for line in r:
                if line.startswith(b"data:"):
                    out.setdefault(key, time.monotonic() - t0)
            c.close()

        out = {}
        ttft("The capital of France is", out, "warm-up")
        long = threading.Thread(target=ttft, args=(long_prompt, out, "long"))
        long.start()
        time.sleep(0.5)
        ttft("The capital of France is", out, "short")
        long.join(600)
        print(f"time to first token: short alone {out['warm-up']:.2f} s, beside the long prefill {out['short']:.2f} s, "
              f"the long prompt {out['long']:.2f} s")
        assert out["short"] < 0.5 * out["long"], out
