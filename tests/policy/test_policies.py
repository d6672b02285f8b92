"""Behaviour of the baselines, MetaSD, BanditSpec and the composite on hand-made steps."""
import random

import pytest

from policy import make_policy
from policy.hf_heuristic import next_gamma
from policy.smartspec import best_gamma
from policy.types import DrafterInfo
from helpers import ctx, outcome, seq


def test_static_and_off_and_vllm_threshold():
    assert make_policy("off").decide(ctx(4)).arms == {}
    assert make_policy("static", drafter="draft", gamma=3).decide(ctx(2)).arm_for(1).gamma == 3
    parked = DrafterInfo("draft", True, False)
    assert make_policy("static", drafter="draft").decide(ctx(2, drafters=(parked,))).arms == {}
    v = make_policy("vllm_disable_by_batch_size", drafter="draft", gamma=4, disable_batch_size=8)
    assert v.decide(ctx(7)).arm_for(0).gamma == 4 and v.decide(ctx(8)).arms == {}


def test_hf_heuristic_schedule():
    assert [next_gamma(5, 5, 16), next_gamma(5, 3, 16), next_gamma(1, 0, 16)] == [7, 4, 1]
    p = make_policy("hf_heuristic", drafter="draft", initial_gamma=5)
    p.decide(ctx(1))
    p.observe(outcome([seq(0, gamma=5, accepted=5)]))
    assert p.decide(ctx(1)).arm_for(0).gamma == 7


def test_smartspec_goodput_argmax():
    assert best_gamma(0.8, 8, lambda g: 1.0 + 0.1 * g) == 6  # E/T: 2.4696 at 6 vs 2.4595 at 5
    p = make_policy("smartspec", drafter="draft", initial_alpha=0.9)
    assert p.decide(ctx(1)).arm_for(0).gamma > 0
    for _ in range(60):
        p.observe(outcome([seq(0, gamma=4, accepted=0)]))
    assert p.decide(ctx(1)).arms == {}


def test_metasd_reinitialises_per_request_and_uses_bd():
    p = make_policy("metasd", drafters=["draft", "ngram"], gamma=4, rng=random.Random(0))
    p.on_request_start(0)
    for _ in range(20):
        arm = p.decide(ctx(1)).arm_for(0)
        good = arm.drafter == "ngram"
        p.observe(outcome([seq(0, arm.drafter, 4, 3 if good else 0, tv=[0.1] * 4 if good else [0.9] * 4)]))
    assert p.decide(ctx(1)).arm_for(0).drafter == "ngram"
    assert p.mean(0, "ngram") > 0.5
    p.on_request_end(0)
    p.on_request_start(0)
    assert p.mean(0, "ngram") == 0.0 and p.mean(0, "draft") == 0.0  # a fresh bandit


@pytest.mark.parametrize("algorithm", ["ucbspec", "exp3spec"])
def test_banditspec_per_bucket_length_arms(algorithm):
    p = make_policy("banditspec", drafters=["draft"], gammas=[0, 2, 4], algorithm=algorithm, rng=random.Random(0))
    for t in range(400):
        for b, good in ((1, 4), (32, 0)):  # speculation pays at B=1 and costs at B=32
            c = ctx(b, step=t)
            g = p.decide(c).arm_for(0).gamma
            tput = (1.0 + 0.4 * g) if b == 1 else (1.0 - 0.2 * g)
            p.observe(outcome([seq(i, "draft" if g else None, g, 0) for i in range(b)], total=b / (100 * tput)))
    assert set(p.bandits) == {1, 32}
    counts_small, counts_large = p.bandits[1].counts, p.bandits[32].counts  # arms: gamma 0, 2, 4
    assert counts_small.index(max(counts_small)) == 2 and counts_large.index(max(counts_large)) == 0


def test_composite_prefers_the_better_drafter_per_sequence():
    p = make_policy("composite", drafters=["draft", "ngram"], rng=random.Random(0))
    for t in range(60):
        d = p.decide(ctx(2, step=t))
        seqs = []
        for i in (0, 1):
            arm = d.arm_for(i)
            good = (i == 0 and arm.drafter == "ngram") or (i == 1 and arm.drafter == "draft")
            acc = arm.gamma if good else 0
            seqs.append(seq(i, arm.drafter, arm.gamma, acc))
        p.observe(outcome(seqs, total=0.05))
    assert p.alpha(0, "ngram") > 0.8 > p.alpha(0, "draft")
    assert p.alpha(1, "draft") > 0.8 and p.alpha(1, "draft") > p.alpha(1, "ngram")
    assert p.decide(ctx(2, step=99)).arm_for(0).drafter == "ngram"


def test_composite_respects_kv_pressure_and_slo():
    p = make_policy("composite", drafters=["draft", "ngram"], rng=random.Random(0))
    assert p.decide(ctx(2, kv_free=10, kv_total=1000, queue=3)).arms == {}
    q = make_policy("composite", drafters=["draft"], rng=random.Random(0))
    assert q.decide(ctx(1, slo=1.0)).arm_for(0).gamma > 0
    assert q.decide(ctx(1, slo=0.045)).arms == {}  # a 42 ms decode fits, any model-draft step does not
    assert q.decide(ctx(1, slo=0.001)).arms == {}  # nothing fits: plain decoding


def test_composite_drafts_model_free_when_the_model_drafter_does_not_pay():
    """When the model drafter's best plan is gamma 0 (here: a long catch-up), the
    model-free drafter drafts instead of nobody."""
    from dataclasses import replace

    p = make_policy("composite", drafters=["draft", "ngram"], rng=random.Random(0))
    c = ctx(1)
    assert p.decide(c).arm_for(0).drafter == "draft"  # nothing to catch up: the model drafter is tried
    behind = replace(c, sequences=[replace(c.sequences[0], uncaught_tokens={"draft": 100_000})])
    arm = p.decide(behind).arm_for(0)
    assert arm.drafter == "ngram" and arm.gamma > 0
    only_model = make_policy("composite", drafters=["draft"], rng=random.Random(0))
    assert only_model.decide(behind).arms == {}  # no model-free drafter to fall back to: plain decoding


def test_composite_weighs_a_model_drafters_cost_against_its_acceptance():
    """A model drafter that accepts a little more than n-gram lookup but costs draft steps
    is not played once the evidence is in; a lone model drafter still is, as it pays."""
    p = make_policy("composite", drafters=["draft", "ngram"], rng=random.Random(0))
    for t in range(40):  # alpha: draft 0.6 (accepted 2 then 1 of 4), ngram 0.5 (1 of 4)
        p.observe(outcome([seq(0, "draft", 4, 2 if t % 2 else 1)]))
        p.observe(outcome([seq(0, "ngram", 4, 1)]))
    assert p.alpha(0, "draft") > p.alpha(0, "ngram") + 0.05
    assert p.decide(ctx(1)).arm_for(0).drafter == "ngram"
    q = make_policy("composite", drafters=["draft"], rng=random.Random(0))
    for t in range(40):
        q.observe(outcome([seq(0, "draft", 4, 2 if t % 2 else 1)]))
    assert q.decide(ctx(1)).arm_for(0).drafter == "draft"
