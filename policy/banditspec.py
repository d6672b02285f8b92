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
from typing import Dict, List, Tuple

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
        self._pending: Tuple[int, int] | None = None  # (bucket, arm index)

    def _bandit(self, key: int):
        b = self.bandits.get(key)
        if b is None:
            cls = UCBSpec(len(self.arms), self.rng, self.L, self.cfg.delta) if self.cfg.algorithm == "ucbspec" \
                else EXP3Spec(len(self.arms), self.rng)
            b = self.bandits[key] = cls
        return b

    def decide(self, ctx: StepContext) -> Decision:
        key = bucket_of(ctx.batch_size) if self.cfg.per_batch_bucket else 0
        i = self._bandit(key).select()
        arm = self.arms[i]
        if arm.speculates and arm.drafter not in resident_names(ctx):
            self._pending = None
            return Decision(arms={})
        self._pending = (key, i)
        return Decision(arms={v.seq_id: arm for v in ctx.sequences} if arm.speculates else {})

    def observe(self, outcome: StepOutcome) -> None:
        if self._pending is None or not outcome.sequences:
            return
        key, i = self._pending
        self._pending = None
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
