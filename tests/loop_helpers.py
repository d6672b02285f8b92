"""Run the real engine loop synchronously in a test (no Triton, no threads)."""
from __future__ import annotations

from backend.drafters import make_drafter
from backend.engine_loop import EngineLoop, LoopConfig
from backend.request import GenerationRequest, Limits
from policy import make_policy


class ListSink:
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
    def text(self):
        return "".join(c.text for c in self.chunks)


def make_loop(engine, tokenizer, policy="off", max_batch=8, max_context=None, **policy_params):
    limits = Limits(max_tokens=1024, max_context=max_context or engine.max_context)
    return EngineLoop(engine, tokenizer, {"ngram": make_drafter("ngram")}, make_policy(policy, **policy_params),
                      LoopConfig(max_batch=max_batch, limits=limits))


def run_all(loop, requests, max_steps=10_000):
    """Submit all requests at once and step until every sink is done."""
    sinks = []
    for r in requests:
        s = ListSink()
        loop.submit(r, s)
        sinks.append(s)
    for _ in range(max_steps):
        if all(s.done for s in sinks):
            return sinks
        loop.step()
    raise AssertionError("requests did not finish")


def greedy(prompt, max_tokens=32, **kw):
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, exclude_input_in_output=True, **kw)
