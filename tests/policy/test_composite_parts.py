"""The composite policy's parts, each on its own: the acceptance estimator, the step-time
model and the planner (pure functions of their inputs)."""
import random

import pytest

from policy.acceptance import AcceptanceEstimator, pick_drafter, shrunk_rate
from policy.goodput import expected_tokens
from policy.planner import expected_sums, optimism_bonus, optimistic_goodput, plan_step
from policy.profiles import StepTimeProfile
from policy.steptime import StepTimeModel


# -- acceptance ---------------------------------------------------------------------
def test_estimates_are_shrunk_towards_the_prior_then_the_global_rate():
    a = AcceptanceEstimator(["d"], prior=0.5, global_discount=1.0, seq_discount=1.0, shrink=4.0)
    assert a.global_alpha("d") == a.alpha(0, "d") == 0.5  # no evidence: the prior
    for _ in range(50):
        a.observe(0, "d", 1, 1)  # sequence 0 accepts everything
    assert a.global_alpha("d") == pytest.approx((50 + 2) / 54)
    assert a.alpha(0, "d") > a.global_alpha("d")  # its own evidence, shrunk towards the global rate
    assert a.alpha(1, "d") == a.global_alpha("d")  # a sequence without evidence: the global rate


def test_a_sequence_follows_drift_within_a_few_steps_the_global_rate_slowly():
    a = AcceptanceEstimator(["d"], prior=0.5, global_discount=0.995, seq_discount=0.8, shrink=4.0)
    for _ in range(100):
        a.observe(0, "d", 4, 4)
    for _ in range(10):  # the request drifts: nothing is accepted any more
        a.observe(0, "d", 0, 1)
    assert a.alpha(0, "d") < 0.6 < a.global_alpha("d")


def test_forgetting_a_sequence_keeps_the_global_rate():
    a = AcceptanceEstimator(["d"], prior=0.5, global_discount=1.0, seq_discount=1.0, shrink=4.0)
    a.observe(3, "d", 0, 8)
    before = a.global_alpha("d")
    a.forget(3)
    assert a.alpha(3, "d") == before < 0.5


def test_pick_explores_unplayed_drafters_and_resists_flapping():
    glob = {"a": 0.6, "b": 0.5}
    # sequence played a a lot at 0.6: b, never tried by it, has the larger bonus
    stats = {"a": [30.0, 50.0]}
    assert pick_drafter(stats, ["a", "b"], glob, "a", 4.0, 0.3, 0.05).drafter == "b"
    # a small edge does not make it leave the drafter it used last
    assert pick_drafter(None, ["a", "b"], {"a": 0.5, "b": 0.53}, "a", 4.0, 0.3, 0.05).drafter == "a"
    assert pick_drafter(None, ["a", "b"], {"a": 0.5, "b": 0.53}, None, 4.0, 0.3, 0.05).drafter == "b"
    assert shrunk_rate(0, 0, 0.5, 4) == 0.5


# -- step time ----------------------------------------------------------------------
def test_time_model_corrects_the_profile_per_bucket_kind_and_gamma():
    m = StepTimeModel(StepTimeProfile.default(), ema=1.0)
    base = m.step_time(8, 200.0, 8 + 8 * 2, 2, 0)
    assert base == m.profiled(200.0, 24, 2, 0)  # nothing seen: the profile
    for _ in range(9):
        m.learn(8, "free", 2, 2.0)  # steps took twice the profile
    assert m.step_time(8, 200.0, 24, 2, 0) == pytest.approx(base * (2.0 * 9 + 1) / 10)
    assert m.correction(8, "free", 3) == m.correction(8, "free", 2)  # unseen gamma: the nearest seen one
    assert m.correction(16, "free", 2) == m.correction(8, "model", 2) == 1.0  # other bucket / kind: untouched
    m.learn(8, "free", 5, 1.0)
    assert m.correction(8, "free", 4) == pytest.approx((1.0 * 1 + 1) / 2)  # now 5 is the nearest


def test_time_row_equals_step_time_per_gamma():
    m = StepTimeModel(StepTimeProfile.default(), ema=0.2)
    m.learn(4, "model", 3, 1.3)
    row = m.row(4, 4, 300.0, 2, 2, 6)
    assert row == [m.step_time(4, 300.0, 4 + 2 * g, g, 2) for g in range(7)]
    assert m.row(4, 4, 300.0, 2, 2, 6) == row  # memoised profile, same answer


def test_profile_is_read_exactly_across_context_buckets():
    # a profile whose context buckets differ: the answer depends on the context's bucket only
    p = StepTimeProfile((256, 1024), (1, 8, 64), ((0.01, 0.02, 0.05), (0.02, 0.04, 0.10)),
                        ((0.001, 0.002, 0.004),) * 2, (0.0,) * 3, (0.0,) * 3)
    m = StepTimeModel(p, ema=0.2)
    assert m.profiled(100.0, 8, 0, 0) == pytest.approx(0.02)
    assert m.profiled(600.0, 8, 0, 0) == pytest.approx(0.04)
    assert m.profiled(100.0, 8, 0, 0) == pytest.approx(0.02)  # memo keyed by bucket, not by first caller
    assert m.row(1, 1, 254.0, 1, 0, 8)[8] == pytest.approx(p.target(258.0, 9))  # the row crosses a bucket


# -- planner ------------------------------------------------------------------------
def _times(n_tokens, gamma, n_model):  # a model-free drafter on a memory-bound target
    return 0.040 + 0.0005 * max(0, n_tokens - 8) + 0.002 * (gamma > 0)


def _plan(alphas, slo=None, amortised=0.0, model=None, gamma_max=8, bonus=None):
    b = len(alphas)
    model = model or [False] * b
    times = [_times(b + b * g, g, sum(model)) for g in range(gamma_max + 1)]
    return plan_step(alphas, model, times, _times, bonus or [0.0] * (gamma_max + 1), slo, amortised)


def test_plan_drafts_when_it_pays_and_not_when_it_does_not():
    good = _plan([0.8])
    assert good.gamma > 2 and good.keep == {0}
    assert good.expected == pytest.approx(expected_tokens(0.8, good.gamma))
    assert _plan([0.01]).gamma == 0


def test_plan_eliminates_the_sequences_whose_drafts_do_not_pay():
    plan = _plan([0.9, 0.9, 0.05, 0.9] * 4)
    assert plan.gamma > 0
    assert plan.keep == {i for i in range(16) if i % 4 != 2}  # the 0.05 sequences decode plainly
    assert plan.n_tokens == 16 + 12 * plan.gamma


def test_plan_respects_the_slo_and_prices_the_catch_up():
    free = _plan([0.8])
    assert _plan([0.8], slo=0.041).gamma == 0  # only plain decoding fits
    assert _plan([0.8], slo=0.001).gamma == 0  # nothing fits: plain decoding
    assert _plan([0.8], amortised=0.2).gamma == 0  # a catch-up dearer than what drafting earns
    assert free.index > _plan([0.8], amortised=0.01).index


def test_plan_lone_model_drafted_sequence_plans_the_full_depth():
    def t(n, g, m):
        return 0.040 + 0.006 * g * (m > 0)
    times = [t(1 + g, g, 1) for g in range(9)]
    plain = plan_step([0.6], [True], times, t, [0.0] * 9, None, 0.0)
    deep = plan_step([0.6], [True], times, t, [0.0] * 9, None, 0.0, dynamic_depth=True)
    assert 0 < plain.gamma < 8 and deep.gamma == 8 and deep.index == plain.index


def test_optimism_bonus_favours_rarely_played_gammas():
    bonus = optimism_bonus([50, 0, 10], 61, 0.03)
    assert bonus[1] > bonus[2] > bonus[0] > 0
    assert optimistic_goodput([0.5], 1, [0.04, 0.041], 0.0405, 0.0) == 0.0  # nothing meets the SLO
    assert expected_sums([0.5, 0.2], 2) == pytest.approx([2.0, 2.7, 2.99])


def test_expected_sums_follow_the_scalar_formula():
    """The batch sum goes through one E row per distinct alpha and numpy (at 64 sequences
    with their own alphas a Python double loop costs ~100 us a step); it must equal the
    plain sum of `expected_tokens` up to rounding."""
    import random
    rng = random.Random(0)
    for b in (1, 3, 64):
        alphas = [round(rng.random(), 2) for _ in range(b)]
        want = [sum(expected_tokens(a, g) for a in alphas) for g in range(9)]
        assert expected_sums(alphas, 8) == pytest.approx(want, rel=1e-12)


def test_composite_drafts_only_where_a_draft_is_ready_and_learns_from_shadows():
    from policy import make_policy
    from policy.types import DrafterInfo, SequenceOutcome, SequenceView, StepContext, StepOutcome

    pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.9)
    drafters = [DrafterInfo(name="ngram", is_model=False, resident=True)]
    views = [SequenceView(seq_id=i, context_len=100, generated=5, max_new_tokens=64, temperature=0.0,
                          available={"ngram": 4 if i == 0 else 0}) for i in range(2)]
    ctx = StepContext(step=0, sequences=views, drafters=drafters)
    arms = pol.decide(ctx).arms
    assert set(arms) == {0}  # sequence 1 has no draft ready: never planned
    # drafts checked but not played teach the acceptance rate (here: always wrong)
    before = pol.alpha(1, "ngram")
    for _ in range(5):
        pol.observe(StepOutcome(step=0, batch_size=2, context=ctx, sequences=[
            SequenceOutcome(i, None, 0, 0, 1, shadow=[("ngram", 0, 1)]) for i in range(2)]))
    assert pol.alpha(1, "ngram") < before
    assert pol.acceptance.global_alpha("ngram") < 0.9


def test_composite_plans_no_longer_than_the_ready_draft():
    from policy import make_policy
    from policy.types import DrafterInfo, SequenceView, StepContext

    pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.95)
    drafters = [DrafterInfo(name="ngram", is_model=False, resident=True)]
    view = lambda n: SequenceView(seq_id=0, context_len=100, generated=5, max_new_tokens=64, temperature=0.0,
                                  available={"ngram": n})
    long = pol.decide(StepContext(step=0, sequences=[view(8)], drafters=drafters)).arms[0].gamma
    short = pol.decide(StepContext(step=1, sequences=[view(2)], drafters=drafters)).arms[0].gamma
    assert long > 2 and short == 2  # beyond 2 ready tokens a longer draft only adds cost


def test_drafting_corrections_move_with_the_plain_steps_correction():
    # a drafting kind learned at 1.2x the plain steps' correction stays 1.2x it when the host
    # slows down: plain steps alone then show it, and drafting must not look cheaper for that
    m = StepTimeModel(StepTimeProfile.default(), ema=1.0)
    for _ in range(50):
        m.learn(8, "none", 0, 1.0)
        m.learn(8, "free", 1, 1.2)
    before = m.correction(8, "free", 1) / m.correction(8, "none", 0)
    for _ in range(50):
        m.learn(8, "none", 0, 1.5)  # the host slowed: only plain steps were measured since
    assert m.correction(8, "none", 0) == pytest.approx((1.5 * 100 + 1) / 101)
    assert m.correction(8, "free", 1) / m.correction(8, "none", 0) == pytest.approx(before)
    assert before == pytest.approx((1.2 * 50 + 1) / 51)


def _batch_ctx(step, n, available):
    from policy.types import DrafterInfo, SequenceView, StepContext

    views = [SequenceView(seq_id=i, context_len=100, generated=5, max_new_tokens=64, temperature=0.0,
                          available=None if available is None else {"ngram": available}) for i in range(n)]
    return StepContext(step=step, sequences=views, drafters=[DrafterInfo(name="ngram", is_model=False, resident=True)])


def test_composite_rests_from_planning_while_plans_decline_and_plans_again_at_once_after_a_draft():
    from policy import make_policy

    pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.9, rest_max=4)
    drafted = lambda step, ready: bool(pol.decide(_batch_ctx(step, 8, ready)).arms)
    assert pol.lookahead() == {"ngram": 8}  # resting or not, drafts are looked ahead (shadows keep learning)
    # 8 sequences, nobody with a draft ready: the plan declines; the next step rests (1 step) even
    # though drafts are ready now and would pay; the one after plans and drafts
    assert [drafted(0, 0), drafted(1, 8), drafted(2, 8)] == [False, False, True]
    # the draft reset the rest: a decline rests 1 step again, and further declines double it
    # (1, 2, then rest_max = 4): plans at steps 3, 5 and 8 decline, steps 9-12 rest with drafts
    # ready, step 13 plans and drafts
    got = [drafted(step, 0 if step <= 8 else 8) for step in range(3, 14)]
    assert got == [False] * 10 + [True]
    assert [drafted(14, 0), drafted(15, 8), drafted(16, 8)] == [False, False, True]


def test_composite_plans_every_step_below_four_sequences_or_without_rest():
    from policy import make_policy

    for n, rest_max in ((3, 8), (8, 0)):
        pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.9, rest_max=rest_max)
        assert not pol.decide(_batch_ctx(0, n, 0)).arms
        assert pol.decide(_batch_ctx(1, n, 8)).arms  # planned at once: drafts


def test_a_probe_of_speculates_at_plans_even_after_a_declined_plan():
    from policy import make_policy

    pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.9, probe_every=2)
    pol._pays = lambda batch_size, bucket: False  # whole-batch speculation would not pay: only probes say yes
    assert not pol.decide(_batch_ctx(0, 8, 0)).arms  # declined: the next decide would rest
    assert [pol.speculates_at(8), pol.speculates_at(8)] == [False, True]  # an engine skipping the hook, then a probe
    assert pol.decide(_batch_ctx(1, 8, 8)).arms  # the probe plans (and drafts), not rests


def test_composite_looks_ahead_for_about_rest_lookahead_sequences_while_resting():
    from policy import make_policy

    pol = make_policy("composite", drafters=["ngram"], prior_alpha=0.9)
    assert pol.lookahead_stride(32) == 1  # a planning step: every sequence's draft counts
    assert not pol.decide(_batch_ctx(0, 32, 0)).arms  # declined: the next step rests
    assert [pol.lookahead_stride(n) for n in (3, 8, 9, 32, 40)] == [1, 4, 5, 16, 20]  # ~2 a step
    pol.decide(_batch_ctx(1, 32, 0))  # the rest (1 step) is spent: the next step plans
    assert pol.lookahead_stride(32) == 1
    every = make_policy("composite", drafters=["ngram"], prior_alpha=0.9, rest_lookahead=0)
    every.decide(_batch_ctx(0, 32, 0))
    assert every.lookahead_stride(32) == 1


def test_composite_decides_without_planning_what_the_plan_gives_when_nothing_is_ready(monkeypatch):
    """Steps where the look-ahead found no draft for any sequence skip the plan (Composite._choose):
    step after step, over batches where some, none or all sequences have drafts ready (or were not
    looked ahead), the decisions equal those of the whole plan, rests included."""
    import policy.composite as composite
    from policy import make_policy
    from policy.types import DrafterInfo, SequenceView, StepContext

    rng = random.Random(7)
    drafters = [DrafterInfo(name=n, is_model=False, resident=True) for n in ("ngram", "suffix")]
    contexts = []
    for step in range(300):
        ready = rng.choice([(0,), (0, None), (0, 3), (0, 0, 8)])
        views = [SequenceView(seq_id=i, context_len=100 + step, generated=5, max_new_tokens=64, temperature=0.0,
                              available=(None if (n := rng.choice(ready)) is None else {"ngram": n, "suffix": 0}))
                 for i in range(rng.choice([1, 2, 5, 8]))]
        contexts.append(StepContext(step=step, sequences=views, drafters=drafters))
    decide = lambda pol: [pol.decide(ctx).arms for ctx in contexts]
    fast = decide(make_policy("composite", drafters=["ngram", "suffix"], prior_alpha=0.9))
    monkeypatch.setattr(composite, "_nothing_ready", lambda view, names: False)
    planned = decide(make_policy("composite", drafters=["ngram", "suffix"], prior_alpha=0.9))
    assert fast == planned
    assert sum(map(bool, fast)) > 20 and sum(not a for a in fast) > 100  # both kinds of step occur
