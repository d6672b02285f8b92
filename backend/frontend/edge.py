"""The HTTP edge: the one HTTP port clients reach; Triton's own HTTP listens behind it on a
Unix socket no other local user can reach (started by backend/frontend/launcher.py), every API
of it closed to requests without the per-start key the edge adds (INTERNAL_HEADER).

Triton 2.51's HTTP front end has no request-size or nesting limit, and dies (SIGSEGV) on some
bodies of about 4 MiB and on JSON nested 40,000 deep (issue 20), and it answers 500 for
client mistakes it finds while parsing (malformed JSON, wrong JSON types). So before anything
reaches Triton the edge

- refuses a body over `max_body_bytes` (413, also once its Content-Encoding is undone), JSON
  nested deeper than `max_depth` or holding a lone UTF-16 surrogate (400), a body that does not
  match its Content-Encoding (400), a content coding or media type the interface does not take, a
  body in UTF-16 (415; backend/frontend/body_format.py), headers over MAX_HEADER_BYTES (431), and a
  client slower than `read_timeout_s` to send its headers (the connection is closed) or its body
  (408, and closed), each in the interface's own error shape (refusal);
- on the generate endpoints and /infer, refuses what Triton would answer 500 for or silently
  wrap (a body that is not a JSON object, `inputs` that is no array, a negative or fractional
  shape, a value of the wrong JSON type, an integer outside its tensor type such as max_tokens
  2^32+8, which INT32 would wrap to 8) with 400 naming the field, a generate field that is no
  input of the model (Triton would pass it on as a parameter the model never reads), as Triton
  itself refuses an unknown input on /infer and gRPC, and `stream: true` on /generate (Triton
  answers 200 with an error body: streaming is /generate_stream's);
- answers HEAD with what GET would, without the body (Triton 2.51 drops HEAD connections);
- sends /infer on the decoupled models (llm, ensemble, tensorrt_llm_bls; tensorrt_llm), which Triton refuses
  with 501, to their unary twins llm_unary / tensorrt_llm_unary (model_repository/) on the same engine;
- gives the model's own errors their status: Triton 2.51 answers 400 for every error a
  decoupled model sends, so "server overloaded" becomes 503 (with Retry-After) and
  "internal error" 500;
- passes everything else through unchanged, streaming included (a client that disconnects
  closes the upstream connection, which cancels its request; a stream Triton stops sending, say
  because it crashed, ends with an error event, not a cut);
- tells the model when a client leaves before its response is complete (CancelMarks): Triton
  2.51's HTTP front end notices only when it next writes to it, so a request still waiting in
  the queue, or a /generate still generating, would otherwise run to its end.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import time
import uuid
from pathlib import Path
from typing import Optional

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, UnixConnector, web

from .body_format import OPENAI_TYPES, TRITON_TYPES, check_media_type
from .http_body import EdgeError, close_after, parse_json, read_body
from .metrics import EdgeRefusals
from ..server_config import ServerConfig
from ..wire import (ADMIN_HEADER, INTERNAL_HEADER, REQUEST_ID, REQUEST_ID_HEADER, REQUEST_ID_NAMES, STREAM_BROKEN,
                    ErrorKind, error_kind)

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
GENERATE_FIELDS = {"id", "parameters"}  # generate-request fields of Triton's own besides the inputs
INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/infer$")
UPSTREAM_DROPPED = {ADMIN_HEADER, REQUEST_ID_HEADER, INTERNAL_HEADER,
                    "content-encoding"}  # the edge forwards the body decoded (read_body)
# Triton refuses /infer for a decoupled model (501); these names reach the engine's unary model
# (model_repository/llm_unary) instead. Its responses name llm_unary as the model.
UNARY_ROUTES = {"llm": "llm_unary", "ensemble": "llm_unary", "tensorrt_llm_bls": "llm_unary",
                "tensorrt_llm": "tensorrt_llm_unary"}
INFER_HEADER = "Inference-Header-Content-Length"
# The edge's own id of a request the model computes (backend/wire.py). Triton 2.51 forwards headers
# (--http-header-forward-pattern, backend/frontend/launcher.py) as request parameters on /infer only, not on
# /generate: there the id goes into the body's "parameters". llm_unary passes it on to llm
# (backend/frontend/triton_models/forward.py), whose response sender watches for its cancel mark (backend/frontend/triton_models/model.py).

_INT_RANGES = {f"TYPE_INT{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)}
_INT_RANGES.update({f"TYPE_UINT{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64)})
_FLOAT_MAX = {"TYPE_FP16": 65504.0, "TYPE_FP32": 3.4028234663852886e38, "TYPE_FP64": math.inf}
# /infer's datatypes (the KServe protocol's names) as model-config types
_INFER_TYPES = {"BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING", **{t[5:]: t for t in (*_INT_RANGES, *_FLOAT_MAX)}}


def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def check_field(name: str, value, data_type: str) -> None:
    """One generate field against its tensor type in the model config: EdgeError(400) if
    Triton would refuse it with a 500 or convert it wrongly."""
    items, stack = [], [value]
    while stack:  # depth already bounded
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        else:
            items.append(v)
    for v in items:
        if data_type == "TYPE_BOOL":
            if not isinstance(v, bool):
                raise EdgeError(400, f"{name} must be true or false, got {_type_name(v)}")
        elif data_type == "TYPE_STRING":
            if not isinstance(v, str):
                raise EdgeError(400, f"{name} must be a string, got {_type_name(v)}")
        elif data_type in _INT_RANGES:
            lo, hi = _INT_RANGES[data_type]
            if isinstance(v, bool) or not isinstance(v, int):
                raise EdgeError(400, f"{name} must be an integer, got {_type_name(v)}")
            if not lo <= v <= hi:
                raise EdgeError(400, f"{name} {v} is out of range: {data_type[5:]} holds {lo}..{hi}")
        elif data_type in _FLOAT_MAX:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise EdgeError(400, f"{name} must be a number, got {_type_name(v)}")
            if math.isfinite(v) and abs(v) > _FLOAT_MAX[data_type]:
                raise EdgeError(400, f"{name} {v} is out of range for {data_type[5:]}")


def check_generate(body, input_types: dict) -> None:
    """A generate body against the model's inputs ({} when the model is unknown: Triton says so).
    Triton would pass a field that is no input on as a request parameter, which the model never
    reads: refused here, naming it, as Triton refuses an unknown input on /infer and gRPC."""
    if not isinstance(body, dict):
        raise EdgeError(400, f"the request body must be a JSON object, got {_type_name(body)}")
    for name, value in body.items():
        if name in input_types:
            check_field(name, value, input_types[name])
        elif input_types and name not in GENERATE_FIELDS:
            raise EdgeError(400, unknown_input_message(name, input_types))
    params = body.get("parameters")
    if input_types and isinstance(params, dict):
        for name in params:
            if name in input_types:
                raise EdgeError(400, f"parameters.{name} is not read by the model: send {name} as a "
                                     "top-level field of the request")


def unknown_input_message(name: str, input_types: dict) -> str:
    return (f"unexpected input '{name}': this model has no such input (it has "
            f"{', '.join(sorted(input_types))})")


def check_infer(body) -> None:
    """An /infer body (or the JSON header of a binary one): EdgeError(400) naming the field for what
    Triton 2.51 answers 500 for (inputs not an array, a shape not of non-negative integers, data of
    the wrong JSON type) or wraps silently (an integer outside its datatype). The request id
    parameter is the edge's own (REQUEST_ID_HEADER): a client's would reach the unary model next to it."""
    if not isinstance(body, dict):
        raise EdgeError(400, f"the request body must be a JSON object, got {_type_name(body)}")
    params = body.get("parameters")
    if isinstance(params, dict) and any(k.lower() in REQUEST_ID_NAMES for k in params):
        raise EdgeError(400, f"parameters.{REQUEST_ID_HEADER} is reserved: the server sets it")
    for key in ("inputs", "outputs"):
        if key in body and not isinstance(body[key], list) or key == "inputs" and key not in body:
            raise EdgeError(400, f"{key} must be an array of tensor objects, got {_type_name(body.get(key))}")
    for i, tensor in enumerate(body["inputs"]):
        if not isinstance(tensor, dict):
            raise EdgeError(400, f"inputs[{i}] must be a tensor object, got {_type_name(tensor)}")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise EdgeError(400, f"inputs[{i}].name must be a string, got {_type_name(name)}")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise EdgeError(400, f"input '{name}': shape must be an array of non-negative integers, got "
                                 f"{json.dumps(shape)[:80]}")
        datatype = tensor.get("datatype")
        if not isinstance(datatype, str):
            raise EdgeError(400, f"input '{name}': datatype must be a string, got {_type_name(datatype)}")
        if "data" in tensor and datatype in _INFER_TYPES:  # an unknown datatype: Triton names it
            check_field(name, tensor["data"], _INFER_TYPES[datatype])


def streams(value) -> bool:
    """Whether a generate body's `stream` field asks for a stream (true, or [true])."""
    return value is True or isinstance(value, list) and True in value


def status_for_model_error(status: int, message: str) -> int:
    """Triton 2.51 answers 400 for every error a decoupled model sends: restore its kind's status."""
    return error_kind(message).http_status if status == 400 else status


def error_response(status: int, message: str, stream: bool = False) -> web.Response:
    headers = {"Retry-After": "1"} if status == 503 else {}
    if stream:  # the shape Triton uses for /generate_stream errors
        return web.Response(status=status, headers=headers, content_type="text/event-stream",
                            text=error_event(message).decode())
    return web.json_response({"error": message}, status=status, headers=headers)


def error_event(message: str) -> bytes:
    """An error as Triton's /generate_stream sends it: one server-sent event whose data is {"error": ...}."""
    return f"data: {json.dumps({'error': message})}\n\n".encode()


def is_openai(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def refusal(request: web.Request, status: int, message: str, code: Optional[str] = None) -> web.Response:
    """An error in the shape of the interface the request was for: OpenAI's on /v1, Triton's
    ({"error": message}, an event on /generate_stream) on the rest."""
    if is_openai(request.path):
        from .openai.errors import ApiError, error_response as openai_error
        return openai_error(ApiError(status, message, code=code))
    return error_response(status, message, request.path.endswith("/generate_stream"))


class CancelMarks:
    """The cancel marks of one server: an empty file named by a request's id in `directory` (made
    by backend/frontend/launcher.py, SPECSERVE_CANCEL_DIR) says that its HTTP client has gone. The model
    polls for it like for a gRPC cancel and removes it when the request ends; marks it never
    removes (the request had already ended, or its last send failed) are pruned here after a minute."""

    PRUNE_AGE_S, PRUNE_EVERY_S = 60.0, 10.0

    def __init__(self, directory):
        self.dir, self._pruned = Path(directory), 0.0

    def mark(self, rid: str) -> None:
        try:
            (self.dir / rid).touch()
        except OSError as e:
            log.warning("could not mark request %s cancelled: %r", rid, e)
        now = time.time()
        if now - self._pruned >= self.PRUNE_EVERY_S:
            self._pruned = now
            for p in self.dir.glob("*"):
                try:
                    if now - p.stat().st_mtime > self.PRUNE_AGE_S:
                        p.unlink()
                except OSError:
                    pass


class Edge:
    def __init__(self, upstream: str, max_body_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_DEPTH,
                 grpc_upstream: Optional[str] = None, draining: Optional[asyncio.Event] = None,
                 admin_key: Optional[str] = None, upstream_admin_key: Optional[str] = None,
                 internal_key: Optional[str] = None, cancel_dir: Optional[str] = None,
                 refusals_file: Optional[str] = None, read_timeout_s: float = READ_TIMEOUT_S,
                 served: Optional[ServerConfig] = None):
        # Triton's HTTP: "unix:<socket path>" (what the launcher gives) or a base URL
        self.upstream_socket = upstream[len("unix:"):] if upstream.startswith("unix:") else None
        self.upstream = "http://triton" if self.upstream_socket else upstream.rstrip("/")
        # what is refused here never reaches Triton's or the model's counters (backend/frontend/metrics.py)
        self.refusals = EdgeRefusals(refusals_file)
        self._unreachable_logged = False
        # Set when shutdown begins: every new request gets 503 (readiness too), in-flight ones go on.
        self.draining = draining
        # The client's ADMIN_HEADER is checked here against admin_key and never passed on; Triton
        # (behind, on its private socket) gets upstream_admin_key instead, so the admin key never appears on
        # any command line (backend/frontend/launcher.py).
        self.admin_key, self.upstream_admin_key = admin_key, upstream_admin_key
        # added to every request forwarded: Triton's other APIs are closed without it
        self.internal = {INTERNAL_HEADER: internal_key} if internal_key else {}
        self.read_timeout_s = read_timeout_s
        self.grpc_upstream = grpc_upstream  # Triton's gRPC, e.g. 127.0.0.1:8001: serves the OpenAI API
        self.served = served  # what the launcher resolved (backend/served.py): the OpenAI API reads it
        self.max_body_bytes, self.max_depth = max_body_bytes, max_depth
        self.marks = CancelMarks(cancel_dir) if cancel_dir else None  # None: requests are not tagged
        self.session: Optional[ClientSession] = None
        self._configs: dict = {}  # model -> Triton's model config (JSON)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes + 1,  # the handler reads; this is a backstop
                              middlewares=[self._limit_headers, self._refuse_while_draining])
        if self.grpc_upstream:  # /v1/...: backend/frontend/openai/, before the catch-all
            from .openai.routes import OpenAIApi
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
