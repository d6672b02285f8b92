"""The OpenAI API's routes on the edge, and the way of a request to Triton's `llm` model and back:
n requests on one gRPC stream with tritonclient's asyncio client."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
from aiohttp import web

from . import respond
from .errors import ApiError, ModelError, UpstreamGone, api_error, error_response, model_error
from .logprobs import TokenPieces, of_response
from .parse import OpenAIRequest, parse_chat, parse_completion, resolve_lengths
from .template import ChatTemplate
from ..http_body import EdgeError, close_after
from ...server_config import ServerConfig
from ...wire import ErrorKind

log = logging.getLogger("specserve.openai")
ROOT = Path(__file__).resolve().parents[3]
ENGINE_MODEL = "llm"  # the Triton model every OpenAI request runs on
# The routes of this API and their methods: another method answers 405, another /v1 path 404.
ROUTES = {"/v1/models": "GET", "/v1/chat/completions": "POST", "/v1/completions": "POST"}
MODEL_OBJECT = {"id": ENGINE_MODEL, "object": "model", "created": 0, "owned_by": "specserve"}
RECONNECT_BACKOFF_MAX_MS = 1000  # the longest wait between reconnects to a restarted Triton


def triton_channel_args() -> list:
    """tritonclient's default gRPC channel options, and reconnects at most 1 s apart. Triton is
    local and the supervisor restarts it; gRPC's default reconnect backoff grows by 1.6x up to
    120 s while it is down, so after a long restart the OpenAI API kept answering "not reachable"
    for up to ~half the outage again after Triton was ready (seen as nothing served for 60 s
    after a restart in tests/integration/test_lifecycle.py's many restarts, on a busy machine)."""
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    keepalive = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)]


class OpenAIApi:
    def __init__(self, edge, grpc_url: str, served: ServerConfig):
        self.edge, self.grpc_url = edge, grpc_url  # edge: body limits and Triton's readiness
        self.served = served  # the launcher's record: the checkpoint and the default length
        self.client = None
        self._template: Optional[ChatTemplate] = None
        self._pieces: Optional[TokenPieces] = None

    def mount(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        # before the edge's catch-all, which would pass these to Triton (a plain-text 404)
        app.router.add_route("*", "/v1", self.unknown_route)
        app.router.add_route("*", "/v1/{tail:.*}", self.unknown_route)
        app.on_cleanup.append(self._close)

    # -- the one error path ------------------------------------------------------------------------------
    async def _failed(self, request: web.Request, e: BaseException, doing: str) -> web.Response:
        """e as its client's error (errors.api_error). Counted among the edge's refusals unless the
        model saw the request (Triton's counters or the model's count those): its own errors, and
        whatever befalls a request after its first response (respond.py). A client whose body stalled (408)
        has its connection closed, as the edge does."""
        err = api_error(e, doing)
        if isinstance(err, ModelError):
            return error_response(err)
        refusals = getattr(self.edge, "refusals", None)
        if refusals is not None:
            refusals.count("openai", err.status, err.code)
        resp = error_response(err)
        return await close_after(request, resp) if err.status == 408 else resp

    async def _close(self, app) -> None:
        if self.client is not None:
            await self.client.close()

    def _grpc(self):
        if self.client is None:
            import tritonclient.grpc.aio as grpcaio
            self.client = grpcaio.InferenceServerClient(self.grpc_url, channel_args=triton_channel_args())
        return self.client

    async def _ready(self) -> None:
        if not await self.edge.model_config(ENGINE_MODEL):
            raise ApiError(503, "the model is not ready; retry later", code="model_not_ready")

    def _checkpoint(self) -> Path:
        return self.served.resolve(self.served.checkpoint, ROOT)

    def _chat_template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate(self._checkpoint())
        return self._template

    def _token_pieces(self) -> TokenPieces:
        if self._pieces is None:
            self._pieces = TokenPieces(self._checkpoint())
        return self._pieces

    async def _read(self, request: web.Request):
        try:
            return await self.edge.read_json(request)
        except EdgeError as e:
            raise ApiError(e.status, e.message, e.param) from None

    def _check_model(self, name: str) -> None:
        if name != ENGINE_MODEL:
            raise ApiError(404, f"The model '{name}' does not exist (this server serves '{ENGINE_MODEL}')",
                           "model", "model_not_found")

    # -- routes ------------------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        try:
            await self._ready()
        except ApiError as e:
            return await self._failed(request, e, "")
        return web.json_response({"object": "list", "data": [MODEL_OBJECT]})

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{id}: the model object (the SDK's client.models.retrieve)."""
        try:
            self._check_model(request.match_info["model"])
            await self._ready()
        except ApiError as e:
            return await self._failed(request, e, "")
        return web.json_response(MODEL_OBJECT)

    async def unknown_route(self, request: web.Request) -> web.Response:
        allowed = ROUTES.get(request.path) or ("GET" if request.path.startswith("/v1/models/") else None)
        if allowed is not None and request.method not in (allowed, "HEAD"):  # a route of ours, another method
            e = ApiError(405, f"Method {request.method} is not allowed on {request.path} (use {allowed})",
                         code="method_not_allowed")
        else:
            e = ApiError(404, f"Invalid URL ({request.method} {request.path}): this server serves "
                              f"{', '.join(f'{m} {r}' for r, m in ROUTES.items())} and GET /v1/models/{{model}}",
                         code="unknown_url")
        return await self._failed(request, e, "")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            req = parse_chat(await self._read(request))
        except ApiError as e:
            return await self._failed(request, e, "")
        try:
            self._check_model(req.model)
            resolve_lengths(req, self.served)
            prompt = self._chat_template().render(req.messages)
        except Exception as e:  # noqa: BLE001 - the one error path
            return await self._failed(request, e, "rendering the chat template")
        return await self._run(request, req, prompt)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            req = parse_completion(await self._read(request))
            self._check_model(req.model)
            resolve_lengths(req, self.served)  # max_tokens is always set (16)
        except ApiError as e:
            return await self._failed(request, e, "")
        return await self._run(request, req, req.prompt)

    # -- running requests --------------------------------------------------------------------------------
    async def _run(self, request: web.Request, req: OpenAIRequest, prompt: str) -> web.StreamResponse:
        try:
            pieces = self._token_pieces() if req.logprobs else None
        except Exception as e:  # noqa: BLE001 - the one error path
            return await self._failed(request, e, "loading the tokenizer")
        reply = respond.Reply(req, prompt, pieces)
        events = self._events(prompt, req)
        try:  # closing the events cancels the requests if the client has gone
            try:
                first = await events.__anext__()
            except StopAsyncIteration:
                return await self._failed(request, ModelError(500, f"{ErrorKind.INTERNAL.prefix}: the model sent no "
                                                                   "response; see the server log"), "")
            except Exception as e:  # noqa: BLE001 - the one error path
                return await self._failed(request, e, respond.RUNNING)
            if req.stream:
                return await respond.streamed(request, reply, events, first)
            return await respond.whole(reply, events, first)
        finally:
            await events.aclose()

    def _inputs(self, prompt: str, req: OpenAIRequest, index: int) -> list:
        from tritonclient.grpc import InferInput

        def t(name, value, dtype, np_type):
            x = InferInput(name, [1, 1], dtype)
            x.set_data_from_numpy(np.array([[value]], dtype=np_type))
            return x
        ins = [t("text_input", prompt.encode(), "BYTES", object), t("stream", True, "BOOL", bool),
               t("temperature", req.temperature, "FP32", np.float32)]
        if req.max_tokens is not None:  # parse_* checked it fits INT32
            ins.append(t("max_tokens", req.max_tokens, "INT32", np.int32))
        if req.top_p is not None:
            ins.append(t("top_p", req.top_p, "FP32", np.float32))
        if req.seed is not None:
            ins.append(t("random_seed", req.seed + index, "UINT64", np.uint64))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name):
                ins.append(t(name, getattr(req, name), "FP32", np.float32))
        if req.min_length:
            ins.append(t("min_length", req.min_length, "INT32", np.int32))
        if req.logprobs:
            ins.append(t("return_log_probs", True, "BOOL", bool))
            if req.top_logprobs:
                ins.append(t("return_top_log_probs", req.top_logprobs, "INT32", np.int32))
        if req.guide:
            ins.append(t("guided_decoding_guide_type", req.guide[0].encode(), "BYTES", object))
            ins.append(t("guided_decoding_guide", req.guide[1].encode(), "BYTES", object))
        if req.stop:
            x = InferInput("stop_words", [1, len(req.stop)], "BYTES")
            x.set_data_from_numpy(np.array([[s.encode() for s in req.stop]], dtype=object))
            ins.append(x)
        return ins

    async def _events(self, prompt: str, req: OpenAIRequest):
        """n requests on one gRPC stream -> async iterator of (index, text, finish_reason or None,
        num_input_tokens, num_output_tokens, log probs: {ids, lps, top_ids, top_lps} of this
        response's tokens when req.logprobs, else None); ModelError on any request's error,
        UpstreamGone when Triton cannot be reached or dies. Leaving early (a client gone) cancels the
        stream, which cancels the requests."""
        import grpc

        requests = [{"model_name": ENGINE_MODEL, "inputs": self._inputs(prompt, req, i), "request_id": str(i)}
                    for i in range(req.n)]

        async def send():
            for r in requests:
                yield r

        started = False
        stream = self._grpc().stream_infer(send())
        try:
            async for result, error in stream:
                if error is not None:
                    raise model_error(error.message(), req.field_of)
                index = int(result.get_response().id)
                out = result.as_numpy("text_output")
                text = out.reshape(-1)[0].decode("utf-8", "replace") if out is not None else ""
                fr = result.as_numpy("finish_reason")
                finish = fr.reshape(-1)[0].decode() if fr is not None else None
                nin, nout = (int(result.as_numpy(k).reshape(-1)[0]) if result.as_numpy(k) is not None else 0
                             for k in ("num_input_tokens", "num_output_tokens"))
                started = True
                yield index, text, finish, nin, nout, of_response(result) if req.logprobs else None
        except grpc.RpcError as e:  # the connection, not the model (its errors are messages above)
            log.warning("Triton's gRPC stream failed: %s", e)
            raise UpstreamGone(started) from None
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - before any response: Triton is not reachable (retry later)
            if started:
                raise
            log.error("OpenAI request failed", exc_info=e)
            raise UpstreamGone(False) from None
        finally:
            stream.cancel()
