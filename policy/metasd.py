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

from .bandits import EXP3, UCB, Bandit, DiscountedUCB, SequentialHalving, SlidingWindowUCB
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
        self.bandits: Dict[int, Bandit] = {}
        self.index = {d: i for i, d in enumerate(self.cfg.drafters)}

    def _bandit(self, seq_id: int) -> Bandit:
        b = self.bandits.get(seq_id)
        if b is None:
            b = self.bandits[seq_id] = make_bandit(self.cfg, self.rng)
        return b

    def decide(self, ctx: StepContext) -> Decision:
        resident = resident_names(ctx)
        arms = {}
        for v in ctx.sequences:
            b = self._bandit(v.seq_id)
            name = self.cfg.drafters[b.select()]
            if name not in resident:  # fall back to the best resident drafter so far
                usable = [d for d in self.cfg.drafters if d in resident]
                if not usable:
                    continue
                name = max(usable, key=lambda d: b.mean(self.index[d]))
            arms[v.seq_id] = Arm(name, self.cfg.gamma)
        return Decision(arms=arms)

    def observe(self, outcome: StepOutcome) -> None:
        reward = bd_reward if self.cfg.reward == "bd" else be_reward
        for s in outcome.sequences:
            if s.drafter in self.index and s.gamma > 0:
                self._bandit(s.seq_id).update(self.index[s.drafter], reward(s, s.gamma))

    def on_request_start(self, seq_id: int) -> None:
        self.bandits[seq_id] = make_bandit(self.cfg, self.rng)

    def on_request_end(self, seq_id: int) -> None:
        self.bandits.pop(seq_id, None)
