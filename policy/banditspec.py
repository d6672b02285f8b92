"""`banditspec`: BanditSpec (paper 004) — UCBSpec / EXP3Spec over hyperparameter arms.

Arms: drafters x gammas (drafter arms: several drafters, one gamma; length arms:
one drafter, gammas such as 0..4; gamma 0 = plain decoding). One arm per step
for the whole batch.
Reward: `acceptance_length` y = accepted + 1 (batch mean; BanditSpec's default),
or `throughput` = batch tokens / step time (the batch-serving variant) with the
UCB radius scaled to the observed reward range and per-arm counts (the released
code divided by total pulls, which made it greedy). With `per_batch_bucket`
(default) each power-of-two batch-size bucket has its own bandit — our addition
for continuous batching, where throughputs at different batch sizes are not
comparable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .bandits import EXP3Spec, UCBSpec
from .base import Policy, bucket_of, register, resident_names
from .params import in_range, require
from .rewards import mean_acceptance_length, tokens_per_second
from .types import NO_SPECULATION, Arm, Decision, StepContext, StepOutcome


def arm_set(drafters, gammas) -> List[Arm]:
    """
    >>> arm_set(["a", "b"], [0, 2])
    [Arm(drafter=None, gamma=0), Arm(drafter='a', gamma=2), Arm(drafter='b', gamma=2)]
    """
    arms = [NO_SPECULATION] if 0 in gammas else []
    return arms + [Arm(d, g) for g in gammas if g > 0 for d in drafters]


@dataclass(frozen=True)
class BanditSpecConfig:
    drafters: Tuple[str, ...] = ("ngram",)
    gammas: Tuple[int, ...] = (0, 1, 2, 3, 4)
    algorithm: str = "ucbspec"
    reward: str = "throughput"
    delta: float = 0.5
    per_batch_bucket: bool = True

    def check(self, policy: str) -> None:
        require(len(self.drafters) >= 1, policy, "drafters must be a non-empty list")
        require(len(self.gammas) >= 1 and all(0 <= g <= 64 for g in self.gammas), policy,
                "gammas must be a non-empty list of integers in [0, 64]")
        require(len(arm_set(self.drafters, self.gammas)) >= 2, policy, "need at least two arms")
        require(self.algorithm in ("ucbspec", "exp3spec"), policy, "algorithm must be 'ucbspec' or 'exp3spec'")
        require(self.reward in ("acceptance_length", "throughput"), policy,
                "reward must be 'acceptance_length' or 'throughput'")
        in_range(policy, "delta", self.delta, 1e-9, 1.0)


@register
class BanditSpec(Policy):
    name = "banditspec"
    Config = BanditSpecConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.arms = arm_set(self.cfg.drafters, self.cfg.gammas)
        self.L = max(self.cfg.gammas)
        self.bandits: Dict[int, object] = {}
        self.r_max: Dict[int, float] = {}
        self.index = {a: i for i, a in enumerate(self.arms)}

    def _bandit(self, key: int):
        b = self.bandits.get(key)
        if b is None:
            cls = UCBSpec(len(self.arms), self.rng, self.L, self.cfg.delta) if self.cfg.algorithm == "ucbspec" \
                else EXP3Spec(len(self.arms), self.rng)
            b = self.bandits[key] = cls
        return b

    def _key(self, batch_size: int) -> int:
        return bucket_of(batch_size) if self.cfg.per_batch_bucket else 0

    def decide(self, ctx: StepContext) -> Decision:
        arm = self.arms[self._bandit(self._key(ctx.batch_size)).select()]
        if not arm.speculates or arm.drafter not in resident_names(ctx):
            return Decision(arms={})
        return Decision(arms={v.seq_id: arm for v in ctx.sequences})

    def _played_arm(self, outcome: StepOutcome) -> Optional[int]:
        """The index of the batch's planned arm; None when the step was forced off: the arm
        planned nothing while one of the arms' drafters was not resident, so the bandit may
        have picked that drafter's arm (the outcome cannot tell it from picking gamma 0)."""
        s = outcome.sequences[0]
        g = s.gamma if s.planned_gamma is None else s.planned_gamma
        arm = Arm(s.drafter if s.planned_gamma is None else s.planned_drafter, g) if g > 0 else NO_SPECULATION
        ctx = outcome.context
        if not arm.speculates and ctx is not None:
            resident = resident_names(ctx)
            if any(d not in resident for d in self.cfg.drafters):
                return None
        return self.index.get(arm)

    def observe(self, outcome: StepOutcome) -> None:
        if not outcome.sequences:
            return
        i = self._played_arm(outcome)
        if i is None:
            return
        key = self._key(outcome.context.batch_size if outcome.context is not None else outcome.batch_size)
        b = self._bandit(key)
        if self.cfg.reward == "acceptance_length":
            y = mean_acceptance_length(outcome)
            width, loss = float(self.L), (self.L + 1 - y) / self.L
        else:
            y = tokens_per_second(outcome)
            self.r_max[key] = width = max(self.r_max.get(key, 0.0), y)
            loss = 1.0 - y / width if width > 0 else 1.0
        if isinstance(b, UCBSpec):
            b.width = width
            b.update(i, y)
        else:
            b.update(i, min(max(loss, 0.0), 1.0))
