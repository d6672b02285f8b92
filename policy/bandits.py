"""Bandit index formulas (pure) and tiny stateful bandits over arm indices 0..K-1.

The stateful classes share one template: `select() -> arm`, `update(arm, reward)`.
Counts and ties live in the base; each subclass states its formula and paper.
Rewards are "larger is better" except EXP3Spec, which takes a loss in [0, 1].
"""
from __future__ import annotations

import math
import random
from collections import deque
from typing import List, Sequence

import numpy as np


# ---------------------------------------------------------------- pure formulas
def ucb1_index(mean: float, n: float, t: float, beta: float) -> float:
    """MetaSD-UCB (Alg. 2): mu_i + beta * sqrt(2 ln t / n_i); inf for unplayed arms.

    >>> round(ucb1_index(0.5, 4, 16, 1.0), 4)   # 0.5 + sqrt(2 ln 16 / 4)
    1.6774
    """
    if n <= 0:
        return math.inf
    return mean + beta * math.sqrt(2.0 * math.log(max(t, 1.0)) / n)


def ucbspec_radius(n: int, t: int, k: int, max_len: int, delta: float = 0.5) -> float:
    """BanditSpec UCBSpec confidence radius
    cr_i = (L/2) * sqrt( (1+n)/n^2 * (1 + 2 ln(K t^2 sqrt(1+n) / delta)) ).

    >>> round(ucbspec_radius(n=1, t=2, k=2, max_len=4, delta=0.5), 4)
    7.6096
    """
    if n <= 0:
        return math.inf
    log_term = math.log(k * t * t * math.sqrt(1.0 + n) / delta)
    return (max_len / 2.0) * math.sqrt((1.0 + n) / (n * n) * (1.0 + 2.0 * log_term))


def exp3spec_probs(cum_loss: Sequence[float], t: int) -> List[float]:
    """BanditSpec EXP3Spec: p_i ∝ exp(-eta_t * sum_s Z_i,s), eta_t = sqrt(ln K / (t K)).

    >>> [round(p, 4) for p in exp3spec_probs([0.0, 2.0], t=1)]   # eta = sqrt(ln2/2)=0.5887
    [0.7645, 0.2355]
    """
    k = len(cum_loss)
    eta = math.sqrt(math.log(k) / (max(t, 1) * k)) if k > 1 else 0.0
    low = min(cum_loss)
    w = [math.exp(-eta * (c - low)) for c in cum_loss]
    s = sum(w)
    return [x / s for x in w]


def exp3spec_loss_estimate(loss01: float, p_arm: float) -> float:
    """Importance-weighted loss Z = loss / p_i for the played arm, where
    loss01 = (L + 1 - y) / L for acceptance-length rewards.

    >>> exp3spec_loss_estimate((4 + 1 - 3) / 4, 0.25)
    2.0
    """
    return loss01 / p_arm


def exp3_probs(weights: Sequence[float], gamma: float) -> List[float]:
    """MetaSD-EXP3 (Alg. 7, Auer et al.): p_i = (1-gamma) w_i / sum w + gamma / K.

    >>> exp3_probs([3.0, 1.0], 0.4)
    [0.65, 0.35]
    """
    s, k = sum(weights), len(weights)
    return [round((1.0 - gamma) * w / s + gamma / k, 12) for w in weights]


def _argmax(values: Sequence[float], rng: random.Random) -> int:
    best = max(values)
    ties = [i for i, v in enumerate(values) if v == best]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def _sample(probs: Sequence[float], rng: random.Random) -> int:
    u, acc = rng.random(), 0.0
    for i, p in enumerate(probs):
        acc += p
        if u < acc:
            return i
    return len(probs) - 1


# ---------------------------------------------------------------- stateful bandits
class Bandit:
    """Template: plays every arm once (round robin), then `choose()`."""

    def __init__(self, n_arms: int, rng: random.Random):
        if n_arms < 1:
            raise ValueError("a bandit needs at least one arm")
        self.k, self.rng = n_arms, rng
        self.counts = [0] * n_arms
        self.sums = [0.0] * n_arms
        self.t = 0

    def mean(self, i: int) -> float:
        return self.sums[i] / self.counts[i] if self.counts[i] else 0.0

    def select(self) -> int:
        for i, n in enumerate(self.counts):
            if n == 0:
                return i
        return self.choose()

    def choose(self) -> int:
        return _argmax([self.mean(i) for i in range(self.k)], self.rng)

    def update(self, arm: int, reward: float) -> None:
        self.t += 1
        self.counts[arm] += 1
        self.sums[arm] += reward


class UCB(Bandit):
    """MetaSD-UCB (003, Alg. 2): argmax mu_i + beta sqrt(2 ln t / n_i)."""

    def __init__(self, n_arms, rng, beta: float = 1.0):
        super().__init__(n_arms, rng)
        self.beta = beta

    def choose(self) -> int:
        return _argmax([ucb1_index(self.mean(i), self.counts[i], self.t, self.beta)
                        for i in range(self.k)], self.rng)


class DiscountedUCB(Bandit):
    """Discounted UCB (003, Alg. 6; Kocsis & Szepesvari 2006): every past reward
    and count is multiplied by `discount` per round, so old evidence fades."""

    def __init__(self, n_arms, rng, beta: float = 1.0, discount: float = 0.95):
        super().__init__(n_arms, rng)
        self.beta, self.discount = beta, discount
        self.dcounts = [0.0] * n_arms
        self.dsums = [0.0] * n_arms

    def choose(self) -> int:
        total = sum(self.dcounts)
        return _argmax([ucb1_index(self.dsums[i] / self.dcounts[i] if self.dcounts[i] > 0 else 0.0,
                                   self.dcounts[i], total, self.beta) for i in range(self.k)], self.rng)

    def update(self, arm, reward):
        super().update(arm, reward)
        self.dcounts = [c * self.discount for c in self.dcounts]
        self.dsums = [s * self.discount for s in self.dsums]
        self.dcounts[arm] += 1.0
        self.dsums[arm] += reward


class SlidingWindowUCB(Bandit):
    """Sliding-window UCB (003, Alg. 8; Garivier & Moulines 2011): means and counts
    over the last `window` rounds only."""

    def __init__(self, n_arms, rng, beta: float = 1.0, window: int = 50):
        super().__init__(n_arms, rng)
        self.beta = beta
        self.history: deque = deque(maxlen=window)
        self.wcounts = [0] * n_arms
        self.wsums = [0.0] * n_arms

    def select(self) -> int:
        for i, n in enumerate(self.wcounts):
            if n == 0:
                return i
        return self.choose()

    def choose(self) -> int:
        t = min(self.t, self.history.maxlen)
        return _argmax([ucb1_index(self.wsums[i] / self.wcounts[i], self.wcounts[i], t, self.beta)
                        for i in range(self.k)], self.rng)

    def update(self, arm, reward):
        super().update(arm, reward)
        if len(self.history) == self.history.maxlen:
            old_arm, old_r = self.history[0]
            self.wcounts[old_arm] -= 1
            self.wsums[old_arm] -= old_r
        self.history.append((arm, reward))
        self.wcounts[arm] += 1
        self.wsums[arm] += reward


class EXP3(Bandit):
    """MetaSD-EXP3 (003, Alg. 7; Auer et al. 2002), rewards in [0, 1]:
    w_j <- w_j exp(gamma * r_hat_j / K), r_hat = r / p for the played arm."""

    def __init__(self, n_arms, rng, gamma: float = 0.4):
        super().__init__(n_arms, rng)
        self.gamma = gamma
        self.log_w = [0.0] * n_arms

    def probs(self) -> List[float]:
        """The current draw probabilities; `update` recomputes the ones `select` drew with
        (nothing changed them in between), so an update needs no state from the draw."""
        top = max(self.log_w)
        return exp3_probs([math.exp(w - top) for w in self.log_w], self.gamma)

    def select(self) -> int:
        return _sample(self.probs(), self.rng)

    def update(self, arm, reward):
        p = self.probs()[arm]
        super().update(arm, reward)
        self.log_w[arm] += self.gamma * (reward / p) / self.k


class SequentialHalving(Bandit):
    """Sequential Halving (003, Alg. 5; Karnin et al. 2013) for switching costs:
    ceil(log2 K) phases, each pulls every surviving arm n_t = floor(T/(|S| ceil(log2 K)))
    times in a row (few switches), then keeps the better half by summed reward.
    (The paper's Alg. 5 line 6 keeps the *lower* half — a typo; we keep the top.)
    After the budget T the survivor is played forever."""

    def __init__(self, n_arms, rng, budget: int = 64):
        super().__init__(n_arms, rng)
        self.phases = max(1, math.ceil(math.log2(n_arms))) if n_arms > 1 else 0
        self.budget = budget
        self.survivors = list(range(n_arms))
        self._start_phase()

    def _start_phase(self):
        self.per_arm = max(1, self.budget // (len(self.survivors) * max(self.phases, 1)))
        self.phase_sums = {i: 0.0 for i in self.survivors}
        self.phase_counts = {i: 0 for i in self.survivors}

    def select(self) -> int:
        if len(self.survivors) == 1:
            return self.survivors[0]
        for i in self.survivors:  # pull arms one after another: one switch per arm
            if self.phase_counts[i] < self.per_arm:
                return i
        return self.survivors[0]

    def update(self, arm, reward):
        super().update(arm, reward)
        if arm not in self.phase_counts or len(self.survivors) == 1:
            return
        self.phase_counts[arm] += 1
        self.phase_sums[arm] += reward
        if all(self.phase_counts[i] >= self.per_arm for i in self.survivors):
            ranked = sorted(self.survivors, key=lambda i: -self.phase_sums[i])
            self.survivors = ranked[: math.ceil(len(ranked) / 2)]
            if len(self.survivors) > 1:
                self._start_phase()


class UCBSpec(Bandit):
    """BanditSpec UCBSpec (004): round robin, then argmax mu_i + cr_i with
    cr_i = ucbspec_radius(n_i, t, K, L, delta). `width` is the reward range the
    radius is scaled for (L for acceptance lengths in [1, L+1]); callers with
    other rewards (throughput) set it to their observed range."""

    def __init__(self, n_arms, rng, max_len: int = 4, delta: float = 0.5):
        super().__init__(n_arms, rng)
        self.max_len, self.delta = max_len, delta
        self.width = float(max_len)

    def choose(self) -> int:
        scale = self.width / self.max_len if self.max_len > 0 else 1.0
        return _argmax([self.mean(i) + scale * ucbspec_radius(self.counts[i], self.t, self.k, self.max_len,
                                                             self.delta) for i in range(self.k)], self.rng)


class EXP3Spec(Bandit):
    """BanditSpec EXP3Spec (004): p_i ∝ exp(-eta_t sum Z_i), Z = loss/p_i for the
    played arm. `update` takes a loss in [0, 1] (e.g. (L+1-y)/L)."""

    def __init__(self, n_arms, rng):
        super().__init__(n_arms, rng)
        self.cum_loss = [0.0] * n_arms

    def probs(self) -> List[float]:
        """The current draw probabilities (`update` recomputes the ones `select` drew with)."""
        return exp3spec_probs(self.cum_loss, self.t + 1)

    def select(self) -> int:
        return _sample(self.probs(), self.rng)

    def update(self, arm, loss01):
        p = self.probs()[arm]
        super().update(arm, 1.0 - loss01)
        self.cum_loss[arm] += exp3spec_loss_estimate(loss01, p)


class UCBRows:
    """Many independent MetaSD-UCB bandits — one per running request, keyed by
    seq_id — as rows of [rows, K] arrays, so one step selects and updates all of
    them with a few array operations instead of a Python bandit per sequence.
    Same rule as `UCB`: play unplayed arms first (lowest index), then argmax of
    `ucb1_index`; exact ties are broken uniformly at random (one vectorised draw
    per step from a generator seeded by the injected rng, instead of one
    rng.choice per tied bandit). A bandit's round count t is the sum of its row
    of counts.

    While the same batch selects and updates step after step (the usual case),
    its rows live in a contiguous block (no gather per step; updates index the
    block's flat view) and are written back when the batch changes: at 64
    sequences the cost is the number of numpy calls, not the arithmetic."""

    def __init__(self, n_arms: int, rng: random.Random, beta: float = 1.0, capacity: int = 64):
        self.k, self.rng, self.beta = n_arms, rng, beta
        self.rows: dict = {}  # key -> row
        self.free = list(range(capacity - 1, -1, -1))
        self.counts, self.sums = np.zeros((capacity, n_arms)), np.zeros((capacity, n_arms))
        self._tie_rng = None
        self._keys: list = []  # the batch in the block, its rows, its counts and sums
        self._idx = np.zeros(0, dtype=np.int64)
        self._n, self._s = np.zeros((0, n_arms)), np.zeros((0, n_arms))
        self._cell0 = np.zeros(0, dtype=np.int64)  # flat offset of each block row
        self._all_played = False

    def row(self, key) -> int:
        r = self.rows.get(key)
        if r is None:
            if not self.free:  # grow: double the rows
                cap = len(self.counts)
                self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
                self.sums = np.concatenate([self.sums, np.zeros_like(self.sums)])
                self.free = list(range(2 * cap - 1, cap - 1, -1))
            r = self.rows[key] = self.free.pop()
        return r

    def _batch(self, keys: Sequence) -> None:
        """Bring `keys`' rows into the block (a no-op for the same batch as last time)."""
        if keys != self._keys:
            self._write_back()
            self._idx = np.array([self.row(key) for key in keys], dtype=np.int64)
            self._keys = list(keys)
            self._n, self._s = self.counts.take(self._idx, axis=0), self.sums.take(self._idx, axis=0)
            self._cell0 = np.arange(0, len(keys) * self.k, self.k)
            self._all_played = False

    def _write_back(self) -> None:
        if self._keys:
            self.counts[self._idx], self.sums[self._idx] = self._n, self._s
            self._keys = []

    def reset(self, key) -> None:
        """A fresh bandit for `key` (MetaSD re-initialises per request)."""
        self.remove(key)
        self.row(key)

    def remove(self, key) -> None:
        self._write_back()
        r = self.rows.pop(key, None)
        if r is not None:
            self.counts[r] = self.sums[r] = 0.0
            self.free.append(r)

    def mean(self, key, arm: int) -> float:
        self._write_back()
        r = self.rows.get(key)
        if r is None or not self.counts[r, arm]:
            return 0.0
        return float(self.sums[r, arm] / self.counts[r, arm])

    def indices(self, keys: Sequence) -> np.ndarray:
        """[len(keys), K]: `ucb1_index` of every arm of each key's bandit (inf: not played yet)."""
        self._batch(keys)
        return self._index()[0]

    def _index(self):
        n = self._n  # [m, K]
        t = n.sum(axis=1)  # each bandit's rounds so far
        unplayed = None
        if not self._all_played:  # counts only grow: once every arm of the block is played, no more checks
            if n.min() > 0:
                self._all_played = True
            else:  # some bandit is still in its round robin
                unplayed = n == 0
                n = np.where(unplayed, 1.0, n)
                t = np.maximum(t, 1.0)
        index = self._s / n + self.beta * np.sqrt(2.0 * np.log(t)[:, None] / n)  # ucb1_index
        if unplayed is not None:
            index[unplayed] = np.inf
        return index, unplayed

    def select(self, keys: Sequence) -> List[int]:
        self._batch(keys)
        index, unplayed = self._index()
        if unplayed is None:
            first_unplayed, choice = None, index.argmax(axis=1)
        else:  # round robin first: the lowest unplayed arm
            first_unplayed = unplayed.any(axis=1)
            choice = np.where(first_unplayed, unplayed.argmax(axis=1), index.argmax(axis=1))
        if self.k == 2:  # the usual two drafters: a tie is one comparison and a coin
            ties, is_top = index[:, 0] == index[:, 1], None
        else:
            is_top = index == index.max(axis=1)[:, None]
            ties = is_top.sum(axis=1) > 1
        if first_unplayed is not None:
            ties &= ~first_unplayed
        if ties.any():  # uniform among the tied arms, all tied rows in one draw
            if is_top is None:
                choice = np.where(ties, self._uniform(len(index)) < 0.5, choice)
            else:
                choice = np.where(ties, np.where(is_top, self._uniform(index.shape), -1.0).argmax(axis=1), choice)
        return choice.tolist()

    def _uniform(self, shape) -> np.ndarray:
        if self._tie_rng is None:  # drawn from the injected rng the first time it is needed
            self._tie_rng = np.random.default_rng(self.rng.getrandbits(64))
        return self._tie_rng.random(shape)

    def update(self, keys: Sequence, arms: Sequence[int], rewards) -> None:
        self._batch(keys)
        cell = self._cell0 + arms  # keys are distinct, so no cell repeats
        self._n.reshape(-1)[cell] += 1.0  # views of the contiguous block
        self._s.reshape(-1)[cell] += rewards
