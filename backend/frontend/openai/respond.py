"""An OpenAI request's answer from its responses' events: whole (one JSON body, n choices) or
streamed (server-sent events, an error after the 200 as an error chunk, as OpenAI does)."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from aiohttp import web

from .errors import api_error, error_response
from .logprobs import TokenPieces, chat_logprobs, completion_logprobs
from .parse import OpenAIRequest

RUNNING = "running this request"


@dataclass
class Reply:
    """What every piece of one request's answer carries."""
    req: OpenAIRequest
    prompt: str
    pieces: Optional[TokenPieces]  # token texts, when log probs are asked for
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or ("chatcmpl-" if self.req.chat else "cmpl-") + uuid.uuid4().hex

    @property
    def object(self) -> str:
        return "chat.completion" if self.req.chat else "text_completion"

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _finish(reason: Optional[str]) -> str:
    return reason if reason in ("stop", "length") else "stop"


async def whole(reply: Reply, events, first) -> web.Response:
    """Every event to its end -> one body with n choices (an error on the way: its error body)."""
    n, pieces = reply.req.n, reply.pieces
    texts, finish, usage_in, usage_out = [[] for _ in range(n)], [None] * n, 0, [0] * n
    lps = [{"ids": [], "lps": [], "top_ids": [], "top_lps": []} for _ in range(n)]
    if reply.req.echo:
        for t in texts:
            t.append(reply.prompt)
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
    except Exception as e:  # noqa: BLE001 - the one error path (errors.api_error)
        return error_response(api_error(e, RUNNING))
    choices = []
    for i in range(n):
        text = "".join(texts[i])
        if reply.req.chat:
            logprobs = chat_logprobs(pieces, lps[i]) if pieces else None
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "logprobs": logprobs, "finish_reason": _finish(finish[i])})
        else:
            logprobs = completion_logprobs(pieces, lps[i], 0)[0] if pieces else None
            choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": _finish(finish[i])})
    return web.json_response({**reply.head(reply.object), "choices": choices, "usage": usage(usage_in, sum(usage_out))})


async def streamed(http_request: web.Request, reply: Reply, events, first) -> web.StreamResponse:
    """Every event as a chunk as it comes; the usage chunk when asked for; `data: [DONE]`."""
    req, pieces = reply.req, reply.pieces
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(http_request)
    obj = reply.object + (".chunk" if req.chat else "")
    offsets = [0] * req.n  # completions' text_offset: characters of the choice's tokens so far

    async def send(payload):
        await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def chunk(i, text=None, reason=None, role=False, lp=None):
        logprobs = None
        if lp is not None and req.chat:
            logprobs = chat_logprobs(pieces, lp)
        elif lp is not None:
            logprobs, offsets[i] = completion_logprobs(pieces, lp, offsets[i])
        if req.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text or lp else {})
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": i, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        return {**reply.head(obj), "choices": [choice]}

    for i in range(req.n):
        if req.chat:
            await send(chunk(i, role=True))
        elif req.echo:
            await send(chunk(i, reply.prompt))
    usage_in, usage_out = 0, [0] * req.n
    ev = first
    try:
        while True:
            i, text, fin, nin, nout, lp = ev
            usage_in, usage_out[i] = max(usage_in, nin), max(usage_out[i], nout)
            lp = lp if lp is not None and lp["ids"] else None
            if text or lp:
                await send(chunk(i, text, lp=lp))
            if fin:
                await send(chunk(i, reason=_finish(fin)))
            try:
                ev = await events.__anext__()
            except StopAsyncIteration:
                break
    except Exception as e:  # noqa: BLE001 - after the 200: the error as an event, as OpenAI does
        await send(api_error(e, RUNNING).body())
        await resp.write(b"data: [DONE]\n\n")
        return resp
    if req.include_usage:
        await send({**reply.head(obj), "choices": [], "usage": usage(usage_in, sum(usage_out))})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
