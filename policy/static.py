"""Baselines that do not learn: `off` (never speculate) and `static` (fixed arm).

Reward: none (they do not learn)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Policy, register, resident_names
from .params import in_range
from .types import Arm, Decision, StepContext


@register
class OffPolicy(Policy):
    """gamma = 0 for every sequence: plain autoregressive decoding."""

    name = "off"

    def decide(self, ctx: StepContext) -> Decision:
        return Decision(arms={})

    def speculates_at(self, batch_size: int, **load) -> bool:
        return False


@dataclass(frozen=True)
class StaticConfig:
    drafter: str = "ngram"
    gamma: int = 4

    def check(self, policy: str) -> None:
        in_range(policy, "gamma", self.gamma, 0, 64)


@register
class StaticPolicy(Policy):
    """A fixed (drafter, gamma) for every sequence; falls back to no speculation
    while that drafter is not resident."""

    name = "static"
    Config = StaticConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.arm = Arm(self.cfg.drafter if self.cfg.gamma > 0 else None, self.cfg.gamma)

    def speculates_at(self, batch_size: int, **load) -> bool:
        return self.arm.speculates

    def decide(self, ctx: StepContext) -> Decision:
        if not self.arm.speculates or self.arm.drafter not in resident_names(ctx):
            return Decision(arms={})
        return Decision(arms={s.seq_id: self.arm for s in ctx.sequences})
