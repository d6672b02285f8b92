"""Step-time model shaped like the CPU measurements in docs/environment.md (bf16,
SmolLM2-135M, 2 threads, context 128). Used by the simulator as ground truth and
to build default profile tables when no offline profile is given.

Measured (ms): decode B=1/8/32 = 43/48/72; verify B=1 k=1..8 ≈ 40-43;
verify B=8 k=1/2/4/8 = 48/55/60/76; prefill 512 tokens = 189.

Model (ms), k = draft tokens verified per sequence, n0 = 8 "free" extra tokens:
    M(B)        = 42 + 0.95 (B - 1)                      memory-bound decode
    T_target    = M(B) + c(B) * max(0, B k - n0),  c(B) = 0.5 B / 8
    T_draft     = k * 0.15 M(B)       (model drafter: one forward per draft token)
                = 0.1 + 0.02 B        (model-free n-gram lookup)
c(B) is fitted to the B=8 row (48.7/52.7/60.7/76.7 vs 48/55/60/76) and B=1
(flat up to k=8); its growth with B is our assumption (attention over B
contexts, compute saturation) that reproduces the papers' regime change:
speculation pays at batch 1 and costs at batch 32.
"""
from __future__ import annotations

MS = 1e-3
FREE_TOKENS = 8
DRAFT_FRACTION = 0.15
PREFILL_S_PER_TOKEN = 0.189 / 512


def decode_time_s(batch: int) -> float:
    """M(B): one plain decode step.

    >>> [round(decode_time_s(b) * 1e3, 2) for b in (1, 8, 32)]
    [42.0, 48.65, 71.45]
    """
    return (42.0 + 0.95 * (batch - 1)) * MS


def target_time_s(batch: int, k: int) -> float:
    """Target forward verifying k draft tokens for each of `batch` sequences.

    >>> [round(target_time_s(8, k) * 1e3, 2) for k in (0, 1, 2, 4, 8)]
    [48.65, 48.65, 52.65, 60.65, 76.65]
    """
    return verify_time_s(batch, batch * k)


def verify_time_s(batch: int, draft_tokens: int) -> float:
    """Target forward over `batch` sequences carrying `draft_tokens` drafts in total."""
    extra = max(0, draft_tokens - FREE_TOKENS)
    return decode_time_s(batch) + 0.5 * batch / 8.0 * extra * MS


def draft_time_s(batch: int, k: int, is_model: bool) -> float:
    """Proposing k tokens for each of `batch` sequences."""
    if k <= 0:
        return 0.0
    if is_model:
        return k * DRAFT_FRACTION * decode_time_s(batch)
    return (0.1 + 0.02 * batch) * MS


def step_time_s(batch: int, k: int, is_model: bool) -> float:
    return target_time_s(batch, k) + draft_time_s(batch, k, is_model)


def catch_up_time_s(l_max: int, batch: int) -> float:
    """C_switch: a model drafter re-reading l_max missed tokens for `batch` sequences
    (a drafter prefill, DRAFT_FRACTION of the target's)."""
    return DRAFT_FRACTION * PREFILL_S_PER_TOKEN * l_max * batch
