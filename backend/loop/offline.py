"""Drive an EngineLoop synchronously in-process (tests, benchmarks, profiling)."""
from __future__ import annotations

from typing import Dict, List

from policy import make_policy

from ..drafters import make_drafter
from .config import LoopConfig
from .engine_loop import EngineLoop
from ..generation.request import Limits

TRACE_LEN = 10_000  # step outcomes an offline loop keeps in memory (loop.trace) for its caller to read


class ListSink:
    """Collects a sequence's responses in memory."""

    def __init__(self):
        self.chunks, self.errors, self.done, self.cancel = [], [], False, False

    def send(self, chunk, final):
        assert not self.done, "response after the final one"
        self.chunks.append(chunk)
        self.done |= final

    def error(self, message):
        self.errors.append(message)
        self.done = True

    def cancelled(self):
        return self.cancel

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)


def make_loop(engine, tokenizer, policy: str = "off", max_batch: int | None = None, max_context: int | None = None,
              drafters: Dict | None = None, kv_budget_bytes: int | None = None,
              prefill_chunk: int = LoopConfig.prefill_chunk, reuse_prefix: bool = LoopConfig.reuse_prefix,
              reuse_kv: bool = LoopConfig.reuse_kv, **policy_params) -> EngineLoop:
    limits = Limits(max_new_tokens_limit=4096, max_context=max_context or engine.max_context)
    drafters = drafters if drafters is not None else {n: make_drafter(n) for n in ("ngram", "suffix", "grammar")}
    return EngineLoop(engine, tokenizer, drafters, make_policy(policy, **policy_params),
                      LoopConfig(max_batch=max_batch or engine.max_slots, limits=limits,
                                 kv_budget_bytes=kv_budget_bytes, prefill_chunk=prefill_chunk,
                                 reuse_prefix=reuse_prefix, reuse_kv=reuse_kv, trace_len=TRACE_LEN))


def run_all(loop: EngineLoop, requests, max_steps: int = 100_000) -> List[ListSink]:
    """Submit all requests at once and step until every one has its final response."""
    sinks = []
    for r in requests:
        s = ListSink()
        loop.submit(r, s)
        sinks.append(s)
    for _ in range(max_steps):
        if all(s.done for s in sinks):
            return sinks
        loop.step()
    raise RuntimeError("requests did not finish")
