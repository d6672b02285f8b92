"""The edge's proxy: the HTTP port clients reach, which reads and checks what comes in, adds
Triton's keys and forwards it to Triton's own HTTP on its private Unix socket (the package's
docstring says what it refuses and why)."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import uuid
from typing import Optional

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, UnixConnector, web

from ..body_format import OPENAI_TYPES, TRITON_TYPES, check_media_type, read_body
from ..http_body import EdgeError, close_after, parse_json
from ..metrics import EdgeRefusals
from ...server_config import ServerConfig
from ...wire import ADMIN_HEADER, INTERNAL_HEADER, REQUEST_ID, REQUEST_ID_HEADER, STREAM_BROKEN, ErrorKind
from .cancel_marks import CancelMarks
from .checks import check_generate, check_infer, streams
from .errors import error_event, error_response, is_openai, refusal, status_for_model_error

log = logging.getLogger("specserve.edge")

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full 2,048-token prompt is ~10 KB
MAX_DEPTH = 32  # the generate interface needs 3 levels; tensors in /infer one per dimension
READ_TIMEOUT_S = 30.0  # a client's time to send its headers, and again its body (1 MiB: 35 KB/s)
# A request's line and headers: beyond MAX_HEADER_BYTES 431 in the interface's shape. aiohttp's own
# parser refuses a line or one header over its limits with a plain-text 400 (it cannot know which
# interface the request was for): they are raised to HEADER_PARSE_LIMIT so that only absurd sizes
# reach it (its memory per connection stays under 128 headers of that size).
MAX_HEADER_BYTES = 32 << 10
HEADER_PARSE_LIMIT = 128 << 10
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "content-length", "host", "expect"}
GENERATE = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/generate(?:_stream)?$")
INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/infer$")
UPSTREAM_DROPPED = {ADMIN_HEADER, REQUEST_ID_HEADER, INTERNAL_HEADER,
                    "content-encoding"}  # the edge forwards the body decoded (read_body)
# Triton refuses /infer for a decoupled model (501); these names reach the engine's unary model
# (model_repository/llm_unary) instead. Its responses name llm_unary as the model.
UNARY_ROUTES = {"llm": "llm_unary", "ensemble": "llm_unary", "tensorrt_llm_bls": "llm_unary",
                "tensorrt_llm": "tensorrt_llm_unary"}
INFER_HEADER = "Inference-Header-Content-Length"
# The edge's own id of a request the model computes (backend/wire.py). Triton 2.51 forwards headers
# (--http-header-forward-pattern, backend/frontend/supervisor/triton_command.py) as request parameters
# on /infer only, not on /generate: there the id goes into the body's "parameters". llm_unary passes
# it on to llm (backend/frontend/triton_models/forward.py), whose response sender watches for its
# cancel mark (backend/frontend/triton_models/model.py).


class Edge:
    def __init__(self, upstream: str, max_body_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_DEPTH,
                 grpc_upstream: Optional[str] = None, draining: Optional[asyncio.Event] = None,
                 admin_key: Optional[str] = None, upstream_admin_key: Optional[str] = None,
                 internal_key: Optional[str] = None, cancel_dir: Optional[str] = None,
                 refusals_file: Optional[str] = None, read_timeout_s: float = READ_TIMEOUT_S,
                 served: Optional[ServerConfig] = None):
        # Triton's HTTP: "unix:<socket path>" (what the supervisor gives) or a base URL
        self.upstream_socket = upstream[len("unix:"):] if upstream.startswith("unix:") else None
        self.upstream = "http://triton" if self.upstream_socket else upstream.rstrip("/")
        # what is refused here never reaches Triton's or the model's counters (backend/frontend/metrics.py)
        self.refusals = EdgeRefusals(refusals_file)
        self._unreachable_logged = False
        # Set when shutdown begins: every new request gets 503 (readiness too), in-flight ones go on.
        self.draining = draining
        # The client's ADMIN_HEADER is checked here against admin_key and never passed on; Triton
        # (behind, on its private socket) gets upstream_admin_key instead, so the admin key never appears on
        # any command line (backend/frontend/supervisor/server_secrets.py).
        self.admin_key, self.upstream_admin_key = admin_key, upstream_admin_key
        # added to every request forwarded: Triton's other APIs are closed without it
        self.internal = {INTERNAL_HEADER: internal_key} if internal_key else {}
        self.read_timeout_s = read_timeout_s
        self.grpc_upstream = grpc_upstream  # Triton's gRPC, e.g. 127.0.0.1:8001: serves the OpenAI API
        self.served = served  # what the supervisor resolved (backend/served.py): the OpenAI API reads it
        self.max_body_bytes, self.max_depth = max_body_bytes, max_depth
        self.marks = CancelMarks(cancel_dir) if cancel_dir else None  # None: requests are not tagged
        self.session: Optional[ClientSession] = None
        self._configs: dict = {}  # model -> Triton's model config (JSON)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes + 1,  # the handler reads; this is a backstop
                              middlewares=[self._limit_headers, self._refuse_while_draining])
        if self.grpc_upstream:  # /v1/...: backend/frontend/openai/, before the catch-all
            from ..openai.routes import OpenAIApi
            OpenAIApi(self, self.grpc_upstream, self.served).mount(app)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    def _refused(self, request: web.Request, status: int, message: str, code: Optional[str] = None) -> web.Response:
        """refusal(), counted: neither Triton's counters nor the model's see it."""
        self.refusals.count("openai" if is_openai(request.path) else "triton", status, code)
        return refusal(request, status, message, code)

    @web.middleware
    async def _limit_headers(self, request: web.Request, handler):
        size = len(request.raw_path) + sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
        if size <= MAX_HEADER_BYTES:
            return await handler(request)
        return self._refused(request, 431, f"the request's headers are {size} bytes; this server accepts at most "
                                           f"{MAX_HEADER_BYTES}", "headers_too_large")

    @web.middleware
    async def _refuse_while_draining(self, request: web.Request, handler):
        if self.draining is None or not self.draining.is_set() or request.path == "/v2/health/live":
            return await handler(request)
        return self._refused(request, 503, ErrorKind.SHUTTING_DOWN.message("not accepting new requests; retry on "
                                                                           "another server or later"), "shutting_down")

    def _upstream_headers(self, request: web.Request) -> dict:
        """The client's headers as Triton gets them: EdgeError(400) naming a header whose value is
        not UTF-8 (aiohttp keeps its bytes as surrogates, which no request can carry on)."""
        for k, v in request.headers.items():
            try:
                v.encode()
            except UnicodeEncodeError:
                raise EdgeError(400, f"the value of header {k} is not valid UTF-8") from None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in HOP_BY_HOP and k.lower() not in UPSTREAM_DROPPED}
        key = request.headers.get(ADMIN_HEADER)
        if key is not None and self.admin_key and self.upstream_admin_key and \
                hmac.compare_digest(key.encode(), self.admin_key.encode()):
            headers[ADMIN_HEADER] = self.upstream_admin_key
        headers.update(self.internal)
        return headers

    async def _open(self, app) -> None:
        # skip_auto_headers: no Accept-Encoding the client did not send, or Triton gzips /infer
        # responses for clients that cannot read them (perf_analyzer -i http, curl).
        connector = UnixConnector(self.upstream_socket, limit=0) if self.upstream_socket else TCPConnector(limit=0)
        self.session = ClientSession(connector=connector, auto_decompress=False,
                                     timeout=ClientTimeout(total=None, sock_connect=5),
                                     skip_auto_headers=("Accept-Encoding",))

    async def _close(self, app) -> None:
        await self.session.close()

    async def read_json(self, request: web.Request, media_types: frozenset = OPENAI_TYPES):
        """The request's body as JSON within this edge's size and depth limits, labelled with one
        of `media_types` (EdgeError if not)."""
        body = await read_body(request, self.max_body_bytes, self.read_timeout_s)
        check_media_type(request.headers.get("Content-Type"), media_types)
        return parse_json(body, self.max_depth)

    async def model_config(self, model: str) -> dict:
        """Triton's config of `model` ({} if unknown or unreachable; cached once fetched)."""
        if model not in self._configs:
            try:
                async with self.session.get(f"{self.upstream}/v2/models/{model}/config", headers=self.internal) as r:
                    if r.status != 200:
                        return {}  # unknown model: Triton says so
                    self._configs[model] = await r.json()
            except (ClientError, ValueError):
                return {}
        return self._configs[model]

    async def _model_inputs(self, model: str) -> dict:
        return {i["name"]: i["data_type"] for i in (await self.model_config(model)).get("input", [])}

    async def _route(self, request: web.Request) -> str:
        """The upstream path and query: /infer on a decoupled model (UNARY_ROUTES) goes to its
        unary model, if the server has it."""
        m = INFER.match(request.path)
        target = UNARY_ROUTES.get(m["model"]) if m else None
        if target is None or not await self._model_inputs(target):
            return str(request.rel_url)
        path = request.path.replace(f"/models/{m['model']}/", f"/models/{target}/", 1)
        return str(request.rel_url.with_path(path).with_query(request.rel_url.query))

    async def _check(self, request: web.Request, body: bytes):
        """EdgeError if the body is refused; -> the parsed body of a generate request, else None."""
        if not body and request.method in ("GET", "HEAD", "DELETE"):
            return None
        if body:  # (an empty one: the checks below say what is missing)
            check_media_type(request.headers.get("Content-Type"), TRITON_TYPES)
        header_len = request.headers.get(INFER_HEADER)
        if header_len is not None:  # binary tensor data follows a JSON header
            try:
                n = int(header_len)
            except ValueError:
                raise EdgeError(400, f"{INFER_HEADER} must be an integer") from None
            if not 0 <= n <= len(body):
                raise EdgeError(400, f"{INFER_HEADER} {n} does not fit the {len(body)}-byte body")
            check_infer(parse_json(body[:n], self.max_depth))
            return None
        m = GENERATE.match(request.path)
        if m:
            parsed = parse_json(body, self.max_depth)
            check_generate(parsed, await self._model_inputs(m["model"]))
            if not request.path.endswith("_stream") and streams(parsed.get("stream")):
                raise EdgeError(400, "stream: true asks for one response per step, which /generate cannot send: "
                                     "use /generate_stream (server-sent events), or send stream false")
            return parsed
        if INFER.match(request.path):
            check_infer(parse_json(body, self.max_depth))
        elif body:
            parse_json(body, self.max_depth)
        return None

    def _tag(self, generate, body: bytes, path: str, headers: dict) -> tuple:
        """A fresh id for a request the model computes: a generate body's parameter, or on /infer
        to the unary model a header Triton forwards. -> (id or None, body to send). Any id the
        client sent is replaced (its header was dropped, see _upstream_headers)."""
        if self.marks is None:
            return None, body
        rid = uuid.uuid4().hex
        if isinstance(generate, dict):
            params = generate.get("parameters", {})
            if not isinstance(params, dict):  # not ours to fix: left to Triton as it is
                return None, body
            generate["parameters"] = dict(params, **{REQUEST_ID: rid})
            return rid, json.dumps(generate).encode()
        m = INFER.match(path.split("?", 1)[0])
        if m and m["model"] in UNARY_ROUTES.values():
            headers[REQUEST_ID_HEADER] = rid
            return rid, body
        return None, body

    def _client_left(self, rid: Optional[str]) -> None:
        if rid is not None:
            self.marks.mark(rid)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        stream = request.path.endswith("/generate_stream")
        try:
            body = await read_body(request, self.max_body_bytes, self.read_timeout_s)
            generate = await self._check(request, body)
            headers = self._upstream_headers(request)
        except EdgeError as e:
            self.refusals.count("triton", e.status)
            resp = error_response(e.status, e.message, stream)
            return await close_after(request, resp) if e.status == 408 else resp
        path = await self._route(request)
        rid, body = self._tag(generate, body, path, headers)
        try:
            return await self._forward(request, f"{self.upstream}{path}", body, headers, stream, rid)
        except asyncio.CancelledError:  # the client left first (aiohttp cancels the handler)
            self._client_left(rid)
            raise

    async def _forward(self, request: web.Request, url: str, body: bytes, headers: dict, stream: bool,
                       rid: Optional[str]) -> web.StreamResponse:
        try:
            # HEAD: Triton 2.51 drops the connection; GET's answer, whose body aiohttp leaves out
            method = "GET" if request.method == "HEAD" else request.method
            async with self.session.request(method, url, data=body or None, headers=headers) as up:
                self._unreachable_logged = False
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
                if up.status >= 400 or not stream:
                    data = await up.read()
                    return self._relay_whole(up.status, out_headers, data, stream)
                resp = web.StreamResponse(status=up.status, headers=out_headers)
                await resp.prepare(request)
                try:
                    async for chunk in up.content.iter_any():
                        try:
                            await resp.write(chunk)
                        except ConnectionResetError:  # the client has gone: closing upstream cancels it
                            self._client_left(rid)
                            return resp
                except (ClientError, asyncio.TimeoutError) as e:  # upstream broke mid-stream (Triton died)
                    log.warning("upstream %s %s broke mid-stream: %r", request.method, request.path, e)
                    try:  # an error event, then a complete response: the client knows it did not finish
                        await resp.write(error_event(STREAM_BROKEN))
                        await resp.write_eof()
                    except ConnectionResetError:
                        self._client_left(rid)
                    return resp
                await resp.write_eof()
                return resp
        except (ClientError, asyncio.TimeoutError, ConnectionRefusedError) as e:
            if not self._unreachable_logged:  # once an outage: clients poll /v2/health/ready while Triton starts
                log.warning("upstream %s %s failed (logged once until Triton answers again): %r",
                            request.method, request.path, e)
                self._unreachable_logged = True
            self.refusals.count("triton", 503, "unreachable")
            return error_response(503, "the inference server is not reachable; retry later", stream)

    def _relay_whole(self, status: int, headers: dict, data: bytes, stream: bool) -> web.Response:
        if status >= 400:
            message = None
            text = data.decode("utf-8", "replace")
            if stream and text.startswith("data:"):
                text = text[5:].strip()
            try:
                message = json.loads(text).get("error")
            except (ValueError, AttributeError):
                pass
            if isinstance(message, str):
                new = status_for_model_error(status, message)
                if new != status:
                    return error_response(new, message, stream)
        return web.Response(status=status, headers=headers, body=data)


async def serve(host: str, port: int, upstream: str, stop: asyncio.Event, shutdown_timeout: float = 12.0,
                **limits) -> None:
    """Serve the edge until `stop` is set; then stop accepting, let in-flight requests finish
    for up to `shutdown_timeout` seconds, and close."""
    edge = Edge(upstream, **limits)
    # keepalive_timeout also bounds the wait for a request's headers (aiohttp closes a connection
    # whose request is not complete by then): a slow-loris client is dropped after it
    # auto_decompress off: read_body undoes Content-Encoding itself (body_format), refusing what it
    # cannot decode in the interface's shape (aiohttp's own decoder raises mid-read, or answers a
    # plain-text 400 before any handler)
    runner = web.AppRunner(edge.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=shutdown_timeout, keepalive_timeout=edge.read_timeout_s,
                           auto_decompress=False, max_line_size=HEADER_PARSE_LIMIT, max_field_size=HEADER_PARSE_LIMIT)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
