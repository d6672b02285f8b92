"""The HTTP edge's proxy (backend/frontend/edge/proxy.py) on a stand-in for Triton:
tests/integration/test_hostile_input.py runs it against the real one."""
import pytest

from backend.frontend.edge.errors import status_for_model_error
from backend.frontend.http_body import EdgeError


def test_model_error_status():
    assert status_for_model_error(400, "server overloaded: 3 requests are waiting") == 503
    assert status_for_model_error(400, "internal error while accepting this request") == 500
    assert status_for_model_error(400, "max_tokens must be a positive integer") == 400
    assert status_for_model_error(404, "server overloaded") == 404


def test_infer_on_a_decoupled_model_goes_to_the_unary_model():
    """Triton answers 501 to /infer on a decoupled model: the edge sends it to llm_unary (if served)."""
    import asyncio

    from aiohttp.test_utils import make_mocked_request

    from backend.frontend.edge.proxy import Edge

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


def test_requests_carry_the_edges_own_id_and_a_client_that_leaves_is_marked(tmp_path):
    """The edge tags what the model computes with a fresh id (a client's is replaced) and, when the
    client leaves before its response, marks that id cancelled (the model polls the mark)."""
    import asyncio
    import json
    import re

    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from backend.frontend.edge.proxy import REQUEST_ID, REQUEST_ID_HEADER, Edge

    seen, arrived = [], asyncio.Event()

    async def triton(request):  # stands in for Triton's HTTP
        if request.path.endswith("/config"):
            return web.json_response({"input": [{"name": "text_input", "data_type": "TYPE_STRING"}]})
        seen.append((request.path, request.headers.get(REQUEST_ID_HEADER), await request.read()))
        arrived.set()
        if "/slow/" in request.path:
            await asyncio.sleep(60)  # still generating when the client leaves
        return web.json_response({"text_output": "ok"})

    async def main():
        upstream = web.Application()
        upstream.router.add_route("*", "/{tail:.*}", triton)
        async with TestServer(upstream) as up:
            edge = Edge(str(up.make_url("")).rstrip("/"), cancel_dir=str(tmp_path))
            async with TestServer(edge.app(), handler_cancellation=True) as front:
                evil = {REQUEST_ID_HEADER: "0" * 32}
                async with ClientSession() as client:
                    body = {"text_input": "hi", "parameters": {REQUEST_ID: "0" * 32, "priority": 1}}
                    async with client.post(front.make_url("/v2/models/llm/generate"), json=body, headers=evil) as r:
                        assert r.status == 200
                    async with client.post(front.make_url("/v2/models/llm/infer"), json={"inputs": []},
                                           headers=evil) as r:
                        assert r.status == 200
                    async with client.get(front.make_url("/v2/health/ready"), headers=evil) as r:
                        assert r.status == 200
                    async with client.post(front.make_url("/v2/models/llm/infer"),
                                           json={"inputs": [], "parameters": {"Specserve-Request-Id": "x"}}) as r:
                        assert r.status == 400 and "reserved" in (await r.json())["error"]
                arrived.clear()
                reader, writer = await asyncio.open_connection(front.host, front.port)
                payload = json.dumps({"text_input": "hi"}).encode()
                writer.write(b"POST /v2/models/slow/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
                await writer.drain()
                await asyncio.wait_for(arrived.wait(), 10)
                writer.close()  # the client leaves before any response
                for _ in range(100):
                    if list(tmp_path.iterdir()):
                        break
                    await asyncio.sleep(0.05)

    asyncio.run(main())
    (gen_path, gen_header, gen_body), (infer_path, infer_header, _), (health_path, health_header, _), \
        (_, _, slow_body) = seen
    gen_id = json.loads(gen_body)["parameters"][REQUEST_ID]
    assert re.fullmatch("[0-9a-f]{32}", gen_id) and gen_id != "0" * 32 and gen_header is None
    assert json.loads(gen_body)["parameters"]["priority"] == 1
    assert infer_path == "/v2/models/llm_unary/infer"  # Triton forwards this header to the model on /infer
    assert re.fullmatch("[0-9a-f]{32}", infer_header) and infer_header not in ("0" * 32, gen_id)
    assert health_header is None  # nothing the model computes: untagged, the client's header dropped
    assert [p.name for p in tmp_path.iterdir()] == [json.loads(slow_body)["parameters"][REQUEST_ID]]


def test_cancel_marks_older_than_a_minute_are_pruned(tmp_path):
    import os
    import time

    from backend.frontend.edge.cancel_marks import CancelMarks

    old = tmp_path / ("a" * 32)
    old.touch()
    os.utime(old, (time.time() - 120, time.time() - 120))
    (tmp_path / ("b" * 32)).touch()
    CancelMarks(tmp_path).mark("c" * 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b" * 32, "c" * 32]


def test_upstream_headers():
    """A header value that is not UTF-8 is a 400 naming it (it was aiohttp's 500); the internal key
    goes to Triton with every request, a client's own is dropped; the admin key only if it matches."""
    from types import SimpleNamespace

    from multidict import CIMultiDict

    from backend.frontend.edge.proxy import ADMIN_HEADER, INTERNAL_HEADER, Edge

    edge = Edge("http://127.0.0.1:9", admin_key="adm", upstream_admin_key="up", internal_key="inner")

    def headers(**h):  # as aiohttp parses them: bytes that are not UTF-8 kept as surrogates
        return edge._upstream_headers(SimpleNamespace(headers=CIMultiDict(h)))

    with pytest.raises(EdgeError, match=f"header {ADMIN_HEADER} is not valid UTF-8") as e:
        headers(**{ADMIN_HEADER: b"\xff\xfe".decode("utf-8", "surrogateescape")})
    assert e.value.status == 400
    assert headers(**{INTERNAL_HEADER: "guess", "X-A": "1"}) == {INTERNAL_HEADER: "inner", "X-A": "1"}
    assert headers(**{ADMIN_HEADER: "adm"}) == {ADMIN_HEADER: "up", INTERNAL_HEADER: "inner"}
    assert headers(**{ADMIN_HEADER: "wrong"}) == {INTERNAL_HEADER: "inner"}


def test_head_stream_true_and_stalled_clients():
    """HEAD gets GET's answer without a body (Triton 2.51 drops HEAD: the edge answered 503);
    stream: true on /generate is a 400 pointing to /generate_stream (Triton answers 200 with an
    error body); a client that stalls in its headers is dropped and one that stalls in its body gets
    408, after read_timeout_s."""
    import asyncio
    import time
    from types import SimpleNamespace

    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from backend.frontend.edge.proxy import serve
    from backend.frontend.supervisor.launch import free_port

    methods = []

    async def triton(request):
        if request.path.endswith("/config"):
            return web.json_response({"input": [{"name": "text_input", "data_type": "TYPE_STRING"},
                                                {"name": "stream", "data_type": "TYPE_BOOL"}]})
        methods.append(request.method)
        if request.method == "HEAD":  # what Triton 2.51 does
            request.transport.close()
        if request.path.endswith("/generate") and request.method != "POST":
            return web.json_response({"error": "Method Not Allowed"}, status=405)
        return web.json_response({"ready": True})

    async def stalled(front, request: bytes) -> tuple:
        reader, writer = await asyncio.open_connection(front.host, front.port)
        writer.write(request)
        await writer.drain()
        t0 = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), 10)  # until the edge closes the connection
        writer.close()
        return answer, time.monotonic() - t0

    async def main():
        upstream = web.Application()
        upstream.router.add_route("*", "/{tail:.*}", triton)
        async with TestServer(upstream) as up:
            stop, port = asyncio.Event(), free_port()
            served = asyncio.create_task(serve("127.0.0.1", port, str(up.make_url("")).rstrip("/"), stop,
                                               read_timeout_s=0.5))
            front = SimpleNamespace(host="127.0.0.1", port=port, url=lambda p: f"http://127.0.0.1:{port}{p}")
            async with ClientSession() as client:
                for _ in range(100):
                    try:
                        async with client.head(front.url("/v2/health/ready")) as r:
                            assert r.status == 200 and await r.read() == b""
                        break
                    except OSError:  # not listening yet
                        await asyncio.sleep(0.05)
                async with client.head(front.url("/v2/models/llm/generate")) as r:
                    assert r.status == 405 and await r.read() == b""
                async with client.post(front.url("/v2/models/llm/generate"), json={"text_input": "hi", "stream": True}) as r:
                    assert r.status == 400 and "/generate_stream" in (await r.json())["error"]
                async with client.post(front.url("/v2/models/llm/generate_stream"),
                                       json={"text_input": "hi", "stream": True}) as r:
                    assert r.status == 200
            answer, took = await stalled(front, b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\nContent-Le")
            assert took < 5, took
            answer, took = await stalled(front, b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\n"
                                                b"Content-Length: 100\r\n\r\n{\"text_input\": ")
            assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer, answer
            assert took < 5, took
            stop.set()
            await served

    asyncio.run(main())
    assert methods == ["GET", "GET", "POST"]


class FakeTriton:
    """Stands in for Triton's HTTP behind a real edge (serve): records what reaches it; a
    /generate_stream sends one event and then its connection breaks (Triton crashing)."""

    def __init__(self):
        self.seen = []

    async def handle(self, request):
        from aiohttp import web

        if request.path.endswith("/config"):
            return web.json_response({"input": [{"name": "text_input", "data_type": "TYPE_STRING"},
                                                {"name": "max_tokens", "data_type": "TYPE_INT32"},
                                                {"name": "stream", "data_type": "TYPE_BOOL"}]})
        self.seen.append((request.path, dict(request.headers), await request.read()))
        if request.path.endswith("/generate_stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"text_output": "Paris"}\n\n')
            request.transport.abort()  # dies mid-stream
            return resp
        return web.json_response({"text_output": "ok"})


def edge_test(main):
    """Run `main(url, fake)` against an edge (serve, with the OpenAI API mounted) in front of a
    FakeTriton, with a read timeout of 0.5 s."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from backend.frontend.edge.proxy import serve
    from backend.frontend.supervisor.launch import free_port

    fake = FakeTriton()

    async def run():
        upstream = web.Application()
        upstream.router.add_route("*", "/{tail:.*}", fake.handle)
        async with TestServer(upstream) as up:
            stop, port = asyncio.Event(), free_port()
            served = asyncio.create_task(serve("127.0.0.1", port, str(up.make_url("")).rstrip("/"), stop,
                                               grpc_upstream="127.0.0.1:9", read_timeout_s=0.5))
            for _ in range(100):
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:  # not listening yet
                    await asyncio.sleep(0.05)
            try:
                await main(f"http://127.0.0.1:{port}", fake)
            finally:
                stop.set()
                await served

    asyncio.run(run())
    return fake


async def raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 10) -> tuple:
    """(status, headers text, body bytes, seconds until the edge closed the connection) of one request
    written as is, `head` without its final empty line."""
    import asyncio
    import time

    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    t0 = time.monotonic()
    answer = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode(), rest, time.monotonic() - t0


OPENAI_BODIES = {"/v1/completions": {"model": "llm", "prompt": "hi"},
                 "/v1/chat/completions": {"model": "llm", "messages": [{"role": "user", "content": "hi"}]}}
TRITON_BODIES = {"/v2/models/llm/generate": {"text_input": "hi", "max_tokens": 2},
                 "/v2/models/llm/generate_stream": {"text_input": "hi", "max_tokens": 2, "stream": True}}


def error_of(path: str, body: bytes) -> dict:
    """The error a refused request got, checked to be in its interface's shape: OpenAI's on /v1,
    Triton's ({"error": message}; on /generate_stream as an event) elsewhere -> {message, code}."""
    import json

    text = body.decode()
    if path.startswith("/v1"):
        err = json.loads(text)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
        return err
    if path.endswith("_stream"):
        assert text.startswith("data: ") and text.endswith("\n\n"), text
        text = text[len("data: "):]
    return {"message": json.loads(text)["error"], "code": None}


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
@pytest.mark.parametrize("path", [*OPENAI_BODIES, *TRITON_BODIES])
def test_a_body_that_does_not_match_its_content_encoding_is_a_400(path, coding):
    """It was a 500 on all four (aiohttp's payload error escaped the body reader), and on the chat
    endpoint the message blamed the chat template."""
    import json

    body = json.dumps({**OPENAI_BODIES, **TRITON_BODIES}[path]).encode()

    async def main(url, fake):
        status, _, answer, _ = await raw_request(url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                                      f"application/json\r\nContent-Encoding: {coding}\r\n"
                                                      f"Content-Length: {len(body)}".encode(), body)
        assert status == 400, answer
        message = error_of(path, answer)["message"]
        assert f"does not match its Content-Encoding: it is not {coding} data" in message, message

    assert edge_test(main).seen == []


def test_a_compressed_body_reaches_triton_decoded():
    """tritonclient's request_compression_algorithm: the edge undoes the coding, so Triton gets the
    body without the Content-Encoding it no longer has (it was forwarded with it)."""
    import gzip
    import json

    body = json.dumps(TRITON_BODIES["/v2/models/llm/generate"]).encode()

    async def main(url, fake):
        status, _, answer, _ = await raw_request(url, b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\n"
                                                      b"Content-Encoding: gzip\r\nContent-Length: %d"
                                                      % len(gzip.compress(body)), gzip.compress(body))
        assert status == 200, answer

    ((_, headers, got),) = edge_test(main).seen
    assert json.loads(got)["text_input"] == "hi" and "Content-Encoding" not in headers


@pytest.mark.parametrize("path,content_type", [
    ("/v1/completions", "text/plain"), ("/v1/completions", None), ("/v1/chat/completions", "text/plain; charset=utf-8"),
    ("/v1/chat/completions", "application/x-www-form-urlencoded"),
    ("/v2/models/llm/generate", "text/plain"), ("/v2/models/llm/generate_stream", "multipart/form-data; boundary=b"),
    ("/v2/models/llm/generate", "application/json; charset=utf-16"), ("/v2/models/llm/infer", "text/xml"),
])
def test_an_unsupported_media_type_is_a_415(path, content_type):
    import json

    body = json.dumps({**OPENAI_BODIES, **TRITON_BODIES}.get(path, {"inputs": []})).encode()

    async def main(url, fake):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
        head += f"\r\nContent-Type: {content_type}" if content_type else ""
        status, _, answer, _ = await raw_request(url, head.encode(), body)
        assert status == 415, answer
        assert "application/json" in error_of(path, answer)["message"]

    assert edge_test(main).seen == []


@pytest.mark.parametrize("path", ["/v1/completions", "/v2/models/llm/generate"])
def test_json_in_utf16_is_a_415(path):
    import json

    body = json.dumps({**OPENAI_BODIES, **TRITON_BODIES}[path]).encode("utf-16")

    async def main(url, fake):
        status, _, answer, _ = await raw_request(url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                                      f"application/json\r\nContent-Length: {len(body)}".encode(), body)
        assert status == 415 and "UTF-8" in error_of(path, answer)["message"], answer

    assert edge_test(main).seen == []


def test_what_nvidias_clients_and_curl_send_is_served():
    """Triton's protocol keeps serving the labels its clients use: none (tritonclient.http),
    application/octet-stream (tritonclient.http.aio), application/x-www-form-urlencoded (curl -d)."""
    import json

    body = json.dumps(TRITON_BODIES["/v2/models/llm/generate"]).encode()

    async def main(url, fake):
        for content_type in (None, "application/json", "application/octet-stream", "application/x-www-form-urlencoded"):
            head = f"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
            head += f"\r\nContent-Type: {content_type}" if content_type else ""
            status, _, answer, _ = await raw_request(url, head.encode(), body)
            assert status == 200, (content_type, answer)

    assert len(edge_test(main).seen) == 4


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models", "/v2/models/llm/generate",
                                  "/v2/models/llm/generate_stream", "/v2/health/ready"])
@pytest.mark.parametrize("headers", [[b"X-Big: " + b"a" * 65536], [b"X-H%d: " % i + b"a" * 4096 for i in range(16)]],
                         ids=["one-64KB-header", "16-4KB-headers"])
def test_oversized_headers_are_a_431_in_the_interfaces_shape(path, headers):
    """It was aiohttp's plain-text 400 (one 64 KB header) or forwarded to Triton (16 of 4 KB)."""
    async def main(url, fake):
        status, _, answer, _ = await raw_request(url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                                      "application/json\r\nContent-Length: 2\r\n".encode()
                                                 + b"\r\n".join(headers), b"{}")
        assert status == 431, answer
        err = error_of(path, answer)
        assert "this server accepts at most 32768" in err["message"]
        assert err["code"] in (None, "headers_too_large")

    assert edge_test(main).seen == []


@pytest.mark.parametrize("path", ["/v1/completions", "/v2/models/llm/generate"])
def test_a_stalled_body_gets_408_and_the_connection_closed_on_every_interface(path):
    """/v1 kept the connection for aiohttp's lingering time (10 s) after its 408."""
    async def main(url, fake):
        status, _, answer, took = await raw_request(url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                                         "application/json\r\nContent-Length: 100".encode(), b'{"a": ')
        assert status == 408 and "did not arrive within 0.5 s" in error_of(path, answer)["message"], answer
        assert took < 3, took

    edge_test(main)


def test_a_stream_triton_stops_sending_ends_with_an_error_event():
    """Triton dying mid-stream cut the client's chunked response (no error, no last chunk)."""
    import json

    body = json.dumps(TRITON_BODIES["/v2/models/llm/generate_stream"]).encode()

    async def main(url, fake):
        status, head, answer, _ = await raw_request(url, b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: x\r\n"
                                                         b"Content-Type: application/json\r\nContent-Length: %d"
                                                         % len(body), body)
        assert status == 200 and "chunked" in head.lower()
        assert answer.endswith(b"0\r\n\r\n"), answer  # the last chunk: a complete response
        events = [json.loads(line[len(b"data: "):]) for line in answer.split(b"\r\n") if line.startswith(b"data: ")]
        assert events[0] == {"text_output": "Paris"} and "stopped while running this request" in events[-1]["error"]

    edge_test(main)


def test_an_unreachable_triton_is_a_503_logged_once_an_outage(caplog):
    """While Triton starts, clients poll /v2/health/ready through the edge several times a second:
    each poll is a 503, but the server log got one warning a poll (hundreds a start)."""
    import asyncio
    import logging

    import aiohttp

    from backend.frontend.edge.proxy import serve
    from backend.frontend.supervisor.launch import free_port

    async def run():
        stop, port = asyncio.Event(), free_port()
        nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        served = asyncio.create_task(serve("127.0.0.1", port, nobody, stop, grpc_upstream="127.0.0.1:9"))
        statuses = []
        async with aiohttp.ClientSession() as client:
            for _ in range(100):
                try:
                    async with client.get(f"http://127.0.0.1:{port}/v2/health/ready") as r:
                        statuses.append(r.status)
                    if len(statuses) == 5:
                        break
                except aiohttp.ClientConnectionError:  # the edge is not listening yet
                    await asyncio.sleep(0.05)
        stop.set()
        await served
        return statuses

    with caplog.at_level(logging.WARNING):
        statuses = asyncio.run(run())
    assert statuses == [503] * 5
    assert len([r for r in caplog.records if "upstream GET /v2/health/ready failed" in r.getMessage()]) == 1
