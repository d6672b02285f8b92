"""`smartspec` (DSD in Nightjar's tables): gamma = argmax goodput.

Goodput(gamma) = B * E(alpha, gamma) / T(gamma), E = (1 - alpha^(gamma+1)) / (1 - alpha),
alpha = exponential moving average of the batch acceptance rate accepted/drafted,
T from the step-time profile (same tables as AdaSpec). Reward: acceptance rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .base import Policy, is_model_drafter, register, resident_names
from .goodput import adaspec_step_time, expected_tokens
from .params import in_range
from .profiles import StepTimeProfile
from .types import Arm, Decision, StepContext, StepOutcome


def best_gamma(alpha: float, gamma_max: int, step_time) -> int:
    """argmax_gamma E(alpha, gamma) / step_time(gamma) over 0..gamma_max.

    >>> best_gamma(0.8, 8, lambda g: 1.0 + 0.1 * g), best_gamma(0.1, 8, lambda g: 1.0 + 0.1 * g)
    (6, 0)
    """
    return max(range(gamma_max + 1), key=lambda g: (expected_tokens(alpha, g) / step_time(g), -g))


@dataclass(frozen=True)
class SmartSpecConfig:
    drafter: str = "ngram"
    gamma_max: int = 8
    initial_alpha: float = 0.6
    ema: float = 0.9
    profile_path: Optional[str] = None

    def check(self, policy: str) -> None:
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
        in_range(policy, "initial_alpha", self.initial_alpha, 0.0, 1.0)
        in_range(policy, "ema", self.ema, 0.0, 0.9999)


@register
class SmartSpec(Policy):
    name = "smartspec"
    Config = SmartSpecConfig

    def __init__(self, config=None, *, profile: Optional[StepTimeProfile] = None, **kw):
        super().__init__(config, **kw)
        self.profile = profile or StepTimeProfile.load(self.cfg.profile_path)
        self.alpha = self.cfg.initial_alpha

    def decide(self, ctx: StepContext) -> Decision:
        if self.cfg.drafter not in resident_names(ctx) or not ctx.sequences:
            return Decision(arms={})
        b, s = ctx.batch_size, sum(v.context_len for v in ctx.sequences)
        model = is_model_drafter(ctx, self.cfg.drafter)  # a model-free drafter costs no draft steps
        g = best_gamma(self.alpha, self.cfg.gamma_max,
                       lambda k: adaspec_step_time(self.profile, k, b, s, draft_steps=k if model else 0))
        if g == 0:
            return Decision(arms={})
        return Decision(arms={v.seq_id: Arm(self.cfg.drafter, g) for v in ctx.sequences})

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.drafted > 0:
            rate = outcome.accepted / outcome.drafted
            self.alpha = self.cfg.ema * self.alpha + (1.0 - self.cfg.ema) * rate
