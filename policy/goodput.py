"""Goodput math (pure): expected emitted tokens and step time -> tokens per second.

Two acceptance models:
* geometric (SmartSpec, ours): i.i.d. per-token acceptance alpha,
  E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per sequence.
* confidence (AdaSpec 001): C_{i,s} = prod_{m<=s} p_{i,m}, E = B + sum_i sum_{s<=k_i} C_{i,s}.
AdaSpec's step-time model reads a `profiles.StepTimeProfile`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .profiles import StepTimeProfile


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected emitted tokens for one sequence (accepted + 1), geometric model.

    >>> round(expected_tokens(0.5, 2), 4), expected_tokens(1.0, 3), expected_tokens(0.7, 0)
    (1.75, 4.0, 1.0)
    """
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def cumulative_confidence(p: Sequence[float]) -> List[float]:
    """C_s = prod_{m<=s} p_m (AdaSpec).

    >>> cumulative_confidence([0.9, 0.5, 0.5])
    [0.9, 0.45, 0.225]
    """
    out, c = [], 1.0
    for x in p:
        c *= x
        out.append(round(c, 12))
    return out


def expected_emitted(cum_conf: Sequence[Sequence[float]], lengths: Sequence[int]) -> float:
    """E = B + sum_i sum_{s<=k_i} C_{i,s}.

    >>> expected_emitted([[0.9, 0.45], [0.5, 0.25]], [2, 1])
    3.85
    """
    return round(len(cum_conf) + sum(sum(c[:k]) for c, k in zip(cum_conf, lengths)), 12)


def expected_emitted_uniform(cum_conf: Sequence[float], k: int, batch: int) -> float:
    """`expected_emitted` when all `batch` sequences share cum_conf and length k
    (AdaSpec's c̄ predictions): the same sum, without building B lists.

    >>> expected_emitted_uniform([0.6, 0.36], 2, 3) == expected_emitted([[0.6, 0.36]] * 3, [2] * 3)
    True
    """
    return round(batch + sum([sum(cum_conf[:k])] * batch), 12)


def adaspec_step_time(profile: StepTimeProfile, k: int, batch: int, seq_len_sum: int,
                      draft_steps: Optional[int] = None, n_tokens: Optional[int] = None) -> float:
    """AdaSpec step time T(k) = T_draft(k) + T_target(k):
    T_draft  = k t_d[bucket((S + kB)/B)][B] + [k>0] o_d[B]
    T_target = t_t[bucket(ctx_t)][(k+1)B] + o_t[(k+1)B]
               (a profile by shape of an engine that does not pad: T by the step's shape,
               `StepTimeProfile.target_step`),
    ctx_t = ((k+1)S + B(k^2+k)/2) / ((k+1)B).
    `draft_steps` (default k) and `n_tokens` (default (k+1)B) let per-request
    lengths k_i replace the uniform k after elimination.
    """
    d = k if draft_steps is None else draft_steps
    n = (k + 1) * batch if n_tokens is None else n_tokens
    t_draft = 0.0
    if d > 0:
        t_draft = d * profile.draft((seq_len_sum + d * batch) / batch, batch) + profile.draft_overhead(batch)
    ctx_t = ((k + 1) * seq_len_sum + batch * (k * k + k) / 2) / ((k + 1) * batch)
    return t_draft + profile.target_step(ctx_t, n, batch, k)


def slo_goodput(emitted: float, step_time: float, tpot_slo_s: Optional[float]) -> float:
    """G = E / T, or -1 when the predicted step time breaks the TPOT SLO (AdaSpec).

    >>> slo_goodput(2.0, 0.05, None), slo_goodput(2.0, 0.05, 0.04)
    (40.0, -1.0)
    """
    if tpot_slo_s is not None and step_time > tpot_slo_s:
        return -1.0
    return emitted / step_time


def eliminate(cum_conf: Dict[int, List[float]], goodput_of) -> Dict[int, int]:
    """AdaSpec confidence-prior verifier: start from every drafted token; repeatedly
    drop the kept tail token with the lowest cumulative confidence (over all
    sequences, re-evaluated after each removal), keeping the removal only while
    `goodput_of(lengths)` does not drop. Never removes more than was drafted.

    >>> g = lambda ks: (2 + sum(sum(c[:ks[i]]) for i, c in C.items())) / (1 + 0.3 * sum(ks.values()))
    >>> C = {0: [0.9, 0.8], 1: [0.2, 0.1]}
    >>> eliminate(C, g)
    {0: 2, 1: 0}
    """
    lengths = {i: len(c) for i, c in cum_conf.items()}
    best = goodput_of(lengths)
    while True:
        tails = [(c[lengths[i] - 1], i) for i, c in cum_conf.items() if lengths[i] > 0]
        if not tails:
            return lengths
        _, worst = min(tails)
        trial = dict(lengths)
        trial[worst] -= 1
        g = goodput_of(trial)
        if g < best:
            return lengths
        lengths, best = trial, g
