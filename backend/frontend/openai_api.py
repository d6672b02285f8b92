"""An OpenAI-compatible API on the HTTP edge: /v1/chat/completions, /v1/completions, /v1/models.

Mounted by backend/frontend/edge.py on the edge's port (8000); it speaks to Triton's `llm` model over
gRPC streaming with tritonclient's asyncio client, so every OpenAI request joins the same
continuously batched engine loop as the Triton protocols. A chat request's messages are
rendered with the served checkpoint's own chat template (`chat_template.jinja` or
`tokenizer_config.json`, read from the model's `checkpoint` parameter) and sent as the prompt.

Supported: `messages` (system / developer / user / assistant; text content or text parts),
`prompt` (a string, or a list of one), `max_tokens` / `max_completion_tokens`, `temperature`
(default 1, as OpenAI), `top_p`, `presence_penalty` / `frequency_penalty` (-2..2), `seed`, `stop`, `n` (up to MAX_N: n requests in one batch,
seeds seed, seed+1, ... when a seed is given), `stream` with `stream_options.include_usage`,
`echo` (completions), `usage`, vLLM's `min_tokens` and `ignore_eos` (the engine's min_length),
`response_format` (chat: json_object, json_schema; the engine's guided decoding, backend/generation/guided.py),
`logprobs` (chat: true / false with `top_logprobs` 0..20;
completions: 0..5) in OpenAI's shapes, streaming or not: the log prob of each generated token under
the distribution it was sampled from and its most likely alternatives (the engine's
`return_log_probs` / `return_top_log_probs`), token strings by decoding each id alone. Anything else
is refused with an OpenAI-shaped error naming it (`logit_bias`, `tools`, ... are not served yet:
refused rather than ignored, so a client never gets output that silently disregards a setting).
Every error is OpenAI-shaped ({"error": {message, type, param, code}}), unknown /v1 routes and what the
edge refuses on /v1 (oversized headers, a body that does not match its Content-Encoding, a media type
other than application/json: backend/frontend/body_format.py) included; a stream Triton stops sending
ends with an error chunk and `data: [DONE]`. Those refused here, before Triton, are counted in the
edge's refusals (backend/frontend/metrics.py).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Optional

import numpy as np
from aiohttp import web

from .edge import STREAM_BROKEN
from .http_body import EdgeError, close_after, lone_surrogate, surrogate_message
from ..server_config import ServerConfig
from ..wire import ErrorKind, error_kind

log = logging.getLogger("specserve.openai")
ROOT = Path(__file__).resolve().parents[2]
MAX_N = 8
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5  # OpenAI's limits (chat top_logprobs, completions logprobs)
ENGINE_MODEL = "llm"  # the Triton model every OpenAI request runs on

COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
          "user", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
          "min_tokens", "ignore_eos"}  # vLLM's extensions (genai-perf's fixed output length sends them)
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                        "tool_choice", "parallel_tool_calls", "metadata", "store", "service_tier"}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
# accepted only at the value that changes nothing (OpenAI's default)
NEUTRAL = {"logit_bias": (None, {}), "tools": (None, []),
           "tool_choice": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
           "metadata": (None, {}), "store": (None, False), "service_tier": (None, "auto", "default"),
           "best_of": (None, 1), "suffix": (None, "")}
ROLES = {"system", "developer", "user", "assistant"}
# The routes of this API and their methods: another method answers 405, another /v1 path 404.
ROUTES = {"/v1/models": "GET", "/v1/chat/completions": "POST", "/v1/completions": "POST"}
MODEL_OBJECT = {"id": ENGINE_MODEL, "object": "model", "created": 0, "owned_by": "specserve"}


class UpstreamGone(Exception):
    """Triton's gRPC connection failed or broke (Triton is down or died): no model error, no message."""


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = next((k for k in ErrorKind if k.http_status == self.status), ErrorKind.INVALID if self.status < 500
                    else ErrorKind.INTERNAL)
        return {"error": {"message": self.message, "type": kind.openai_type, "param": self.param, "code": self.code}}


def error_response(e: ApiError) -> web.Response:
    headers = {"Retry-After": "1"} if e.status == 503 else {}
    return web.json_response(e.body(), status=e.status, headers=headers)


def model_error(message: str, p: Optional[dict] = None) -> ApiError:
    """An error Triton or the model sent, with the HTTP status of its kind, and the OpenAI field it
    is about (`param`) when the message names an engine input this request set from one."""
    message = message.split("] ", 1)[1] if message.startswith("[request id:") else message
    kind = error_kind(message)
    first = message.split(" ", 1)[0]
    param = (p or {}).get("fields", {}).get(first) if kind is ErrorKind.INVALID else None
    return ApiError(kind.http_status, message, param, code="server_overloaded" if kind.retry else None)


# -- request parsing ---------------------------------------------------------------------------------
def _number(body, name, lo, hi):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, f"{name} must be a number, got {json.dumps(v)[:40]}", name)
    if not lo <= v <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}, got {v}", name)
    return float(v)


def _integer(body, name, lo, hi):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name} must be an integer, got {json.dumps(v)[:40]}", name)
    if not lo <= v <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}, got {v}", name)
    return v


def parse_common(body, allowed: set) -> dict:
    """The sampling fields both endpoints share -> {max_tokens, temperature, top_p, seed, stop, n,
    stream, include_usage}; ApiError(400) naming the first bad or unsupported field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    where = lone_surrogate(body)  # (the edge's parse_json finds them in raw bodies first)
    if where is not None:
        raise ApiError(400, surrogate_message(where), where)
    for name in body:
        if name not in allowed:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", name)
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise ApiError(400, f"{name} is not supported by this server (only {json.dumps(neutral[1])})", name)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ApiError(400, "model is required: a string (GET /v1/models lists them)", "model")
    p = {"model": body["model"], "temperature": _number(body, "temperature", 0.0, 2.0), "top_p": _number(body, "top_p", 0.0, 1.0),
         "seed": _integer(body, "seed", 0, 2**64 - 1 - MAX_N), "n": _integer(body, "n", 1, MAX_N) or 1}
    p["temperature"] = 1.0 if p["temperature"] is None else p["temperature"]
    # TensorRT-LLM's presence / frequency penalties (backend/generation/logits_processors.py: prompt tokens count too)
    p["presence_penalty"] = _number(body, "presence_penalty", -2.0, 2.0)
    p["frequency_penalty"] = _number(body, "frequency_penalty", -2.0, 2.0)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a non-empty string or a list of them", "stop")
    p["stop"] = stop
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "stream")
    p["stream"] = bool(stream)
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage"} or not isinstance(opts.get("include_usage", False), bool):
            raise ApiError(400, "stream_options may only hold include_usage (true or false)", "stream_options")
        if not p["stream"]:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
    p["include_usage"] = bool((opts or {}).get("include_usage"))
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, "user must be a string", "user")
    # vLLM's: min_tokens masks the end tokens until that many were generated (the engine's min_length);
    # ignore_eos generates exactly max_tokens (resolve_lengths)
    p["min_tokens"] = _integer(body, "min_tokens", 0, 2**31 - 1) or 0
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise ApiError(400, f"ignore_eos must be true or false, got {json.dumps(ignore_eos)[:40]}", "ignore_eos")
    p["ignore_eos"] = bool(ignore_eos)
    # engine input -> the OpenAI field it came from, to name it in the model's errors (model_error)
    p["fields"] = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                   "random_seed": "seed", "stop_words": "stop", "presence_penalty": "presence_penalty",
                   "frequency_penalty": "frequency_penalty", "min_length": "min_tokens",
                   "guided_decoding_guide_type": "response_format", "guided_decoding_guide": "response_format"}
    p["guide"] = parse_response_format(body.get("response_format"))
    return p


def parse_response_format(fmt) -> Optional[tuple]:
    """OpenAI's response_format -> (guided_decoding_guide_type, guided_decoding_guide) for the engine,
    or None for text. json_object is any JSON object; json_schema's schema is enforced (whatever its
    `strict`: structured output is always exact here)."""
    from ..generation.guided import Guide, guide_problem

    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise ApiError(400, "response_format must be an object with a type (text, json_object or json_schema)",
                       "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        guide = Guide("json_schema", json.dumps({"type": "object"}))
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(400, "response_format.json_schema must be an object holding the schema (an object) "
                           "under `schema`", "response_format")
        extra = set(spec) - {"name", "description", "schema", "strict"}
        if extra:
            raise ApiError(400, f"response_format.json_schema.{sorted(extra)[0]} is not a field of json_schema",
                           "response_format")
        guide = Guide("json_schema", json.dumps(spec["schema"]))
    else:
        raise ApiError(400, f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                       "response_format")
    problem = guide_problem(guide)
    if problem:
        raise ApiError(400, f"response_format: {problem}", "response_format")
    return guide.type, guide.text


def resolve_lengths(p: dict, served: ServerConfig) -> None:
    """-> p["min_length"], the engine's: min_tokens, or with ignore_eos max_tokens itself. ignore_eos
    is exact this way: the end tokens are masked for every token, so exactly max_tokens are
    generated (unless a stop string ends it, as in vLLM); an end_id "that never occurs" does not
    exist under sampling. Unlike vLLM, an end token is never emitted mid-output. A request without
    max_tokens gets the server's default here (ServerConfig.max_new_tokens, the one place it applies,
    from the launcher's record), so min_tokens can be checked against it."""
    if (p["min_tokens"] or p["ignore_eos"]) and p["max_tokens"] is None:
        p["max_tokens"] = served.max_new_tokens(None)
    p["min_length"] = p["max_tokens"] if p["ignore_eos"] else p["min_tokens"]
    if p["min_tokens"] > (p["max_tokens"] or 0):
        raise ApiError(400, f"min_tokens {p['min_tokens']} exceeds max_tokens {p['max_tokens']}"
                            + ("" if p["max_tokens_sent"] else " (the server's default: send max_tokens)"),
                       "min_tokens")


def parse_chat(body) -> tuple:
    """-> (params, messages as [{role, content: str}])."""
    p = parse_common(body, CHAT_FIELDS)
    mct = _integer(body, "max_completion_tokens", 1, 2**31 - 1)
    mt = _integer(body, "max_tokens", 1, 2**31 - 1)  # checked even when max_completion_tokens wins
    p["max_tokens"] = mct if mct is not None else mt
    p["max_tokens_sent"] = p["max_tokens"] is not None
    p["fields"].update(max_tokens="max_completion_tokens" if mct is not None else "max_tokens",
                       prompt="messages", text_input="messages")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise ApiError(400, f"logprobs must be true or false, got {json.dumps(logprobs)[:40]}", "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:  # 0 changes nothing (accepted, as before logprobs were served)
        raise ApiError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
    p["logprobs"], p["top_logprobs"] = bool(logprobs), top or 0
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"{where} must be an object with a role of {', '.join(sorted(ROLES))}", where)
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise ApiError(400, f"{where}.{sorted(extra)[0]} is not supported by this server", where)
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise ApiError(400, f"{where}.name must be a string, got {json.dumps(m['name'])[:40]}", f"{where}.name")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"{where}.content[{j}]: only text parts are supported", where)
                if set(part) - {"type", "text"}:  # nothing in a part is ignored either
                    raise ApiError(400, f"{where}.content[{j}].{sorted(set(part) - {'type', 'text'})[0]} is not "
                                        "supported by this server", f"{where}.content[{j}]")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(400, f"{where}.content must be a string or a list of text parts", where)
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return p, out


def parse_completion(body) -> tuple:
    """-> (params, prompt, echo)."""
    p = parse_common(body, COMPLETION_FIELDS)
    mt = _integer(body, "max_tokens", 1, 2**31 - 1)
    p["max_tokens"] = 16 if mt is None else mt  # OpenAI's default for completions
    p["max_tokens_sent"] = True  # 16 is the API's own default, not the server's
    p["fields"].update(prompt="prompt", text_input="prompt")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string (token-id and batched prompts are not supported)",
                       "prompt")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise ApiError(400, "echo must be true or false", "echo")
    top = _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    if top is not None and echo:
        raise ApiError(400, "logprobs with echo (the prompt's log probs) is not supported", "logprobs")
    p["logprobs"], p["top_logprobs"] = top is not None, top or 0
    return p, prompt, bool(echo)


class ChatTemplate:
    """The checkpoint's chat template, rendered as transformers does (sandboxed jinja2)."""

    def __init__(self, checkpoint: Path):
        cfg_path = checkpoint / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        source = (checkpoint / "chat_template.jinja").read_text() if (checkpoint / "chat_template.jinja").exists() \
            else cfg.get("chat_template")
        if not source:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ApiError(400, f"the chat template refused these messages: {message}", "messages")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        self.template = env.from_string(source)
        self.tokens = {k: cfg.get(k) if isinstance(cfg.get(k), str) else "" for k in ("bos_token", "eos_token")}

    def render(self, messages: list) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True, **self.tokens)


def _byte_decoder() -> dict:
    """GPT-2's byte-level BPE alphabet: character -> the byte it stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenPieces:
    """Token id -> (its text decoded alone, its bytes): the raw bytes for a byte-level BPE tokenizer
    (a token holding part of a UTF-8 character decodes to U+FFFD alone; its bytes join with the
    next token's), else the text's UTF-8."""

    def __init__(self, checkpoint: Path):
        path = checkpoint / "tokenizer.json"
        if path.exists():
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(str(path))
            spec = json.loads(path.read_text()).get("decoder") or {}
            kinds = {spec.get("type")} | {d.get("type") for d in spec.get("decoders") or []}
            self.bytes_of = _byte_decoder() if "ByteLevel" in kinds else None
        else:
            from transformers import AutoTokenizer
            self.tok, self.bytes_of = AutoTokenizer.from_pretrained(str(checkpoint)), None
        self.cache: dict = {}

    def __call__(self, token_id: int) -> tuple:
        piece = self.cache.get(token_id)
        if piece is None:
            text = self.tok.decode([token_id], skip_special_tokens=False)
            raw = list(text.encode("utf-8"))
            if self.bytes_of is not None and hasattr(self.tok, "id_to_token"):
                name = self.tok.id_to_token(token_id) or ""
                if name and all(c in self.bytes_of for c in name):
                    raw = [self.bytes_of[c] for c in name]
            piece = self.cache[token_id] = (text, raw)
        return piece


def chat_logprobs(pieces: TokenPieces, lp: dict) -> dict:
    """Token ids / log probs / alternatives -> a chat choice's `logprobs` ({content, refusal})."""
    content = []
    for j, (token, value) in enumerate(zip(lp["ids"], lp["lps"])):
        text, raw = pieces(token)
        top = [{"token": pieces(t)[0], "logprob": v, "bytes": pieces(t)[1]}
               for t, v in zip(lp["top_ids"][j], lp["top_lps"][j])] if lp["top_ids"] else []
        content.append({"token": text, "logprob": value, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(pieces: TokenPieces, lp: dict, offset: int) -> tuple:
    """-> (a completion choice's `logprobs` {tokens, token_logprobs, top_logprobs, text_offset}, the
    offset after its tokens). top_logprobs: the alternatives and the sampled token (up to k + 1, as
    OpenAI); text_offset: where each token's text begins in the choice's text."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for j, (token, value) in enumerate(zip(lp["ids"], lp["lps"])):
        text = pieces(token)[0]
        top = {pieces(t)[0]: v for t, v in zip(lp["top_ids"][j], lp["top_lps"][j])} if lp["top_ids"] else {}
        top.setdefault(text, value)
        out["tokens"].append(text)
        out["token_logprobs"].append(value)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


# -- the API ------------------------------------------------------------------------------------------
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

    def _refused(self, e: ApiError) -> web.Response:
        """The error of a request refused here, before Triton: counted, since neither Triton's
        counters nor the model's see it."""
        refusals = getattr(self.edge, "refusals", None)
        if refusals is not None:
            refusals.count("openai", e.status, e.code)
        return error_response(e)

    async def _refuse_read(self, request: web.Request, e: ApiError) -> web.Response:
        """_refused, closing the connection of a client whose body stalled (408) as the edge does."""
        resp = self._refused(e)
        return await close_after(request, resp) if e.status == 408 else resp

    async def _close(self, app) -> None:
        if self.client is not None:
            await self.client.close()

    def _grpc(self):
        if self.client is None:
            import tritonclient.grpc.aio as grpcaio
            self.client = grpcaio.InferenceServerClient(self.grpc_url)
        return self.client

    async def _config(self) -> dict:
        config = await self.edge.model_config(ENGINE_MODEL)
        if not config:
            raise ApiError(503, "the model is not ready; retry later", code="model_not_ready")
        return config

    def _checkpoint(self) -> Path:
        return self.served.resolve(self.served.checkpoint, ROOT)

    async def _chat_template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate(self._checkpoint())
        return self._template

    async def _token_pieces(self) -> TokenPieces:
        if self._pieces is None:
            self._pieces = TokenPieces(self._checkpoint())
        return self._pieces

    async def _read(self, request: web.Request):
        try:
            return await self.edge.read_json(request)
        except EdgeError as e:
            raise ApiError(e.status, e.message, e.param) from None

    async def models(self, request: web.Request) -> web.Response:
        try:
            await self._config()
        except ApiError as e:
            return self._refused(e)
        return web.json_response({"object": "list", "data": [MODEL_OBJECT]})

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{id}: the model object (the SDK's client.models.retrieve)."""
        try:
            self._check_model(request.match_info["model"])
            await self._config()
        except ApiError as e:
            return self._refused(e)
        return web.json_response(MODEL_OBJECT)

    async def unknown_route(self, request: web.Request) -> web.Response:
        allowed = ROUTES.get(request.path) or ("GET" if request.path.startswith("/v1/models/") else None)
        if allowed is not None and request.method not in (allowed, "HEAD"):  # a route of ours, another method
            return self._refused(ApiError(405, f"Method {request.method} is not allowed on {request.path} "
                                               f"(use {allowed})", code="method_not_allowed"))
        return self._refused(ApiError(404, f"Invalid URL ({request.method} {request.path}): this server serves "
                                           f"{', '.join(f'{m} {r}' for r, m in ROUTES.items())} and GET "
                                           "/v1/models/{model}", code="unknown_url"))

    def _check_model(self, name: str) -> None:
        if name != ENGINE_MODEL:
            raise ApiError(404, f"The model '{name}' does not exist (this server serves '{ENGINE_MODEL}')",
                           "model", "model_not_found")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            p, messages = parse_chat(await self._read(request))
            self._check_model(p["model"])
            resolve_lengths(p, self.served)
        except ApiError as e:
            return await self._refuse_read(request, e)
        try:  # only the template's own failures are the template's
            prompt = (await self._chat_template()).render(messages)
        except ApiError as e:
            return self._refused(e)
        except Exception:
            log.exception("could not render the chat template")
            return self._refused(ApiError(500, f"{ErrorKind.INTERNAL.prefix} while rendering the chat template; see the server log"))
        return await self._run(request, p, prompt, chat=True, echo=False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            p, prompt, echo = parse_completion(await self._read(request))
            self._check_model(p["model"])
            resolve_lengths(p, self.served)  # max_tokens is always set (16)
        except ApiError as e:
            return await self._refuse_read(request, e)
        return await self._run(request, p, prompt, chat=False, echo=echo)

    # -- running requests ------------------------------------------------------------------------------
    def _inputs(self, prompt: str, p: dict, index: int) -> list:
        from tritonclient.grpc import InferInput

        def t(name, value, dtype, np_type):
            x = InferInput(name, [1, 1], dtype)
            x.set_data_from_numpy(np.array([[value]], dtype=np_type))
            return x
        ins = [t("text_input", prompt.encode(), "BYTES", object), t("stream", True, "BOOL", bool),
               t("temperature", p["temperature"], "FP32", np.float32)]
        if p["max_tokens"] is not None:  # parse_* checked it fits INT32
            ins.append(t("max_tokens", p["max_tokens"], "INT32", np.int32))
        if p["top_p"] is not None:
            ins.append(t("top_p", p["top_p"], "FP32", np.float32))
        if p["seed"] is not None:
            ins.append(t("random_seed", p["seed"] + index, "UINT64", np.uint64))
        for name in ("presence_penalty", "frequency_penalty"):
            if p.get(name):
                ins.append(t(name, p[name], "FP32", np.float32))
        if p.get("min_length"):
            ins.append(t("min_length", p["min_length"], "INT32", np.int32))
        if p.get("logprobs"):
            ins.append(t("return_log_probs", True, "BOOL", bool))
            if p["top_logprobs"]:
                ins.append(t("return_top_log_probs", p["top_logprobs"], "INT32", np.int32))
        if p.get("guide"):
            ins.append(t("guided_decoding_guide_type", p["guide"][0].encode(), "BYTES", object))
            ins.append(t("guided_decoding_guide", p["guide"][1].encode(), "BYTES", object))
        if p["stop"]:
            x = InferInput("stop_words", [1, len(p["stop"])], "BYTES")
            x.set_data_from_numpy(np.array([[s.encode() for s in p["stop"]]], dtype=object))
            ins.append(x)
        return ins

    async def _events(self, prompt: str, p: dict):
        """n requests on one gRPC stream -> async iterator of (index, text, finish_reason or None,
        num_input_tokens, num_output_tokens, log probs: {ids, lps, top_ids, top_lps} of this
        response's tokens when p["logprobs"], else None); ApiError on any request's error,
        UpstreamGone when Triton cannot be reached or dies. Leaving early (a client gone) cancels the
        stream, which cancels the requests."""
        import grpc

        requests = [{"model_name": ENGINE_MODEL, "inputs": self._inputs(prompt, p, i), "request_id": str(i)}
                    for i in range(p["n"])]

        async def send():
            for r in requests:
                yield r

        stream = self._grpc().stream_infer(send())
        try:
            async for result, error in stream:
                if error is not None:
                    raise model_error(error.message(), p)
                index = int(result.get_response().id)
                out = result.as_numpy("text_output")
                text = out.reshape(-1)[0].decode("utf-8", "replace") if out is not None else ""
                fr = result.as_numpy("finish_reason")
                finish = fr.reshape(-1)[0].decode() if fr is not None else None
                nin, nout = (int(result.as_numpy(k).reshape(-1)[0]) if result.as_numpy(k) is not None else 0
                             for k in ("num_input_tokens", "num_output_tokens"))
                yield index, text, finish, nin, nout, _logprobs(result) if p.get("logprobs") else None
        except grpc.RpcError as e:  # the connection, not the model (its errors are messages above)
            log.warning("Triton's gRPC stream failed: %s", e)
            raise UpstreamGone() from None
        finally:
            stream.cancel()

    async def _run(self, request, p, prompt, chat: bool, echo: bool) -> web.StreamResponse:
        events = self._events(prompt, p)
        try:  # closing the events cancels the requests if the client has gone
            return await self._respond(request, events, p, prompt, chat, echo)
        finally:
            await events.aclose()

    async def _respond(self, request, events, p, prompt, chat: bool, echo: bool) -> web.StreamResponse:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created, model = int(time.time()), p["model"]
        obj = "chat.completion" if chat else "text_completion"
        try:
            pieces = await self._token_pieces() if p.get("logprobs") else None
        except ApiError as e:
            return self._refused(e)
        except Exception:
            log.exception("could not load the tokenizer for logprobs")
            return self._refused(ApiError(500, f"{ErrorKind.INTERNAL.prefix} while loading the tokenizer; see the server log"))
        try:
            first = await events.__anext__()
        except ApiError as e:
            return error_response(e)
        except StopAsyncIteration:
            return error_response(ApiError(500, f"{ErrorKind.INTERNAL.prefix}: the model sent no response; see the server log"))
        except UpstreamGone:
            return self._refused(ApiError(503, "the inference server is not reachable; retry later"))
        except Exception:
            log.exception("OpenAI request failed")
            return self._refused(ApiError(503, "the inference server is not reachable; retry later"))
        if p["stream"]:
            return await self._stream(request, events, first, p, prompt, rid, created, obj, model, chat, echo, pieces)
        texts, finish, usage_in, usage_out = [[] for _ in range(p["n"])], [None] * p["n"], 0, [0] * p["n"]
        lps = [{"ids": [], "lps": [], "top_ids": [], "top_lps": []} for _ in range(p["n"])]
        if echo:
            for t in texts:
                t.append(prompt)
        try:
            ev = first
            while True:
                i, text, fin, nin, nout, lp = ev
                texts[i].append(text)
                usage_in = max(usage_in, nin)
                usage_out[i] = max(usage_out[i], nout)
                finish[i] = fin or finish[i]
                if lp is not None:
                    for k, v in lp.items():
                        lps[i][k].extend(v)
                try:
                    ev = await events.__anext__()
                except StopAsyncIteration:
                    break
        except ApiError as e:
            return error_response(e)
        except UpstreamGone:
            return error_response(ApiError(500, STREAM_BROKEN))
        except Exception:
            log.exception("OpenAI request failed")
            return error_response(ApiError(500, f"{ErrorKind.INTERNAL.prefix} while running this request; see the server log"))
        choices = []
        for i in range(p["n"]):
            text = "".join(texts[i])
            reason = finish[i] if finish[i] in ("stop", "length") else "stop"
            if chat:
                logprobs = chat_logprobs(pieces, lps[i]) if pieces else None
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "logprobs": logprobs, "finish_reason": reason})
            else:
                logprobs = completion_logprobs(pieces, lps[i], 0)[0] if pieces else None
                choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason})
        return web.json_response({"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
                                  "usage": usage(usage_in, sum(usage_out))})

    async def _stream(self, request, events, first, p, prompt, rid, created, obj, model, chat, echo, pieces):
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj += ".chunk" if chat else ""
        offsets = [0] * p["n"]  # completions' text_offset: characters of the choice's tokens so far

        async def send(payload):
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        def chunk(i, text=None, reason=None, role=False, lp=None):
            logprobs = None
            if lp is not None and chat:
                logprobs = chat_logprobs(pieces, lp)
            elif lp is not None:
                logprobs, offsets[i] = completion_logprobs(pieces, lp, offsets[i])
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text or lp else {})
                choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            else:
                choice = {"index": i, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
            return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

        for i in range(p["n"]):
            if chat:
                await send(chunk(i, role=True))
            elif echo:
                await send(chunk(i, prompt))
        usage_in, usage_out = 0, [0] * p["n"]
        ev = first
        try:
            while True:
                i, text, fin, nin, nout, lp = ev
                usage_in, usage_out[i] = max(usage_in, nin), max(usage_out[i], nout)
                lp = lp if lp is not None and lp["ids"] else None
                if text or lp:
                    await send(chunk(i, text, lp=lp))
                if fin:
                    await send(chunk(i, reason=fin if fin in ("stop", "length") else "stop"))
                try:
                    ev = await events.__anext__()
                except StopAsyncIteration:
                    break
        except Exception as e:  # after the 200: the error as an event, as OpenAI does
            if isinstance(e, UpstreamGone):  # Triton died: the client learns it did not finish
                e = ApiError(500, STREAM_BROKEN)
            elif not isinstance(e, ApiError):
                log.exception("OpenAI stream failed")
                e = ApiError(500, f"{ErrorKind.INTERNAL.prefix} while running this request; see the server log")
            await send(e.body())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if p["include_usage"]:
            await send({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": usage(usage_in, sum(usage_out))})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _logprobs(result) -> dict:
    """A response's output_token_ids / output_log_probs / output_top_* as {ids, lps, top_ids, top_lps}
    (top_*: one list of k per token, or [] without alternatives)."""
    values = result.as_numpy
    ids, lps = values("output_token_ids"), values("output_log_probs")
    ids = [] if ids is None else ids.reshape(-1).tolist()
    lps = [] if lps is None else lps.reshape(-1).tolist()
    top_ids, top_lps = values("output_top_token_ids"), values("output_top_log_probs")
    if top_ids is None or top_lps is None or not ids or top_ids.size == 0:
        return {"ids": ids, "lps": lps, "top_ids": [], "top_lps": []}
    return {"ids": ids, "lps": lps, "top_ids": top_ids.reshape(len(ids), -1).tolist(),
            "top_lps": top_lps.reshape(len(ids), -1).tolist()}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
