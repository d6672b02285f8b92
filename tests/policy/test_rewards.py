import math

import pytest

from policy import rewards
from helpers import outcome, seq


def test_acceptance_length_includes_bonus():
    assert rewards.acceptance_length(seq(accepted=0)) == 1
    assert rewards.acceptance_length(seq(gamma=4, accepted=4)) == 5


def test_bd_reward_worked_example():
    # MetaSD Eq. 4: (1/N_max) sum_j (1 - TV_j); TV = (0.1, 0.3, 0.6), N_max = 4 -> (0.9+0.7+0.4)/4
    assert rewards.bd_reward(seq(gamma=4, tv=[0.1, 0.3, 0.6]), 4) == pytest.approx(0.5)
    # model-free drafter: q one-hot -> 1 - TV = p(x)
    assert rewards.bd_reward(seq(drafter="ngram", gamma=2, p_draft=[0.8, 0.2]), 2) == pytest.approx(0.5)


def test_be_reward():
    assert rewards.be_reward(seq(gamma=4, accepted=3), 4) == 0.75


def test_bd_reward_matches_tv_of_distributions():
    p, q = [0.7, 0.2, 0.1], [0.5, 0.4, 0.1]
    tv = rewards.total_variation(p, q)
    assert tv == pytest.approx(0.2)
    assert 1 - tv == pytest.approx(sum(min(a, b) for a, b in zip(p, q)))  # acceptance prob


def test_kl_clamps_zero_probs():
    assert math.isfinite(rewards.kl_divergence([1.0, 0.0], [0.0, 1.0]))
    assert rewards.kl_divergence([0.3, 0.7], [0.3, 0.7]) == pytest.approx(0.0)


def test_tokens_per_second_and_latency_with_switch_penalty():
    o = outcome([seq(0, accepted=2), seq(1, accepted=0)], total=0.04)  # emitted 3 + 1
    assert rewards.tokens_per_second(o) == pytest.approx(100.0)
    assert rewards.latency_per_token(o) == pytest.approx(0.01)
    assert rewards.latency_per_token(o, prev_gamma=0, gamma=4, c_switch_s=0.02) == pytest.approx(0.015)
    assert rewards.latency_per_token(o, prev_gamma=2, gamma=4, c_switch_s=0.02) == pytest.approx(0.01)


def test_acceptance_trials_geometric():
    assert rewards.acceptance_trials(seq(gamma=4, accepted=1)) == (1, 2)
    assert rewards.acceptance_trials(seq(gamma=3, accepted=3)) == (3, 3)
