"""What the TensorRT-LLM service knows, in the shape backend/metrics.py reads of our EngineLoop.
NOT YET RUN ON A GPU.

MetricsPublisher(loop, ...) reads `loop.stats` (LoopStats fields), `loop.running` (its length),
`loop.queue_depth`, `loop.pool` (num_blocks, num_free, block_size), `loop.cfg.max_batch`,
`loop.drafters` and chains itself into `loop.on_outcome`. TrtllmService has the same surface,
filled from two places:

* the drafter hook, once per TensorRT-LLM iteration: each StepOutcome (steps, tokens emitted,
  drafted and accepted, phase times) and what it saw of the iteration (scheduled context and
  generation requests, the KV cache manager's `get_kv_cache_stats()`);
* the serving layer: requests admitted (prompt tokens), in flight, finished, cancelled.

running = requests TensorRT-LLM scheduled in its latest iteration (at most those in flight);
waiting = in flight - running, the autoscaler's `specserve_sequences{state="waiting"}`.
With TensorRT-LLM's executor in worker processes (tensor_parallel_size > 1) the hook runs
there: the per-iteration figures then stay at zero here; the request counts do not.
"""
from __future__ import annotations

from typing import NamedTuple

from ...loop.stats import LoopStats


class KvPool(NamedTuple):
    """TensorRT-LLM's KV cache as the publisher reads a BlockPool."""
    num_blocks: int
    num_free: int
    block_size: int


class ServiceStats:
    """LoopStats of the service: counts outcomes (executor thread) and requests (serving thread);
    each field is written by one thread only."""

    def __init__(self):
        self.stats = LoopStats()

    def outcome(self, o) -> None:
        self.stats.count_step(o)

    def admitted(self, prompt_tokens: int) -> None:
        self.stats.prefills += 1
        self.stats.prefill_tokens += prompt_tokens


def running_and_waiting(in_flight: int, last) -> tuple:
    """(running, waiting) from the requests in flight and the hook's latest Iteration."""
    running = min(in_flight, last.context + last.generation)
    return running, in_flight - running
