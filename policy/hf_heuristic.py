"""`hf_heuristic`: transformers' assisted-generation "heuristic" schedule.

Per sequence: gamma += 2 when every draft token was accepted, else gamma -= 1
(floor 1, ceiling gamma_max). Reward: acceptance (all accepted or not)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Policy, register, resident_names
from .params import in_range
from .types import Arm, Decision, StepContext, StepOutcome


def next_gamma(gamma: int, accepted: int, gamma_max: int) -> int:
    """
    >>> next_gamma(4, 4, 20), next_gamma(4, 2, 20), next_gamma(1, 0, 20), next_gamma(19, 19, 20)
    (6, 3, 1, 20)
    """
    g = gamma + 2 if accepted >= gamma else gamma - 1
    return min(max(g, 1), gamma_max)


@dataclass(frozen=True)
class HfHeuristicConfig:
    drafter: str = "ngram"
    initial_gamma: int = 5
    gamma_max: int = 16

    def check(self, policy: str) -> None:
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
        in_range(policy, "initial_gamma", self.initial_gamma, 1, self.gamma_max)


@register
class HfHeuristic(Policy):
    name = "hf_heuristic"
    Config = HfHeuristicConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.gamma = {}  # seq_id -> current gamma
        self._arms = {g: Arm(self.cfg.drafter, g) for g in range(self.cfg.gamma_max + 1)}  # reused every step
        self._next = {}  # (gamma, accepted) -> next_gamma(...), memoised (pure)

    def decide(self, ctx: StepContext) -> Decision:
        if self.cfg.drafter not in resident_names(ctx):
            return Decision(arms={})
        gamma, arms, g0 = self.gamma, self._arms, self.cfg.initial_gamma
        return Decision(arms={s.seq_id: arms[gamma.setdefault(s.seq_id, g0)] for s in ctx.sequences})

    def observe(self, outcome: StepOutcome) -> None:
        gamma, nxt = self.gamma, self._next
        for s in outcome.sequences:
            if s.gamma > 0:
                g = nxt.get((s.gamma, s.accepted))
                if g is None:
                    g = nxt[(s.gamma, s.accepted)] = next_gamma(s.gamma, s.accepted, self.cfg.gamma_max)
                gamma[s.seq_id] = g

    def on_request_end(self, seq_id: int) -> None:
        self.gamma.pop(seq_id, None)
