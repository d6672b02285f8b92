"""StepOutcome -> reward: pure functions shared by every policy.

Each policy's docstring names the reward it learns from. Vocabulary as in
ALGORITHMS.md: a step emits accepted + 1 tokens per sequence; p = target, q = draft.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Sequence

import numpy as np

from .types import SequenceOutcome, StepOutcome

PROB_FLOOR = 1e-8  # DSDE clamps probabilities before taking logs


def acceptance_length(seq: SequenceOutcome) -> int:
    """BanditSpec's y = accepted + 1 (bonus or recovered token), in [1, gamma+1].

    >>> acceptance_length(SequenceOutcome(0, "d", 4, accepted=3, emitted=4))
    4
    """
    return seq.accepted + 1


def mean_acceptance_length(outcome: StepOutcome) -> float:
    """Batch average of acceptance_length (BanditSpec reward for B > 1)."""
    if not outcome.sequences:
        return 1.0
    return sum(acceptance_length(s) for s in outcome.sequences) / len(outcome.sequences)


def be_reward(seq: SequenceOutcome, n_max: int) -> float:
    """MetaSD block-efficiency reward N_acc / N_max.

    >>> be_reward(SequenceOutcome(0, "d", 4, accepted=2, emitted=3), 4)
    0.5
    """
    return seq.accepted / n_max if n_max > 0 else 0.0


def bd_reward(seq: SequenceOutcome, n_max: int) -> float:
    """MetaSD block-divergence reward (1/N_max) * sum_j (1 - TV(p_j, q_j)).

    Uses the recorded per-position TV; for model-free drafters (no tv recorded) q is
    one-hot at the proposed token, so 1 - TV = p(x), the target prob of the draft.

    >>> bd_reward(SequenceOutcome(0, "d", 2, 1, 2, tv=[0.1, 0.5]), 2)
    0.7
    >>> bd_reward(SequenceOutcome(0, "ngram", 2, 1, 2, p_draft=[0.9, 0.3]), 4)
    0.3
    """
    if n_max <= 0:
        return 0.0
    if seq.tv:
        return round(sum(1.0 - t for t in seq.tv) / n_max, 12)
    return round(sum(seq.p_draft) / n_max, 12)


def tokens_per_second(outcome: StepOutcome) -> float:
    """Goodput g: tokens emitted by the whole batch / step wall time.

    >>> tokens_per_second(StepOutcome(0, 2, [SequenceOutcome(0, None, 0, 0, 1),
    ...     SequenceOutcome(1, None, 0, 0, 1)], total_time_s=0.05))
    40.0
    """
    t = outcome.total_time_s or (outcome.draft_time_s + outcome.verify_time_s + outcome.accept_time_s)
    return outcome.emitted / t if t > 0 else 0.0


def switching_penalty(prev_gamma: int, gamma: int, c_switch_s: float) -> float:
    """Nightjar's 1(gamma_prev = 0 and gamma > 0) * C_switch / gamma, in seconds.

    >>> switching_penalty(0, 4, 0.02), switching_penalty(2, 4, 0.02)
    (0.005, 0.0)
    """
    return c_switch_s / gamma if (prev_gamma == 0 and gamma > 0) else 0.0


def latency_per_token(outcome: StepOutcome, prev_gamma: int = 0, gamma: int = 0,
                      c_switch_s: float = 0.0) -> float:
    """Nightjar's loss l = 1/g (seconds per emitted token) + switching penalty.

    >>> latency_per_token(StepOutcome(0, 1, [SequenceOutcome(0, "d", 3, 2, 3)], total_time_s=0.06),
    ...                   prev_gamma=0, gamma=3, c_switch_s=0.03)
    0.03
    """
    g = tokens_per_second(outcome)
    base = 1.0 / g if g > 0 else float("inf")
    return base + switching_penalty(prev_gamma, gamma, c_switch_s)


def kl_divergence(p: Sequence[float], q: Sequence[float], floor: float = PROB_FLOOR) -> float:
    """KL(p || q) = sum p (log p - log q), probabilities clamped >= floor (DSDE).

    >>> round(kl_divergence([0.5, 0.5], [0.9, 0.1]), 4)
    0.5108
    """
    total = 0.0
    for pi, qi in zip(p, q):
        pi, qi = max(pi, floor), max(qi, floor)
        total += pi * (math.log(pi) - math.log(qi))
    return total


def total_variation(p: Sequence[float], q: Sequence[float]) -> float:
    """TV(p, q) = 1/2 ||p - q||_1; 1 - TV is the speculative-sampling acceptance prob.

    >>> total_variation([0.5, 0.5], [0.9, 0.1])
    0.4
    """
    return round(0.5 * sum(abs(a - b) for a, b in zip(p, q)), 12)


def mean_kl(seq: SequenceOutcome) -> float:
    """DSDE's mu_KL over the positions verified this step (0 when none recorded)."""
    return sum(seq.kl) / len(seq.kl) if seq.kl else 0.0


def acceptance_trials(seq: SequenceOutcome) -> tuple:
    """(successes, trials) for a per-token acceptance rate under the geometric
    model: accepted tokens, plus one failed trial when the draft was cut short.

    >>> acceptance_trials(SequenceOutcome(0, "d", 4, 2, 3)), acceptance_trials(SequenceOutcome(0, "d", 4, 4, 5))
    ((2, 3), (4, 4))
    """
    return seq.accepted, seq.accepted + (1 if seq.accepted < seq.gamma else 0)


def bd_rewards(seqs: Sequence[SequenceOutcome]) -> np.ndarray:
    """`bd_reward(s, s.gamma)` for many sequences at once (one array pass per step;
    the rounding to 12 decimals is numpy's, so the last bit may differ).

    >>> bd_rewards([SequenceOutcome(0, "d", 2, 1, 2, tv=[0.1, 0.5]),
    ...             SequenceOutcome(1, "ngram", 4, 1, 2, p_draft=[0.9, 0.3])]).tolist()
    [0.7, 0.3]
    """
    vals = [s.tv or s.p_draft for s in seqs]
    is_tv = [bool(s.tv) for s in seqs]
    n_max = [s.gamma for s in seqs]
    lens = set(map(len, vals))
    if len(lens) == 1:  # the usual step: one length for all, a [m, k] array
        k = lens.pop()
        x = np.fromiter(chain.from_iterable(vals), float, len(vals) * k).reshape(len(vals), k)
        if all(is_tv):
            x = 1.0 - x  # 1 - TV
        elif any(is_tv):
            x = np.where(np.array(is_tv)[:, None], 1.0 - x, x)  # or p(x) for model-free drafters
        sums = x.sum(axis=1)
    else:
        sums = np.array([sum(1.0 - t for t in v) if tv else sum(v) for v, tv in zip(vals, is_tv)])
    if min(n_max) > 0:
        return np.round(sums / (n_max[0] if n_max.count(n_max[0]) == len(n_max) else np.array(n_max, float)), 12)
    n = np.array(n_max, dtype=float)
    return np.round(np.where(n > 0, sums / np.maximum(n, 1.0), 0.0), 12)


def be_rewards(seqs: Sequence[SequenceOutcome]) -> np.ndarray:
    """`be_reward(s, s.gamma)` for many sequences at once.

    >>> be_rewards([SequenceOutcome(0, "d", 4, accepted=2, emitted=3)]).tolist()
    [0.5]
    """
    acc = np.array([s.accepted for s in seqs], dtype=float)
    n_max = np.array([s.gamma for s in seqs], dtype=float)
    return np.where(n_max > 0, acc / np.maximum(n_max, 1.0), 0.0)
