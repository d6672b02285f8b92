import random

import pytest

from policy import make_policy
from policy.goodput import adaspec_step_time, cumulative_confidence, eliminate, expected_emitted
from policy.profiles import StepTimeProfile
from helpers import NGRAM, ctx, outcome, seq

# a hand-made profile: target time 10 ms + 1 ms per token, draft 2 ms per step, no overheads
PROFILE = StepTimeProfile((1024,), (1, 2, 4, 8), ((0.011, 0.012, 0.014, 0.018),),
                          ((0.002, 0.002, 0.002, 0.002),), (0.0,) * 4, (0.0,) * 4)


def test_step_time_worked_example():
    # k=2, B=2, S=200: T_draft = 2 * 2 ms; T_target = t_t[(k+1)B = 6 tokens] = 16 ms -> 20 ms
    assert adaspec_step_time(PROFILE, 2, 2, 200) == pytest.approx(0.020)
    # beyond the grid: the per-bucket linear fit (exact here: 10 ms + 1 ms/token) -> 16 tokens = 26 ms
    assert adaspec_step_time(PROFILE, 0, 16, 1600) == pytest.approx(0.026)


def test_goodput_from_confidences_worked_example():
    # C = [0.9, 0.45] and [0.5]: E = B + sum C = 2 + 1.35 + 0.5 = 3.85
    c = [cumulative_confidence([0.9, 0.5]), cumulative_confidence([0.5])]
    assert expected_emitted(c, [2, 1]) == pytest.approx(3.85)


def test_elimination_worked_example_reevaluates_across_sequences():
    # G = E / T with T = 10 + 1 per verified draft token; seq 1 is confident, seq 0 is not
    cum = {0: cumulative_confidence([0.3, 0.5]), 1: cumulative_confidence([0.95, 0.9, 0.9])}
    g = lambda ks: (2 + sum(sum(cum[i][:k]) for i, k in ks.items())) / (10 + sum(ks.values()))
    # removals in order of lowest tail C: seq0 pos2 (0.15), seq0 pos1 (0.3), then seq1 pos3 (0.77) would hurt
    assert eliminate(cum, g) == {0: 0, 1: 3}
    assert eliminate({0: []}, lambda ks: 1.0) == {0: 0}  # never past the available tokens


def _policy(**kw):
    return make_policy("adaspec", drafter="draft", gamma_max=6, rng=random.Random(0), **kw)


def test_skips_speculation_when_confidence_too_low():
    pol = _policy(initial_confidence=0.02)
    assert pol.decide(ctx(batch=1)).arms == {}
    assert _policy(initial_confidence=0.8).decide(ctx(batch=1)).arm_for(0).gamma == 6


def test_predict_execute_correct_stops_on_low_confidence():
    pol = _policy(initial_confidence=0.8)
    c = ctx(batch=1)
    pol.decide(c)
    assert pol.continue_drafting(c, 0, [0.9]) is True
    assert pol.continue_drafting(c, 0, [0.9, 0.01]) is False  # real confidence collapsed


def test_tpot_slo_disables_slow_arms():
    pol = _policy(initial_confidence=0.9)
    assert pol.decide(ctx(batch=1, slo=10.0)).arm_for(0).gamma == 6
    assert pol.decide(ctx(batch=1, slo=0.043)).arms == {}  # any draft step breaks a 43 ms TPOT


def test_running_mean_confidence():
    pol = _policy(initial_confidence=0.6)
    pol.observe(outcome([seq(0, gamma=2, accepted=1, confidences=[0.2, 0.4])]))
    assert pol.c_bar == pytest.approx(0.3)


def test_ignores_missing_drafter():
    assert _policy().decide(ctx(batch=2, drafters=(NGRAM,))).arms == {}


def test_a_model_free_drafter_costs_no_draft_steps():
    """With a draft step as costly as a target step, drafting one token never pays for a
    model drafter at the initial confidence (0.6), but does for the n-gram drafter, whose
    drafts cost nothing but their verification."""
    costly = StepTimeProfile((1024,), (1, 2, 4, 8), ((0.011, 0.012, 0.014, 0.018),),
                             ((0.011,) * 4,), (0.0,) * 4, (0.0,) * 4)
    model = make_policy("adaspec", drafter="draft", profile=costly, rng=random.Random(0))
    free = make_policy("adaspec", drafter="ngram", profile=costly, rng=random.Random(0))
    assert not model.decide(ctx(batch=1)).arms
    assert free.decide(ctx(batch=1)).arms
    smart_model = make_policy("smartspec", drafter="draft", profile=costly)
    smart_free = make_policy("smartspec", drafter="ngram", profile=costly)
    assert not smart_model.decide(ctx(batch=1)).arms and smart_free.decide(ctx(batch=1)).arms
