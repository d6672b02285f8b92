"""`metasd`: MetaSD (paper 003) — a bandit over heterogeneous drafters.

Reward: BD (default) r = (1/N_max) sum_j (1 - TV(p_j, q_j)) or BE r = N_acc/N_max
(`rewards.bd_reward` / `rewards.be_reward`), N_max = gamma. One round = one SD
step of a sequence; the bandit is re-initialised per request (query).
Algorithms: ucb (Alg. 2), exp3 (Alg. 7), sh = Sequential Halving (Alg. 5, for
switching costs), ducb = discounted UCB (Alg. 6), swucb = sliding-window UCB
(Alg. 8, for drift inside a request) — see `bandits`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from .bandits import EXP3, UCB, Bandit, DiscountedUCB, SequentialHalving, SlidingWindowUCB, UCBRows
from .base import Policy, register, resident_names
from .params import in_range, require
from .rewards import bd_reward, be_reward
from .types import Arm, Decision, StepContext, StepOutcome

ALGORITHMS = ("ucb", "exp3", "sh", "ducb", "swucb")


@dataclass(frozen=True)
class MetaSdConfig:
    drafters: Tuple[str, ...] = ("ngram", "suffix")
    gamma: int = 4
    algorithm: str = "ucb"
    reward: str = "bd"
    beta: float = 0.01  # the paper's exploration strength (003, App. F)
    exp3_gamma: float = 0.4
    discount: float = 0.95
    window: int = 50
    sh_budget: int = 32

    def check(self, policy: str) -> None:
        require(len(self.drafters) >= 1 and len(set(self.drafters)) == len(self.drafters), policy,
                "drafters must be a non-empty list of distinct names")
        in_range(policy, "gamma", self.gamma, 1, 64)
        require(self.algorithm in ALGORITHMS, policy, f"algorithm must be one of {', '.join(ALGORITHMS)}")
        require(self.reward in ("bd", "be"), policy, "reward must be 'bd' or 'be'")
        in_range(policy, "beta", self.beta, 0.0, None)
        in_range(policy, "exp3_gamma", self.exp3_gamma, 0.0, 1.0)
        in_range(policy, "discount", self.discount, 0.01, 1.0)
        in_range(policy, "window", self.window, 1, 100_000)
        in_range(policy, "sh_budget", self.sh_budget, 1, 100_000)


def make_bandit(cfg: MetaSdConfig, rng) -> Bandit:
    k = len(cfg.drafters)
    return {"ucb": lambda: UCB(k, rng, cfg.beta),
            "exp3": lambda: EXP3(k, rng, cfg.exp3_gamma),
            "sh": lambda: SequentialHalving(k, rng, cfg.sh_budget),
            "ducb": lambda: DiscountedUCB(k, rng, cfg.beta, cfg.discount),
            "swucb": lambda: SlidingWindowUCB(k, rng, cfg.beta, cfg.window)}[cfg.algorithm]()


@register
class MetaSd(Policy):
    name = "metasd"
    Config = MetaSdConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.index = {d: i for i, d in enumerate(self.cfg.drafters)}
        self._arms = [Arm(d, self.cfg.gamma) for d in self.cfg.drafters]  # reused every step
        # UCB (the default) keeps every request's bandit as a row of one table; the
        # other algorithms keep one small bandit object per request
        self.table = UCBRows(len(self.cfg.drafters), self.rng, self.cfg.beta) if self.cfg.algorithm == "ucb" else None
        self.bandits: Dict[int, Bandit] = {}

    def _bandit(self, seq_id: int) -> Bandit:
        b = self.bandits.get(seq_id)
        if b is None:
            b = self.bandits[seq_id] = make_bandit(self.cfg, self.rng)
        return b

    def mean(self, seq_id: int, drafter: str) -> float:
        """Running-mean reward of `drafter` in this request's bandit."""
        if self.table is not None:
            return self.table.mean(seq_id, self.index[drafter])
        return self._bandit(seq_id).mean(self.index[drafter])

    def decide(self, ctx: StepContext) -> Decision:
        resident = resident_names(ctx)
        ids = [v.seq_id for v in ctx.sequences]
        if self.table is not None:
            picks = self.table.select(ids) if ids else []
        else:
            picks = [self._bandit(i).select() for i in ids]
        if all(d in resident for d in self.cfg.drafters):
            return Decision(arms=dict(zip(ids, map(self._arms.__getitem__, picks))))
        arms = {}
        usable = [d for d in self.cfg.drafters if d in resident]
        for i, a in zip(ids, picks):
            if self.cfg.drafters[a] not in resident:  # fall back to the best resident drafter so far
                if not usable:
                    continue
                a = self.index[max(usable, key=lambda d: self.mean(i, d))]
            arms[i] = self._arms[a]
        return Decision(arms=arms)

    def observe(self, outcome: StepOutcome) -> None:
        index = self.index
        played = outcome.sequences
        arms = [index.get(s.drafter) if s.gamma > 0 else None for s in played]
        if None in arms:
            played = [s for s, a in zip(played, arms) if a is not None]
            arms = [a for a in arms if a is not None]
        if not played:
            return
        reward = bd_reward if self.cfg.reward == "bd" else be_reward
        rewards = [reward(s, s.gamma) for s in played]  # N_max = gamma, the tokens verified
        if self.table is not None:
            self.table.update([s.seq_id for s in played], arms, rewards)
            return
        for s, a, r in zip(played, arms, rewards):
            self._bandit(s.seq_id).update(a, r)

    def on_request_start(self, seq_id: int) -> None:
        if self.table is not None:
            self.table.reset(seq_id)
        else:
            self.bandits[seq_id] = make_bandit(self.cfg, self.rng)

    def on_request_end(self, seq_id: int) -> None:
        if self.table is not None:
            self.table.remove(seq_id)
        self.bandits.pop(seq_id, None)
