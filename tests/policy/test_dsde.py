import random

import pytest

from policy import make_policy
from policy.dsde import batch_cap, calibrate_sl_max, predicted_length, stability_factor, weighted_variance, wvir
from helpers import ctx, outcome, seq


def test_weighted_variance_worked_example():
    # weights 1, .5 (delta=.5): mean = (1*1 + .5*0)/1.5 = 2/3; var = (1*(1/3)^2 + .5*(2/3)^2)/1.5 = 2/9
    assert weighted_variance([1.0, 0.0], 0.5) == pytest.approx(2 / 9)


def test_wvir_sf_sl_worked_example():
    assert wvir([0.2] * 30) == 1e6  # flat history: treated as large
    assert stability_factor(0.1) == pytest.approx(0.2214, abs=1e-4)
    # SF*WVIR = 0.3 -> (1 - 0.3)(10 - 2) + 2 = 7.6 -> 8
    assert predicted_length(0.2, 1.5, 10, 2) == 8
    assert predicted_length(0.4, 3.0, 10, 2) == 2  # SF*WVIR > 1
    assert calibrate_sl_max(8, [0.2, 0.4, 0.6]) == 14  # 8 * (1 + 0.4/0.6) = 13.3 -> 14
    assert batch_cap([2, 3, 10]) == 5


def _feed(pol, kls_per_step, seq_id=0):
    for kls in kls_per_step:
        pol.observe(outcome([seq(seq_id, gamma=len(kls), accepted=1, kl=list(kls))]))


def test_gamma_shrinks_when_kl_variance_rises():
    pol = make_policy("dsde", drafter="draft", sl_a_max=8, warmup_steps=2, rng=random.Random(0))
    rng = random.Random(0)
    _feed(pol, [[0.3 + rng.uniform(-0.02, 0.02) for _ in range(4)] for _ in range(12)])
    calm = pol.decide(ctx(batch=1)).arm_for(0).gamma
    _feed(pol, [[rng.choice([0.05, 1.2]) for _ in range(4)] for _ in range(3)])  # volatile KL
    volatile = pol.decide(ctx(batch=1)).arm_for(0).gamma
    assert volatile < calm
    assert volatile >= 2 and calm <= pol.sl_max


def test_batch_cap_limits_long_sequences():
    pol = make_policy("dsde", drafter="draft", sl_a_max=8, warmup_steps=0, rng=random.Random(0))
    _feed(pol, [[0.3, 0.31, 0.29, 0.3]] * 10, seq_id=0)  # stable -> long
    _feed(pol, [[0.05, 1.5, 0.05, 1.5]] * 3 + [[1.5, 0.05, 1.5, 0.05]], seq_id=1)  # volatile -> short
    d = pol.decide(ctx(batch=2))
    lengths = [d.arm_for(0).gamma, d.arm_for(1).gamma]
    assert max(lengths) <= batch_cap([pol.length_for(0), pol.length_for(1)])
