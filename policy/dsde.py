"""`dsde`: DSDE (paper 002) — per-sequence gamma from KL-divergence stability.

Reward / signal: KL(p||q) per verified draft position (SequenceOutcome.kl; model
drafters only). Per sequence: WVIR = Var_w(last 10) / Var_w(last 30) with weights
delta^(i-1) (i = 1 most recent), SF = exp(2 mu_KL,last) - 1,
SL^ = (1 - SF*WVIR)(SL_max - SL_min) + SL_min if SF*WVIR <= 1 else SL_min (ceil);
SL_max calibrated on warm-up steps; batch cap SL_cap = ceil(mean SL^_i).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Sequence

from .base import Policy, register, resident_names
from .params import in_range, require
from .rewards import mean_kl
from .types import Arm, Decision, StepContext, StepOutcome

VAR_FLOOR = 1e-6
LARGE_WVIR = 1e6


def weighted_variance(recent_first: Sequence[float], delta: float) -> float:
    """Var_w with weights delta^(i-1), i = 1 the most recent value.

    >>> round(weighted_variance([1.0, 0.0], 0.5), 4)   # w=(1, .5): mean 2/3, var 2/9
    0.2222
    """
    w = [delta ** i for i in range(len(recent_first))]
    sw = sum(w)
    if sw == 0:
        return 0.0
    mu = sum(wi * x for wi, x in zip(w, recent_first)) / sw
    return sum(wi * (x - mu) ** 2 for wi, x in zip(w, recent_first)) / sw


def wvir(recent_first: Sequence[float], delta: float = 0.85, short: int = 10, long: int = 30) -> float:
    """Weighted variance increase ratio Var_w(short) / Var_w(long); large when the
    long-window variance is < 1e-6.

    >>> wvir([0.0] * 30)
    1000000.0
    >>> round(wvir([1.0, 0.0] * 5 + [0.5] * 20), 3)
    1.234
    """
    v_long = weighted_variance(recent_first[:long], delta)
    if v_long < VAR_FLOOR:
        return LARGE_WVIR
    return weighted_variance(recent_first[:short], delta) / v_long


def stability_factor(mu_kl_last: float) -> float:
    """SF = exp(2 mu_KL,last) - 1.

    >>> round(stability_factor(0.1), 4)
    0.2214
    """
    return math.exp(2.0 * mu_kl_last) - 1.0


def calibrate_sl_max(sl_a_max: int, kl_pre: Sequence[float]) -> int:
    """SL_max = SL_A,max (1 + mu_KL,pre / (KL_pre,max + 1e-6)), rounded up.

    >>> calibrate_sl_max(8, [0.2, 0.4, 0.6])   # 8 * (1 + 0.4/0.6) = 13.33
    14
    """
    if not kl_pre:
        return sl_a_max
    mu, mx = sum(kl_pre) / len(kl_pre), max(kl_pre)
    return int(math.ceil(sl_a_max * (1.0 + mu / (mx + 1e-6)) - 1e-9))


def predicted_length(sf: float, w: float, sl_max: int, sl_min: int = 2) -> int:
    """SL^ = (1 - SF WVIR)(SL_max - SL_min) + SL_min if SF WVIR <= 1 else SL_min, ceil.

    >>> predicted_length(0.2, 1.5, 10), predicted_length(0.5, 3.0, 10), predicted_length(0.0, 1e6, 10)
    (8, 2, 10)
    """
    x = sf * w
    if x > 1.0:
        return sl_min
    return int(math.ceil((1.0 - x) * (sl_max - sl_min) + sl_min - 1e-9))


def batch_cap(lengths: Sequence[int]) -> int:
    """SL_cap = ceil(mean SL^_i).

    >>> batch_cap([2, 3, 10])
    5
    """
    return int(math.ceil(sum(lengths) / len(lengths))) if lengths else 0


@dataclass(frozen=True)
class DsdeConfig:
    drafter: str = "ngram"  # the server's always-available drafter
    sl_a_max: int = 8
    sl_min: int = 2
    delta: float = 0.85
    short_window: int = 10
    long_window: int = 30
    warmup_steps: int = 5
    batch_cap: bool = True

    def check(self, policy: str) -> None:
        in_range(policy, "sl_a_max", self.sl_a_max, 1, 64)
        in_range(policy, "sl_min", self.sl_min, 1, self.sl_a_max)
        in_range(policy, "delta", self.delta, 0.01, 1.0)
        in_range(policy, "short_window", self.short_window, 2, 1000)
        require(self.long_window > self.short_window, policy, "long_window must exceed short_window")
        in_range(policy, "warmup_steps", self.warmup_steps, 0, 10_000)


@register
class Dsde(Policy):
    name = "dsde"
    Config = DsdeConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.kl_hist: Dict[int, Deque[float]] = {}
        self.last_mu: Dict[int, float] = {}
        self.kl_pre: List[float] = []
        self.warm_left = self.cfg.warmup_steps
        self.sl_max = self.cfg.sl_a_max
        self._lengths: Dict[int, int] = {}  # SL^ per sequence, recomputed only when it observes

    def length_for(self, seq_id: int) -> int:
        cached = self._lengths.get(seq_id)
        return cached if cached is not None and self.warm_left == 0 else self._length(seq_id)

    def _length(self, seq_id: int) -> int:
        hist = self.kl_hist.get(seq_id)
        if self.warm_left > 0 or not hist or len(hist) < 2:
            return self.sl_max
        w = wvir(list(hist), self.cfg.delta, self.cfg.short_window, self.cfg.long_window)
        return predicted_length(stability_factor(self.last_mu.get(seq_id, 0.0)), w, self.sl_max, self.cfg.sl_min)

    def decide(self, ctx: StepContext) -> Decision:
        if self.cfg.drafter not in resident_names(ctx):
            return Decision(arms={})
        lengths = {v.seq_id: self.length_for(v.seq_id) for v in ctx.sequences}
        if self.cfg.batch_cap and lengths:
            cap = batch_cap(list(lengths.values()))
            lengths = {i: min(k, cap) for i, k in lengths.items()}
        return Decision(arms={i: Arm(self.cfg.drafter, k) for i, k in lengths.items() if k > 0})

    def observe(self, outcome: StepOutcome) -> None:
        seen = False
        for s in outcome.sequences:
            if not s.kl:
                continue
            seen = True
            h = self.kl_hist.setdefault(s.seq_id, deque(maxlen=self.cfg.long_window))
            for x in s.kl:  # oldest first in the step -> most recent at the left
                h.appendleft(x)
            self.last_mu[s.seq_id] = mean_kl(s)
            self._lengths.pop(s.seq_id, None)
            if self.warm_left > 0:
                self.kl_pre.extend(s.kl)
        if seen and self.warm_left > 0:
            self.warm_left -= 1
            if self.warm_left == 0:
                self.sl_max = calibrate_sl_max(self.cfg.sl_a_max, self.kl_pre)
                self._lengths.clear()
        if self.warm_left == 0:
            for s in outcome.sequences:
                if s.kl:
                    self._lengths[s.seq_id] = self._length(s.seq_id)

    def on_request_end(self, seq_id: int) -> None:
        self.kl_hist.pop(seq_id, None)
        self.last_mu.pop(seq_id, None)
        self._lengths.pop(seq_id, None)
