"""What a serving loop has done, counted one way for every service (our EngineLoop and the
TensorRT-LLM service): the Prometheus publisher (backend/frontend/metrics.py) reads these fields."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoopStats:
    steps: int = 0
    sequence_steps: int = 0  # sum of batch sizes over steps (mean batch = this / steps)
    prefills: int = 0
    prefill_tokens: int = 0  # tokens computed by prefills (recomputation after preemption included)
    prefill_time_s: float = 0.0
    prefix_tokens_reused: int = 0  # prompt tokens copied (prefix stream or retained cells), not prefilled
    kv_blocks_reused: int = 0  # whole KV blocks of those, per request (TensorRT-LLM's "reused" blocks)
    kv_reuse_lookups: int = 0  # new prompts looked up among the retained cells
    kv_reuse_hits: int = 0  # of those, prompts that reused retained cells
    step_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    accept_time_s: float = 0.0
    io_time_s: float = 0.0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    drafter_errors: int = 0
    finished: int = 0
    cancelled: int = 0
    preemptions: int = 0
    memory_gamma_cuts: int = 0  # steps whose drafts were dropped for lack of KV blocks
    drafter_parks: int = 0
    drafter_reloads: int = 0

    def count_step(self, outcome) -> None:
        """One closed step (a policy.StepOutcome): its batch, tokens and phase times."""
        self.steps += 1
        self.sequence_steps += outcome.batch_size
        self.step_time_s += outcome.total_time_s
        self.draft_time_s += outcome.draft_time_s
        self.verify_time_s += outcome.verify_time_s
        self.accept_time_s += outcome.accept_time_s
        self.io_time_s += outcome.io_time_s
        self.emitted += outcome.emitted
        self.drafted += outcome.drafted
        self.accepted += outcome.accepted
