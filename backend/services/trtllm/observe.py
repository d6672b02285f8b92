"""What the TensorRT-LLM service reports: the metrics side of the Service contract
(backend/services/contract.py), as our EngineLoop reports it. NOT YET RUN ON A GPU.

MetricsPublisher(service, ...) (backend/frontend/metrics.py) reads `service.stats` (a LoopStats, counted
by `LoopStats.count_step` as the loop counts it), `service.running` (its length),
`service.queue_depth`, `service.pool` (num_blocks, num_free, block_size), `service.max_batch`
and `service.drafters`, and hears every step through `service.add_outcome_listener`
(listeners, called in order; nothing chains itself into another's callback). TrtllmService
fills these from two places:

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
    num_retained: int = 0  # TensorRT-LLM's block reuse keeps its reusable blocks among the free ones


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
