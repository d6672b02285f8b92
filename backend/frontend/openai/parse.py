"""An OpenAI request body -> a typed OpenAIRequest, or ApiError(400) naming the first bad or
unsupported field. Pure: no I/O, no server state (the default length comes in as the served config)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import ApiError
from ..http_body import lone_surrogate, surrogate_message
from ...server_config import ServerConfig

MAX_N = 8
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5  # OpenAI's limits (chat top_logprobs, completions logprobs)
MAX_INT32 = 2**31 - 1  # the engine's INT32 inputs (max_tokens, min_length)

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
# engine input -> the OpenAI field it came from, to name it in the model's errors (errors.model_error)
FIELDS = {"temperature": "temperature", "top_p": "top_p", "random_seed": "seed", "stop_words": "stop",
          "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
          "min_length": "min_tokens", "guided_decoding_guide_type": "response_format",
          "guided_decoding_guide": "response_format"}


@dataclass
class OpenAIRequest:
    """One chat or completion request, checked. `max_tokens` is None when a chat request sends no
    length (the model applies the server's default); `min_length` is the engine's (resolve_lengths)."""
    chat: bool
    model: str
    messages: List[dict] = field(default_factory=list)  # chat: [{role, content: str}]
    prompt: str = ""  # completions (a chat's is rendered from its messages)
    echo: bool = False
    max_tokens: Optional[int] = None
    max_tokens_field: str = "max_tokens"  # the OpenAI field it came from (max_completion_tokens wins)
    max_tokens_sent: bool = True  # False: the server's default (chat without a length)
    temperature: float = 1.0
    top_p: Optional[float] = None
    seed: Optional[int] = None
    n: int = 1
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    stop: List[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    min_tokens: int = 0
    ignore_eos: bool = False
    min_length: int = 0
    guide: Optional[Tuple[str, str]] = None  # (guided_decoding_guide_type, guided_decoding_guide)
    logprobs: bool = False
    top_logprobs: int = 0

    def field_of(self, engine_input: str) -> Optional[str]:
        """The OpenAI field an engine input was set from (None: not this request's)."""
        if engine_input == "max_tokens":
            return self.max_tokens_field
        if engine_input in ("prompt", "text_input"):
            return "messages" if self.chat else "prompt"
        return FIELDS.get(engine_input)


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


def _boolean(body, name) -> Optional[bool]:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise ApiError(400, f"{name} must be true or false, got {json.dumps(v)[:40]}", name)
    return v


def parse_common(body, allowed: set, chat: bool) -> OpenAIRequest:
    """The fields both endpoints share; ApiError(400) naming the first bad or unsupported field."""
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
    temperature = _number(body, "temperature", 0.0, 2.0)
    r = OpenAIRequest(chat=chat, model=body["model"], temperature=1.0 if temperature is None else temperature,
                      top_p=_number(body, "top_p", 0.0, 1.0), seed=_integer(body, "seed", 0, 2**64 - 1 - MAX_N),
                      n=_integer(body, "n", 1, MAX_N) or 1)
    # TensorRT-LLM's presence / frequency penalties (backend/generation/logits_processors.py: prompt tokens count too)
    r.presence_penalty = _number(body, "presence_penalty", -2.0, 2.0)
    r.frequency_penalty = _number(body, "frequency_penalty", -2.0, 2.0)
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a non-empty string or a list of them", "stop")
    r.stop = stop
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "stream")
    r.stream = bool(stream)
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage"} or not isinstance(opts.get("include_usage", False), bool):
            raise ApiError(400, "stream_options may only hold include_usage (true or false)", "stream_options")
        if not r.stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
    r.include_usage = bool((opts or {}).get("include_usage"))
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, "user must be a string", "user")
    # vLLM's: min_tokens masks the end tokens until that many were generated (the engine's min_length);
    # ignore_eos generates exactly max_tokens (resolve_lengths)
    r.min_tokens = _integer(body, "min_tokens", 0, MAX_INT32) or 0
    r.ignore_eos = bool(_boolean(body, "ignore_eos"))
    r.guide = parse_response_format(body.get("response_format"))
    return r


def parse_response_format(fmt) -> Optional[tuple]:
    """OpenAI's response_format -> (guided_decoding_guide_type, guided_decoding_guide) for the engine,
    or None for text. json_object is any JSON object; json_schema's schema is enforced (whatever its
    `strict`: structured output is always exact here)."""
    from ...generation.guided import Guide, guide_problem

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


def resolve_lengths(r: OpenAIRequest, served: ServerConfig) -> None:
    """-> r.min_length, the engine's: min_tokens, or with ignore_eos max_tokens itself. ignore_eos
    is exact this way: the end tokens are masked for every token, so exactly max_tokens are
    generated (unless a stop string ends it, as in vLLM); an end_id "that never occurs" does not
    exist under sampling. Unlike vLLM, an end token is never emitted mid-output. A request without
    max_tokens gets the server's default here (ServerConfig.max_new_tokens, the one place it applies,
    from the launcher's record), so min_tokens can be checked against it."""
    if (r.min_tokens or r.ignore_eos) and r.max_tokens is None:
        r.max_tokens = served.max_new_tokens(None)
    r.min_length = r.max_tokens if r.ignore_eos else r.min_tokens
    if r.min_tokens > (r.max_tokens or 0):
        raise ApiError(400, f"min_tokens {r.min_tokens} exceeds max_tokens {r.max_tokens}"
                            + ("" if r.max_tokens_sent else " (the server's default: send max_tokens)"), "min_tokens")


def _messages(messages) -> List[dict]:
    """A chat's messages -> [{role, content: str}] (developer is system; text parts joined)."""
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
    return out


def parse_chat(body) -> OpenAIRequest:
    r = parse_common(body, CHAT_FIELDS, chat=True)
    mct = _integer(body, "max_completion_tokens", 1, MAX_INT32)
    mt = _integer(body, "max_tokens", 1, MAX_INT32)  # checked even when max_completion_tokens wins
    r.max_tokens = mct if mct is not None else mt
    r.max_tokens_sent = r.max_tokens is not None
    r.max_tokens_field = "max_completion_tokens" if mct is not None else "max_tokens"
    logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:  # 0 changes nothing (accepted, as before logprobs were served)
        raise ApiError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
    r.logprobs, r.top_logprobs = bool(logprobs), top or 0
    r.messages = _messages(body.get("messages"))
    return r


def parse_completion(body) -> OpenAIRequest:
    r = parse_common(body, COMPLETION_FIELDS, chat=False)
    mt = _integer(body, "max_tokens", 1, MAX_INT32)
    r.max_tokens = 16 if mt is None else mt  # OpenAI's default for completions: the API's own, not the server's
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
    r.prompt, r.echo = prompt, bool(echo)
    r.logprobs, r.top_logprobs = top is not None, top or 0
    return r
