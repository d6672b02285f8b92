"""`nightjar`: Nightjar (paper 000) — ADA-BINGREEDY over gamma per batch size,
switching cost priced in, elastic drafter memory.

Reward (a loss): l_t = 1/g_t seconds per emitted token, g_t = batch tokens / step
time (`rewards.latency_per_token`); running mean l~_{B,gamma} per (B, gamma).
The mean is over emitted tokens by default (`loss_average: token`): each step's
l_t weighted by the tokens it emitted, i.e. sum of step times / sum of tokens —
still an average of l directly (never 1/mean(g)), and the latency per token the
paper means (l_{B,gamma} = 1/g_{B,gamma}). The per-step mean (`loss_average: step`,
the paper's update l~ += (l_t - l~)/n) estimates E[T/tokens] instead, which at
small batch is dominated by the steps that emitted one token (Jensen, E[1/X] >=
1/E[X]): it penalises long drafts whose token count varies most, so it settles on
gamma 1-2 where the per-token latency is lowest at gamma 4 (stationary test env).
Exploitation adds the switching penalty 1(gamma_prev = 0, gamma > 0) C_switch(L_max, B)/gamma
from an offline-profiled table (`profiles.SwitchCostTable`).
Schedule per batch size B (Alg. 1): at bin start explore with prob 1/b_B
(gamma uniform in 0..Gamma_max) else exploit; lock gamma for the bin; a bin lasts
sqrt(H_B) steps, a block sqrt(H_B) bins; then j_B += 1, H_B = 2^(j_B - 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .base import Policy, register, resident_names
from .elastic import ElasticMemory
from .params import in_range, require
from .profiles import SwitchCostTable
from .rewards import latency_per_token, switching_penalty
from .types import Arm, Decision, StepContext, StepOutcome


@dataclass
class BinSchedule:
    """ADA-BINGREEDY counters for one batch size: block j, length H, bin b, round tau."""

    j: int = 1
    H: int = 1
    b: int = 1
    tau: int = 1
    gamma: int = 0

    @property
    def bin_start(self) -> bool:
        return self.tau == 1

    @property
    def explore_prob(self) -> float:
        return 1.0 / self.b

    def advance(self) -> None:
        """After one step (Alg. 1 lines 19-26).

        >>> s = BinSchedule(); trace = []
        >>> for _ in range(8): trace.append((s.j, s.H, s.b, s.tau)); s.advance()
        >>> trace
        [(1, 1, 1, 1), (2, 2, 1, 1), (3, 4, 1, 1), (3, 4, 1, 2), (3, 4, 2, 1), (3, 4, 2, 2), (4, 8, 1, 1), (4, 8, 1, 2)]
        """
        self.tau += 1
        if self.tau > math.sqrt(self.H):
            self.b, self.tau = self.b + 1, 1
            if self.b > math.sqrt(self.H):
                self.j += 1
                self.H, self.b = 2 ** (self.j - 1), 1


def exploit_gamma(means: Dict[int, float], prev_gamma: int, c_switch_s: float) -> Optional[int]:
    """Eq. (4): argmin_gamma l~_gamma + 1(prev=0, gamma>0) C_switch / gamma over tried gammas.

    >>> exploit_gamma({0: 0.040, 2: 0.030, 4: 0.028}, prev_gamma=0, c_switch_s=0.02)
    4
    >>> exploit_gamma({0: 0.040, 2: 0.030, 4: 0.028}, prev_gamma=0, c_switch_s=0.08)
    0
    """
    if not means:
        return None
    return min(sorted(means), key=lambda g: means[g] + switching_penalty(prev_gamma, g, c_switch_s))


@dataclass(frozen=True)
class NightjarConfig:
    drafter: str = "ngram"  # the server's always-available drafter
    gamma_max: int = 4
    switch_cost_path: Optional[str] = None
    elastic: bool = True
    tau_low_frac: float = 0.1
    t_persist: int = 8
    loss_average: str = "token"  # token: sum T / sum tokens; step: the paper's per-step running mean

    def check(self, policy: str) -> None:
        require(self.loss_average in ("token", "step"), policy, "loss_average must be 'token' or 'step'")
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
        in_range(policy, "tau_low_frac", self.tau_low_frac, 0.0, 0.9)
        in_range(policy, "t_persist", self.t_persist, 1, 10_000)


@register
class Nightjar(Policy):
    name = "nightjar"
    Config = NightjarConfig

    def __init__(self, config=None, *, switch_cost: Optional[SwitchCostTable] = None, **kw):
        super().__init__(config, **kw)
        self.c_switch = switch_cost or SwitchCostTable.load(self.cfg.switch_cost_path)
        self.sched: Dict[int, BinSchedule] = {}
        self.sums: Dict[Tuple[int, int], Tuple[float, float]] = {}  # (B, gamma) -> (sum of weighted l, weight)
        self.prev_gamma = 0
        self.memory = ElasticMemory(self.cfg.tau_low_frac, self.cfg.t_persist)

    def _means(self, b: int) -> Dict[int, float]:
        return {g: s / n for (bb, g), (s, n) in self.sums.items() if bb == b and n > 0}

    def _l_max(self, ctx: StepContext) -> int:
        return max((v.uncaught_tokens.get(self.cfg.drafter, 0) for v in ctx.sequences), default=0)

    def decide(self, ctx: StepContext) -> Decision:
        b = ctx.batch_size
        if b == 0:
            return Decision(arms={})
        st = self.sched.setdefault(b, BinSchedule())
        if st.bin_start:
            if self.rng.random() < st.explore_prob:
                st.gamma = self.rng.randint(0, self.cfg.gamma_max)
            else:
                g = exploit_gamma(self._means(b), self.prev_gamma, self.c_switch(self._l_max(ctx), b))
                st.gamma = self.rng.randint(0, self.cfg.gamma_max) if g is None else g
        gamma = st.gamma if self.cfg.drafter in resident_names(ctx) else 0
        st.advance()
        actions = self.memory.update(ctx, sd_enabled=gamma > 0) if self.cfg.elastic else []
        arms = {v.seq_id: Arm(self.cfg.drafter, gamma) for v in ctx.sequences} if gamma > 0 else {}
        return Decision(arms=arms, memory_actions=tuple(actions))

    def observe(self, outcome: StepOutcome) -> None:
        """l~ of (B, the bin's gamma). A step whose drafter was not resident was forced off
        whatever its bin chose: it teaches nothing (the outcome cannot tell which gamma the
        bin had locked, so that holds for a bin of gamma 0 too)."""
        seqs = outcome.sequences
        played = max([s.gamma for s in seqs], default=0)
        planned = max([s.gamma if s.planned_gamma is None else s.planned_gamma for s in seqs], default=0)
        ctx = outcome.context
        forced_off = ctx is not None and self.cfg.drafter not in resident_names(ctx)
        if not forced_off and outcome.emitted > 0:
            key = (outcome.batch_size, planned)
            s, n = self.sums.get(key, (0.0, 0))
            w = outcome.emitted if self.cfg.loss_average == "token" else 1  # token: sum T / sum tokens
            self.sums[key] = (s + w * latency_per_token(outcome), n + w)
        self.prev_gamma = played
