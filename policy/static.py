"""Baselines that do not learn: `off` (never speculate) and `static` (fixed arm)."""
from __future__ import annotations

from .base import Policy, register
from .types import Arm, Decision, StepContext


@register
class OffPolicy(Policy):
    """gamma = 0 for every sequence: plain autoregressive decoding."""

    name = "off"

    def decide(self, ctx: StepContext) -> Decision:
        return Decision(arms={})


@register
class StaticPolicy(Policy):
    """A fixed (drafter, gamma) for every sequence; falls back to no speculation
    while that drafter is not resident."""

    name = "static"

    def __init__(self, drafter: str = "ngram", gamma: int = 4, **kw):
        super().__init__(**kw)
        if gamma < 0:
            raise ValueError(f"static: gamma must be >= 0, got {gamma}")
        self.arm = Arm(drafter if gamma > 0 else None, gamma)

    def decide(self, ctx: StepContext) -> Decision:
        resident = {d.name for d in ctx.drafters if d.resident}
        if not self.arm.speculates or self.arm.drafter not in resident:
            return Decision(arms={})
        return Decision(arms={s.seq_id: self.arm for s in ctx.sequences})
