import math
import random

import pytest

from policy import bandits


def test_ucbspec_radius_worked_example():
    # (L/2) sqrt((1+n)/n^2 (1 + 2 ln(K t^2 sqrt(1+n)/delta))), n=1, t=2, K=2, L=4, delta=.5
    # = 2 * sqrt(2 * (1 + 2 ln(22.627))) = 2 * sqrt(2 * 7.2384) = 7.6096
    assert bandits.ucbspec_radius(1, 2, 2, 4, 0.5) == pytest.approx(7.6096, abs=1e-4)
    assert bandits.ucbspec_radius(10, 100, 5, 4, 0.5) < bandits.ucbspec_radius(5, 100, 5, 4, 0.5)
    assert bandits.ucbspec_radius(0, 1, 2, 4) == math.inf


def test_exp3spec_weights_worked_example():
    # eta_1 = sqrt(ln 2 / 2) = 0.5887; weights exp(0), exp(-2 eta) -> 0.7645, 0.2355
    p = bandits.exp3spec_probs([0.0, 2.0], t=1)
    assert p == pytest.approx([0.7645, 0.2355], abs=1e-4)
    # loss estimate Z = (L+1-y)/(L p): L=4, y=3, p=.25 -> 2
    assert bandits.exp3spec_loss_estimate((4 + 1 - 3) / 4, 0.25) == pytest.approx(2.0)
    # eta shrinks with t: later the same loss gap moves probabilities less
    assert bandits.exp3spec_probs([0.0, 2.0], t=100)[0] < p[0]


def test_exp3_mixing():
    assert bandits.exp3_probs([1.0, 1.0, 2.0], 0.4) == pytest.approx([0.2833333, 0.2833333, 0.4333333])


def test_ucb1_index():
    assert bandits.ucb1_index(0.5, 4, 16, 1.0) == pytest.approx(0.5 + math.sqrt(2 * math.log(16) / 4))


@pytest.mark.parametrize("make", [
    lambda r: bandits.UCB(3, r, 0.5),
    lambda r: bandits.DiscountedUCB(3, r, 0.5, 0.99),
    lambda r: bandits.SlidingWindowUCB(3, r, 0.5, 100),
    lambda r: bandits.EXP3(3, r, 0.1),
    lambda r: bandits.SequentialHalving(3, r, 60),
    lambda r: bandits.UCBSpec(3, r, 1, 0.5),
])
def test_bandits_find_best_bernoulli_arm(make):
    rng = random.Random(1)
    b = make(rng)
    means = [0.2, 0.5, 0.8]
    picks = []
    for _ in range(600):
        a = b.select()
        picks.append(a)
        b.update(a, 1.0 if rng.random() < means[a] else 0.0)
    assert picks[-200:].count(2) / 200 >= 0.8


def test_exp3spec_prefers_low_loss_arm():
    rng = random.Random(2)
    b = bandits.EXP3Spec(3, rng)
    picks = []
    for _ in range(1500):
        a = b.select()
        picks.append(a)
        b.update(a, [0.9, 0.6, 0.2][a])
    assert picks[-300:].count(2) / 300 >= 0.6


def test_sequential_halving_keeps_the_better_half():
    b = bandits.SequentialHalving(4, random.Random(0), budget=16)  # 2 phases, 2 pulls per arm first
    reward = [0.1, 0.9, 0.5, 0.3]
    for _ in range(16):
        a = b.select()
        b.update(a, reward[a])
    assert b.survivors == [1]


def test_sliding_window_forgets():
    b = bandits.SlidingWindowUCB(2, random.Random(0), beta=0.1, window=20)
    for _ in range(50):
        a = b.select()
        b.update(a, 1.0 if a == 0 else 0.0)
    for _ in range(60):  # arm 0 turns bad
        a = b.select()
        b.update(a, 0.0 if a == 0 else 1.0)
    assert b.select() == 1
