"""The one client of the peer benchmark (bench/bench_peer.py), the same for our server and
llama-server: OpenAI `/v1/chat/completions`, streaming, greedy, closed loop.

aiohttp with a fresh connection per request (force_close): against llama-server, keep-alive
connections get about half the requests failed ("Can not write request body", "Server
disconnected"; ../shared/design/ENVIRONMENT.md), so neither server gets them."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Callable, List, Optional, Tuple

import aiohttp

from peer_stats import Request  # bench/ (the script's own folder)
from peer_workloads import Feed

TIMEOUT_S = 600


async def chat(http: aiohttp.ClientSession, base_url: str, key: str, messages: list, max_tokens: int,
               extra: Optional[dict] = None) -> Request:
    """One streamed chat completion at temperature 0: when its content began and ended, its
    output tokens (the final usage chunk; content chunks where a server sends no usage) and text.
    `extra`: more body fields (response_format). A failure is a Request with its error, never an
    exception."""
    body = {"model": "llm", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    start = time.perf_counter()
    first = last = None
    parts, chunks, usage = [], 0, None
    try:
        async with http.post(f"{base_url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return Request(key, start, None, None, 0, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        last = time.perf_counter()
                        first = first or last
                        parts.append(text)
                        chunks += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        return Request(key, start, first, last, 0, "".join(parts), error=f"{type(e).__name__}: {e}"[:200])
    tokens = int(usage["completion_tokens"]) if usage and "completion_tokens" in usage else chunks
    return Request(key, start, first, last, tokens, "".join(parts))


# a request's key -> more body fields for it (bench/bench_structured.py: its response_format)
ExtraFn = Callable[[str], Optional[dict]]


async def _stream(http, base_url: str, feed: Feed, stop_at: float, max_tokens: int, out: List[Request],
                  extra: Optional[ExtraFn] = None) -> None:
    """One closed-loop stream: the next turn as soon as the last answer is in, until stop_at; a
    conversation that fails is abandoned (its next turn would resend a history it never got)."""
    while time.perf_counter() < stop_at:
        session = feed.next()
        while time.perf_counter() < stop_at:
            turn = session.next_request()
            if turn is None:
                break
            r = await chat(http, base_url, *turn, max_tokens, extra(turn[0]) if extra else None)
            out.append(r)
            if not r.ok:
                await asyncio.sleep(0.1)  # a server that refuses everything is not spun against
                break
            session.answered(r.text)


async def _closed_loop(base_url: str, feed: Feed, streams: int, ramp_s: float, seconds: float,
                       max_tokens: int, extra: Optional[ExtraFn] = None) -> Tuple[List[Request], float, float]:
    out: List[Request] = []
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        t0 = time.perf_counter()
        w0, w1 = t0 + ramp_s, t0 + ramp_s + seconds
        await asyncio.gather(*(_stream(http, base_url, feed, w1, max_tokens, out, extra) for _ in range(streams)))
    return out, w0, w1


def closed_loop(base_url: str, feed: Feed, streams: int, ramp_s: float, seconds: float,
                max_tokens: int, extra: Optional[ExtraFn] = None) -> Tuple[List[Request], float, float]:
    """`streams` closed-loop streams for ramp_s + seconds (new requests start until then; those in
    flight finish). Returns every request and the measured window [w0, w1] (after the ramp)."""
    return asyncio.run(_closed_loop(base_url, feed, streams, ramp_s, seconds, max_tokens, extra))


def warm_up(base_url: str) -> Request:
    """One short request, so neither server's first-request costs land in a measured level."""
    async def one():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
            return await chat(http, base_url, "warm-up", [{"role": "user", "content": "Hello"}], 8)
    return asyncio.run(one())
