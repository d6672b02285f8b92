"""`dsde`: DSDE (paper 002) — per-sequence gamma from KL-divergence stability.

Reward / signal: KL(p||q) per verified draft position (SequenceOutcome.kl; model
drafters only). Per sequence: WVIR = Var_w(last 10) / Var_w(last 30) with weights
delta^(i-1) (i = 1 most recent), SF = exp(2 mu_KL,last) - 1,
SL^ = (1 - SF*WVIR)(SL_max - SL_min) + SL_min if SF*WVIR <= 1 else SL_min (ceil);
SL_max calibrated on warm-up steps; batch cap SL_cap = ceil(mean SL^_i).

The scalar functions below state the rule (with worked examples; `sequence_length`
for one sequence). At 64 sequences a Python loop over every sequence's 30 values costs
~1 ms a step, so the policy runs the same rule for the whole batch at once: every
sequence's last 30 KL values are a row of (x, x^2, 1) triples in one array
(`KlHistories`), one matrix product gives the weighted moments of both windows
(`moment_weights`), and `lengths_from_moments` turns them into SL^ (Var_w = S2/S0 -
(S1/S0)^2, the one-pass form of `weighted_variance`: equal up to rounding, which
tests/policy/test_batched_state.py bounds).
"""
from __future__ import annotations

import functools
import math
from itertools import chain
from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from .base import Policy, register, resident_names
from .params import in_range, require
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


def sequence_length(recent_first: Sequence[float], k: int, sl_max: int, sl_min: int = 2, delta: float = 0.85,
                    short: int = 10, long: int = 30) -> int:
    """SL^ of one sequence from its KL history (most recent first), k of which arrived in
    the last step (mu_KL,last is their mean). A sequence with a single value so far has
    no variance to compare: it drafts SL_max.

    >>> sequence_length([0.1] + [1.0, 0.0] * 5 + [0.5] * 19, 1, 10)   # WVIR 1.193, SF 0.2214: 7.9
    8
    >>> sequence_length([0.3], 1, 10)
    10
    """
    if len(recent_first) == 1:
        return sl_max
    sf = stability_factor(sum(recent_first[:k]) / k)
    return predicted_length(sf, wvir(recent_first, delta, short, long), sl_max, sl_min)


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


@functools.lru_cache(maxsize=64)
def moment_weights(delta: float, short: int, long: int, k: int) -> np.ndarray:
    """[3 long, 9] weights that turn a flattened history row (`long` triples
    (x, x^2, 1), most recent first, zeros past the row's count) into S1, S2, S0 =
    sum w x, sum w x^2, sum w over the long and the short window (w = delta^(i-1)),
    S0 once more (so one division gives both means and both second moments), and
    twice the mean of the k newest values (2 mu_KL,last, for SF). Memoised per k,
    read-only.

    >>> moment_weights(0.5, 1, 2, 1).T.tolist()[:2]   # S1 long, S1 short
    [[1.0, 0.0, 0.0, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    """
    p = np.arange(long)
    w = np.stack([delta ** p, np.where(p < short, delta ** p, 0.0)], axis=1)  # [long, 2]
    m = np.zeros((long, 3, 9))
    for moment in range(3):  # x, x^2, present
        m[:, moment, 2 * moment:2 * moment + 2] = w
    m[:, 2, 6:8] = w
    m[:min(k, long), 0, 8] = 2.0 / max(k, 1)
    m = m.reshape(3 * long, 9)
    m.flags.writeable = False
    return m


def wvir_from_moments(m: np.ndarray) -> np.ndarray:
    """`wvir` per sequence from its weighted moments m = [S1, S2, S0, S0 (long, short each),
    2 mu_KL,last] x sequences (see `moment_weights`), with Var_w = S2/S0 - (S1/S0)^2;
    LARGE_WVIR where Var_w(long) < 1e-6, and 0 for a sequence with a single value so far
    (S0 = 1), so that it drafts SL_max (`sequence_length`)."""
    q = m[:4] / m[4:8]  # mean long, mean short, E[x^2] long, E[x^2] short
    var_long, var_short = q[2:] - q[:2] * q[:2]
    out = (m[4] > 1.0 + 1e-9) * LARGE_WVIR
    np.divide(var_short, var_long, out=out, where=var_long >= VAR_FLOOR)
    return out


def lengths_from_moments(m: np.ndarray, sl_max: int, sl_min: int = 2) -> np.ndarray:
    """SL^ per sequence from its weighted moments (`wvir_from_moments`), SF = exp(2 mu) - 1,
    and `predicted_length` written as ceil(max(SL_max - 1e-9 - SF WVIR (SL_max - SL_min),
    SL_min)) — for SF WVIR > 1 the line is below SL_min, so the floor is the same rule.
    Few, whole-array numpy calls: at 64 sequences the cost is the number of calls.

    >>> x = np.array([1.0, 0.0] * 5 + [0.5] * 20); w = 0.85 ** np.arange(30)
    >>> mom = lambda v: [(w * v).sum(), (w[:10] * v[:10]).sum()]
    >>> col = mom(x) + mom(x * x) + mom(x ** 0) * 2 + [2 * 0.1]     # WVIR 1.234, SF 0.2214
    >>> lengths_from_moments(np.array([col]).T, 10).tolist()    # (1 - 0.273) * 8 + 2 = 7.8
    [8]
    """
    span = float(sl_max - sl_min)
    line = (sl_max - 1e-9) - (np.exp(m[8]) * span - span) * wvir_from_moments(m)  # SF (SL_max - SL_min) WVIR
    np.maximum(line, np.float64(sl_min), out=line)
    return np.ceil(line).astype(np.int64)


class KlHistories:
    """The last `long` KL values of every running sequence as rows of one array
    [rows, long, 3] holding (x, x^2, 1) per value ("1": present), most recent first,
    zeros past a row's count; their weighted moments are one matrix product,
    instead of a Python loop per sequence and value.

    While the same batch pushes step after step (the usual case), its rows live in
    one contiguous block that a push rebuilds with a single concatenation; they are
    written back when the batch changes. At 64 sequences the cost is the number of
    numpy calls, not the arithmetic."""

    POWERS = np.array([1.0, 2.0, 0.0])  # x -> (x, x^2, 1)

    def __init__(self, long: int, capacity: int = 64):
        self.long = long
        self.rows: Dict[int, int] = {}  # seq_id -> row
        self.free: List[int] = list(range(capacity - 1, -1, -1))
        self.data = np.zeros((capacity, 3 * long))
        self._ids: list = []  # the batch of the last push, its rows and its block
        self._idx = np.zeros(0, dtype=np.int64)
        self._block = np.zeros((0, 3 * long))

    def row(self, seq_id: int) -> int:
        r = self.rows.get(seq_id)
        if r is None:
            if not self.free:  # grow: double the rows
                cap = len(self.data)
                self.data = np.concatenate([self.data, np.zeros_like(self.data)])
                self.free = list(range(2 * cap - 1, cap - 1, -1))
            r = self.rows[seq_id] = self.free.pop()
        return r

    def _write_back(self) -> None:
        if self._ids:
            self.data[self._idx] = self._block
            self._ids = []

    def push(self, ids: list, values: Sequence[list], k: int) -> np.ndarray:
        """Append k values per sequence (oldest first, as in SequenceOutcome.kl).
        -> their updated rows [m, 3 long] (read-only: the block itself)."""
        if ids != self._ids:
            self._write_back()
            self._idx = np.array([self.row(i) for i in ids], dtype=np.int64)
            self._ids, self._block = ids, self.data.take(self._idx, axis=0)
        m, n = len(ids), self.long
        x = np.fromiter(chain.from_iterable(values), float, m * k).reshape(m, k, 1)[:, ::-1]  # newest first
        if k > n:
            x, k = x[:, :n], n
        # age the history by k positions: the new triples in front, the oldest k fall off
        self._block = np.concatenate(((x ** self.POWERS).reshape(m, 3 * k), self._block[:, :3 * (n - k)]), axis=1)
        return self._block

    def rows_of(self, ids: Sequence[int]) -> np.ndarray:
        self._write_back()
        return self.data[np.array([self.rows[i] for i in ids], dtype=np.int64)]

    def drop(self, seq_id: int) -> None:
        self._write_back()
        r = self.rows.pop(seq_id, None)
        if r is not None:
            self.data[r] = 0.0
            self.free.append(r)


def mean_of(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@register
class Dsde(Policy):
    name = "dsde"
    Config = DsdeConfig

    def __init__(self, config=None, **kw):
        super().__init__(config, **kw)
        self.kl = KlHistories(self.cfg.long_window)
        self.last_mu: Dict[int, float] = {}  # warm-up: mu_KL,last per sequence, for the lengths at calibration
        self.kl_pre: List[float] = []  # warm-up KL values: SL_max is calibrated on them
        self.warm_left = self.cfg.warmup_steps
        self.sl_max = self.cfg.sl_a_max
        self.lengths: Dict[int, int] = {}  # SL^ per sequence, from its latest KL values
        self._arms = {k: Arm(self.cfg.drafter, k) for k in range(self.sl_max + 1)}  # immutable, shared

    def length_for(self, seq_id: int) -> int:
        if self.warm_left > 0:
            return self.sl_max
        return self.lengths.get(seq_id, self.sl_max)

    def decide(self, ctx: StepContext) -> Decision:
        if self.cfg.drafter not in resident_names(ctx):
            return Decision(arms={})
        ids = [v.seq_id for v in ctx.sequences]
        if self.warm_left > 0:
            lengths = [self.sl_max] * len(ids)
        else:
            get, sl_max = self.lengths.get, self.sl_max
            lengths = [get(i, sl_max) for i in ids]
        if self.cfg.batch_cap and lengths:
            cap = batch_cap(lengths)
            if max(lengths) > cap:
                lengths = [k if k < cap else cap for k in lengths]
        # lengths are >= SL_min >= 1
        return Decision(arms=dict(zip(ids, map(self._arms.__getitem__, lengths))))

    def observe(self, outcome: StepOutcome) -> None:
        values = [s.kl for s in outcome.sequences]
        if all(values):  # the usual step: every sequence drafted with the model drafter
            ids = [s.seq_id for s in outcome.sequences]
        else:
            ids = [s.seq_id for s in outcome.sequences if s.kl]
            values = [v for v in values if v]
            if not values:
                return
        lens = set(map(len, values))
        groups = [(ids, values)] if len(lens) == 1 else [
            ([i for i, v in zip(ids, values) if len(v) == k], [v for v in values if len(v) == k]) for k in lens]
        for ids, values in groups:
            k = len(values[0])
            rows = self.kl.push(ids, values, k)
            if self.warm_left > 0:
                self.last_mu.update(zip(ids, map(mean_of, values)))  # needed once, at calibration
                self.kl_pre.extend(chain.from_iterable(values))
            else:
                self._update_lengths(ids, rows, k)
        if self.warm_left > 0:
            self.warm_left -= 1
            if self.warm_left == 0:  # calibrate, then every sequence with history gets its SL^
                self.sl_max = calibrate_sl_max(self.cfg.sl_a_max, self.kl_pre)
                self._arms = {k: Arm(self.cfg.drafter, k) for k in range(self.sl_max + 1)}
                self.lengths.clear()
                ids = list(self.kl.rows)
                self._update_lengths(ids, self.kl.rows_of(ids), 0,
                                     np.array([self.last_mu.get(i, 0.0) for i in ids]))
                self.last_mu.clear()

    def _update_lengths(self, ids, rows: np.ndarray, k: int, mu=None) -> None:
        """SL^ of the given sequences from their history rows (`KlHistories`);
        mu_KL,last is the mean of the k newest values unless given."""
        c = self.cfg
        m = moment_weights(c.delta, c.short_window, c.long_window, k).T @ rows.T  # [S1 | S2 | S0 | S0 | 2 mu, rows]
        if mu is not None:
            m[8] = 2.0 * mu
        self.lengths.update(zip(ids, lengths_from_moments(m, self.sl_max, c.sl_min).tolist()))

    def on_request_end(self, seq_id: int) -> None:
        self.kl.drop(seq_id)
        self.last_mu.pop(seq_id, None)
        self.lengths.pop(seq_id, None)
