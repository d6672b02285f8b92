"""StepOutcome -> reward: pure functions shared by every policy.

Each policy's docstring names the reward it learns from. Vocabulary as in
README.md ("The step protocol"): a step emits accepted + 1 tokens per sequence; p = target, q = draft.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence


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
    >>> round(bd_reward(SequenceOutcome(0, "ngram", 2, 1, 2, p_draft=[0.9, 0.3]), 4), 12)
    0.3
    """
    if n_max <= 0:
        return 0.0
    tv = seq.tv
    return ((len(tv) - sum(tv)) if tv else sum(seq.p_draft)) / n_max  # sum(1 - TV_j), in one pass


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


def acceptance_trials(seq: SequenceOutcome, planned: Optional[int] = None) -> tuple:
    """(successes, trials) for a per-token acceptance rate under the geometric
    model: accepted tokens, plus one failed trial when the draft was cut short of
    `planned` tokens (default: of what was drafted) by a rejection or by a drafter
    that had nothing more to propose.

    >>> acceptance_trials(SequenceOutcome(0, "d", 4, 2, 3)), acceptance_trials(SequenceOutcome(0, "d", 4, 4, 5))
    ((2, 3), (4, 4))
    >>> acceptance_trials(SequenceOutcome(0, "d", 0, 0, 1), 3), acceptance_trials(SequenceOutcome(0, "d", 2, 2, 3), 3)
    ((0, 1), (2, 3))
    """
    planned = seq.gamma if planned is None else max(planned, seq.gamma)
    if planned <= 0:
        return 0, 0
    return seq.accepted, seq.accepted + (1 if seq.accepted < planned else 0)
