"""`vllm_disable_by_batch_size`: vLLM's speculative_disable_by_batch_size rule.

A static (drafter, gamma) that switches speculation off (gamma = 0) once the
running batch reaches `disable_batch_size`. Reward: none (does not learn)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Policy, register, resident_names
from .params import in_range
from .types import Arm, Decision, StepContext


@dataclass(frozen=True)
class VllmDisableConfig:
    drafter: str = "ngram"
    gamma: int = 4
    disable_batch_size: int = 16

    def check(self, policy: str) -> None:
        in_range(policy, "gamma", self.gamma, 1, 64)
        in_range(policy, "disable_batch_size", self.disable_batch_size, 1, None)


@register
class VllmDisableByBatchSize(Policy):
    name = "vllm_disable_by_batch_size"
    Config = VllmDisableConfig

    def speculates_at(self, batch_size: int, **load) -> bool:
        return batch_size < self.cfg.disable_batch_size

    def decide(self, ctx: StepContext) -> Decision:
        c = self.cfg
        if ctx.batch_size >= c.disable_batch_size or c.drafter not in resident_names(ctx):
            return Decision(arms={})
        arm = Arm(c.drafter, c.gamma)
        return Decision(arms={s.seq_id: arm for s in ctx.sequences})
