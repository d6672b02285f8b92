import math

import pytest
import torch

from backend.generation.sampling import SamplingParams, accept_greedy, accept_sampling, target_probs


def test_greedy_worked_example():
    # The module docstring's example.
    v = accept_greedy([5, 9, 7, 3], [5, 9, 4])
    assert (v.tokens, v.accepted) == ([5, 9, 7], 2)


def test_greedy_all_accepted_gives_bonus():
    v = accept_greedy([1, 2, 3], [1, 2])
    assert (v.tokens, v.accepted) == ([1, 2, 3], 2)


def test_greedy_no_draft_is_plain_decoding():
    assert accept_greedy([4], []).tokens == [4]


def test_top_k_and_top_p_filter():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.3 reaches 0.8
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert p[0, 2] > 0 and p[0, 3] == 0


def _chi2_ok(counts, probs, n):
    """Pearson chi-square against expected counts; threshold ~ p=0.001 for small dof."""
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs) if p > 0)
    dof = sum(1 for p in probs if p > 0) - 1
    return chi2 < dof + 6 * math.sqrt(2 * dof) + 10, chi2


@pytest.mark.parametrize("with_q", [False, True])
def test_rejection_sampling_preserves_target_distribution(with_q):
    """Emitted first token ~ p, whatever the draft (one-hot or a real q)."""
    g = torch.Generator().manual_seed(0)
    V = 6
    p = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.07, 0.03]] * 3)
    q = torch.tensor([[0.05, 0.05, 0.10, 0.20, 0.30, 0.30]] * 2)
    n = 30_000
    counts_first = [0] * V
    counts_second = [0] * V
    for _ in range(n):
        # the draft is sampled from q (model drafter) or fixed at the unlikely token 4 (one-hot)
        draft = [int(torch.multinomial(q[0], 1, generator=g)), int(torch.multinomial(q[1], 1, generator=g))] \
            if with_q else [4, 4]
        v = accept_sampling(p, draft, q if with_q else None, g)
        counts_first[v.tokens[0]] += 1
        if len(v.tokens) > 1:
            counts_second[v.tokens[1]] += 1
    ok, chi2 = _chi2_ok(counts_first, p[0].tolist(), n)
    assert ok, f"first emitted token deviates from p (chi2={chi2:.1f}): {counts_first}"
    # Given the first emitted token, the second is again ~ p (positions are i.i.d. here).
    m = sum(counts_second)
    ok, chi2 = _chi2_ok(counts_second, p[1].tolist(), m)
    assert ok, f"second emitted token deviates from p (chi2={chi2:.1f}): {counts_second}"


def test_positional_sampling_preserves_p_and_ignores_the_draft():
    """One-hot drafts verified by per-position sampling: emitted tokens ~ p, and the tokens
    do not depend on what was drafted (a seed reproduces its output under any policy)."""
    from backend.generation.sampling import accept_sampling_positional
    p = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.07, 0.03]] * 3)
    n = 20_000
    counts = [0] * 6
    for seed in range(n):
        v = accept_sampling_positional(p, [4, 4], seed, 100)
        counts[v.tokens[0]] += 1
        plain = accept_sampling_positional(p, [], seed, 100)
        assert v.tokens[0] == plain.tokens[0]  # same (seed, position), same token, drafts or not
    ok, chi2 = _chi2_ok(counts, p[0].tolist(), n)
    assert ok, f"emitted token deviates from p (chi2={chi2:.1f}): {counts}"
    v = accept_sampling_positional(p, [0, 0], 3, 7)
    assert v.tokens[: v.accepted] == [0] * v.accepted and len(v.tokens) == v.accepted + 1


def test_rejection_sampling_detects_a_biased_sampler():
    """The chi-square check itself can fail: a sampler that always accepts is caught."""
    p = [0.30, 0.25, 0.20, 0.15, 0.07, 0.03]
    counts = [0, 0, 0, 0, 30_000, 0]
    assert not _chi2_ok(counts, p, 30_000)[0]


def test_accept_sampling_counts():
    g = torch.Generator().manual_seed(1)
    p = torch.zeros(3, 5)
    p[:, 2] = 1.0  # target is certain of token 2
    v = accept_sampling(p, [2, 2], None, g)
    assert (v.tokens, v.accepted) == ([2, 2, 2], 2)
    v = accept_sampling(p, [3, 2], None, g)
    assert (v.tokens, v.accepted) == ([2], 0)


def test_divergences_of_a_draft_distribution():
    from backend.generation.sampling import divergences
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.25, 0.25]])
    kl, tv = divergences(p, q)
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and tv[0] == pytest.approx(0.0)
    assert kl[1] == pytest.approx(math.log(2.0), rel=1e-5)  # 1 * log(1 / 0.5)
    assert tv[1] == pytest.approx(0.5)
    kl_out, _ = divergences(torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]))  # q = 0 where p > 0
    assert math.isfinite(kl_out[0]) and kl_out[0] > 5
