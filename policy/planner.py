"""The composite policy's plan for one step, as pure functions (docs/algorithms.md,
`## composite`): from each sequence's acceptance rate and the predicted step times,
how many tokens to draft and which sequences draft them."""
from __future__ import annotations

import math
from typing import Callable, FrozenSet, List, NamedTuple, Optional, Sequence

import numpy as np

from .goodput import expected_tokens

# step time of this batch with (tokens verified, draft length, sequences drafting with a model drafter)
StepTimeFn = Callable[[int, int, int], float]


class Plan(NamedTuple):
    gamma: int  # draft length of the drafting sequences; 0: plain decoding
    keep: FrozenSet[int]  # positions (in batch order) of the sequences that draft
    expected: float  # expected emitted tokens of the whole batch
    n_tokens: int  # tokens the target verifies
    n_model: int  # drafting sequences whose drafter is a model drafter
    index: float  # expected goodput, tokens/s


def expected_sums(alphas: Sequence[float], gamma_max: int, caps: Optional[Sequence[int]] = None) -> List[float]:
    """[sum_i E(alpha_i, min(g, cap_i)) for g in 0..gamma_max] (geometric model,
    `goodput.expected_tokens`); caps: the most tokens each sequence's drafter has ready
    (None: no limit).

    >>> [round(x, 4) for x in expected_sums([0.5, 0.5, 0.0], 2)]
    [3.0, 4.0, 4.5]
    >>> [round(x, 4) for x in expected_sums([0.5, 0.5], 2, caps=[1, 2])]   # the first stops at 1.5
    [2.0, 3.0, 3.25]
    """
    keys = list(alphas) if caps is None else list(zip(alphas, [min(c, gamma_max) for c in caps]))
    # E once per distinct (alpha, cap): many sequences share the global alpha
    table = {}
    for key in set(keys):
        a, cap = (key, gamma_max) if caps is None else key
        table[key] = [expected_tokens(a, min(g, cap)) for g in range(gamma_max + 1)]
    if len(table) == 1:
        (row,) = table.values()
        return [sum([x] * len(keys)) for x in row]
    return np.array([table[k] for k in keys]).sum(axis=0).tolist()


def optimism_bonus(counts: Sequence[int], total: int, optimism: float) -> List[float]:
    """Per gamma: optimism * sqrt(ln(total + 1) / (1 + n_gamma)), n_gamma the steps this
    batch-size bucket played gamma and total their sum + 1: rarely played lengths get
    tried, and the bonus fades as they are.

    >>> [round(b, 4) for b in optimism_bonus([3, 0], 4, 0.1)]   # sqrt(ln 5 / 4), sqrt(ln 5)
    [0.0634, 0.1269]
    """
    log_t = math.log(total + 1)
    return [optimism * math.sqrt(log_t / (1 + n)) for n in counts]


def plan_step(alphas: Sequence[float], model: Sequence[bool], times: Sequence[float], step_time: StepTimeFn,
              bonus: Sequence[float], slo: Optional[float], amortised: float, dynamic_depth: bool = False,
              batch: Optional[int] = None, caps: Optional[Sequence[int]] = None) -> Plan:
    """The plan for a batch whose drafters are already picked.

    alphas / model: per sequence that can draft, the acceptance rate of its drafter and
    whether that is a model drafter; batch: the batch size (default len(alphas); the
    others decode plainly); times[g]: predicted step time with every sequence that can
    draft drafting g tokens (times[0]: plain decoding); step_time: the same for other
    shapes (elimination); caps: per sequence that can draft, the most draft tokens it has
    ready (None: gamma_max): beyond it a longer gamma adds cost, not tokens;
    bonus[g]: optimism for gamma g (`optimism_bonus`); slo: the TPOT target (seconds per
    step, which emits at least one token per sequence), None for none; amortised: the
    model drafter's catch-up time, spread over the steps it serves.

    1. gamma = argmax_g G(g) (1 + bonus[g]), G(g) = sum_i E(alpha_i, g) / (T(g) + catch-up),
       over the g whose step time meets the SLO; plain decoding when none beats it, or
       when nothing meets the SLO.
    2. Elimination (AdaSpec's, with the geometric model): drop the lowest-alpha sequence
       from drafting while the batch's goodput rises.
    3. Dynamic depth: a lone sequence drafting with a model drafter plans gamma_max and
       lets `continue_drafting` stop it on the drafter's real confidences (a longer plan
       costs nothing when it stops early).

    >>> t = lambda n, g, m: 0.04 + 0.002 * n + 0.004 * g * (m > 0)   # a model drafter step
    >>> times = [t(1 + g, g, 1) for g in range(5)]
    >>> plan_step([0.8], [True], times, t, [0.0] * 5, None, 0.0)[:2]
    (4, frozenset({0}))
    >>> plan_step([0.1], [True], times, t, [0.0] * 5, None, 0.0)[:2]
    (0, frozenset())
    >>> plan_step([0.8], [True], times, t, [0.0] * 5, slo=0.05, amortised=0.0)[:2]   # only g = 1 fits
    (1, frozenset({0}))
    >>> p = plan_step([0.8], [False], [t(3 + g, 0, 0) for g in range(5)], t, [0.0] * 5, None, 0.0, batch=3)
    >>> p.gamma, p.keep, p.n_tokens, round(p.expected, 3)   # one of three can draft
    (4, frozenset({0}), 7, 5.362)
    >>> plan_step([0.8], [False], [t(3 + g, 0, 0) for g in range(5)], t, [0.0] * 5, None, 0.0, batch=3,
    ...           caps=[2]).gamma   # its drafter has 2 tokens ready
    2
    """
    k, gamma_max = len(alphas), len(times) - 1
    b = k if batch is None else batch
    t0 = times[0]
    best_g, best_val, t_full, e_tot = 0, b / t0 * (1.0 + bonus[0]), t0, float(b)
    if slo is not None and t0 > slo:
        best_val = -1.0
    if not k:
        return Plan(0, frozenset(), float(b), b, 0, b / t0)
    e_sum = [e + (b - k) for e in expected_sums(alphas, gamma_max, caps)]
    for g in range(1, gamma_max + 1):
        t = times[g] + amortised
        if slo is not None and t > slo:
            continue
        val = e_sum[g] / t * (1.0 + bonus[g])
        if val > best_val:
            best_g, best_val, t_full, e_tot = g, val, t, e_sum[g]
    g = best_g
    if g == 0 or best_val < 0:  # nothing beats plain decoding, or nothing meets the SLO
        return Plan(0, frozenset(), float(b), b, 0, b / t0)
    keep = set(range(k))
    n_model, n_tok = sum(model), b + k * g
    for i in sorted(range(k), key=alphas.__getitem__):  # lowest alpha first
        a, m = alphas[i], model[i]
        e_new = e_tot - (expected_tokens(a, g if caps is None else min(g, caps[i])) - 1.0)
        n_m = n_model - m
        t_new = step_time(n_tok - g, g if len(keep) > 1 else 0, n_m) + amortised * (n_m > 0)
        if e_new / t_new <= e_tot / t_full:
            break
        keep.discard(i)
        e_tot, t_full, n_tok, n_model = e_new, t_new, n_tok - g, n_m
        if not keep:
            break
    index = e_tot / t_full
    if dynamic_depth and b == 1 and k == 1 and n_model:
        t_max = step_time(1 + gamma_max, gamma_max, 1) + amortised
        if slo is None or t_max <= slo:
            g, e_tot, n_tok = gamma_max, expected_tokens(alphas[0], gamma_max), 1 + gamma_max
    return Plan(g, frozenset(keep), e_tot, n_tok, n_model, index)


def optimistic_goodput(alphas: Sequence[float], batch: int, times: Sequence[float], slo: Optional[float],
                       amortised: float) -> float:
    """Best goodput over gamma when the k drafting sequences have these (optimistic) alphas
    and the other batch - k decode plainly; times[g]: step time with the k drafting g.
    A plan with a model drafter competes with this index: at its expected alpha a model
    drafter, which costs draft steps and a catch-up, would never be tried where a
    model-free drafter pays at the prior.

    >>> round(optimistic_goodput([0.9], 2, [0.05, 0.06, 0.07], None, 0.0), 2)   # g=2: (1 + .9 + .81 + 1) / .07
    53.0
    """
    k = len(alphas)
    e_sum = expected_sums(alphas, len(times) - 1)
    best = 0.0
    for g in range(1, len(times)):
        t = times[g] + amortised
        if slo is None or t <= slo:
            best = max(best, (e_sum[g] + batch - k) / t)
    return best


def speculation_pays(alpha: float, times: Sequence[float], slo: Optional[float]) -> bool:
    """Whether some gamma >= 1, every sequence drafting at acceptance rate alpha, has a higher
    expected goodput than plain decoding: E(alpha, g) / T(g) > 1 / T(0) for a g whose step time
    meets the SLO (as in `plan_step`, plain decoding that misses the SLO loses to any g that
    meets it). times[g]: step time of the batch with every sequence drafting g.

    >>> speculation_pays(0.6, [0.010, 0.011, 0.012], None)   # E(.6, 1) = 1.6 for 10% more time
    True
    >>> speculation_pays(0.6, [0.010, 0.020, 0.030], None)   # a padded batch: each token costs a step
    False
    >>> speculation_pays(0.6, [0.010, 0.011, 0.012], slo=0.0105)
    False
    """
    t0 = times[0]
    plain = 1.0 / t0 if slo is None or t0 <= slo else -1.0
    return any(expected_tokens(alpha, g) / t > plain
               for g, t in enumerate(times) if g and (slo is None or t <= slo))
