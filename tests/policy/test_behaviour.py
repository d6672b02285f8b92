"""What each policy must do, in seeded simulator episodes and on hand-made steps.

(These replace digests of every decision, which pinned float summation order rather
than behaviour.) Convergence to the best arm in a stationary environment and
speculation on/off by load for nightjar, banditspec and composite are in
test_simulator.py; the composite's parts are tested alone in test_composite_parts.py.
"""
import random

import pytest

from policy import make_policy
from policy.environments import MODEL, NGRAM, Environment, Phase, RequestType, drift
from policy.simulator import simulate
from policy.types import DrafterInfo, SequenceOutcome, StepContext, StepOutcome
from helpers import ctx, outcome, seq


def run(name, params, env, steps=None, slo=None, seed=0):
    """-> (RunResult, the StepOutcomes) of one seeded episode."""
    outcomes = []
    r = simulate(make_policy(name, rng=random.Random(seed), **params), env, steps=steps, seed=seed,
                 record=outcomes.append, tpot_slo_s=slo)
    return r, outcomes


def one_drafter(spec, alpha, phases, **kw):
    return Environment("test", (spec,), phases, (RequestType(1.0, {spec.name: alpha}),), **kw)


def second_half(outcomes):
    return outcomes[len(outcomes) // 2:]


def drafted_with(outcomes, drafter):
    """Fraction of the sequence-steps that drafted that drafted with `drafter`."""
    used = [s.drafter for o in outcomes for s in o.sequences if s.gamma > 0]
    return used.count(drafter) / max(len(used), 1)


# -- load and SLO ----------------------------------------------------------------------
@pytest.mark.parametrize("name, params, spec", [
    ("composite", dict(drafters=["ngram"]), NGRAM),  # the served default: model-free drafters only
    ("adaspec", dict(drafter="draft"), MODEL),
    ("smartspec", dict(drafter="draft"), MODEL),
    ("vllm_disable_by_batch_size", dict(drafter="draft", disable_batch_size=16), MODEL),
])
def test_speculation_on_at_small_batch_off_at_large(name, params, spec):
    env = one_drafter(spec, 0.7, (Phase(8.0, 1), Phase(25.0, 64), Phase(8.0, 2)), new_tokens=(48, 96))
    r, _ = run(name, params, env)
    late = range(30, r.steps)  # after a first look

    def spec_fraction(batches):
        steps = [i for i in late if r.batch[i] in batches]
        assert len(steps) >= 30
        return sum(r.gamma[i] > 0 for i in steps) / len(steps)

    assert spec_fraction({1, 2}) >= 0.8
    assert spec_fraction({64}) <= 0.1


@pytest.mark.parametrize("name, params", [
    ("composite", dict(drafters=["draft"])),
    ("adaspec", dict(drafter="draft")),
])
def test_slo_is_respected_while_speculation_still_pays(name, params):
    """At batch 1 a plain step takes 42 ms and each model-drafted token adds 6.3 ms: a
    50 ms SLO leaves room for one draft token, not two."""
    env = one_drafter(MODEL, 0.8, (Phase(40.0, 1),), new_tokens=(64, 96))
    r, outcomes = run(name, params, env, steps=300, slo=0.050)
    late = second_half(outcomes)
    over = [o for o in late if o.total_time_s > 0.050 * 1.08]  # 1.08: the environment's time noise
    assert len(over) <= 0.02 * len(late)
    assert r.spec_fraction_between(150, 300) >= 0.8  # speculation goes on within the SLO
    _, free = run(name, params, env, steps=300)
    assert sum(o.total_time_s > 0.050 * 1.08 for o in second_half(free)) > 0.5 * len(late)  # it would not


# -- the composite's choices ----------------------------------------------------------
def test_composite_follows_a_request_whose_best_drafter_changes():
    """Each request drifts at token 64: draft .8 -> .3, ngram .2 -> .85."""
    _, outcomes = run("composite", dict(drafters=["draft", "ngram"]), drift(), steps=600)
    generated = [(o, o.context.sequences[0].generated) for o in outcomes[100:]]
    # a request starts from what all requests taught (both drafters middling), then its own evidence
    assert drafted_with([o for o, g in generated if 32 <= g < 64], "draft") >= 0.7
    assert drafted_with([o for o, g in generated if g >= 88], "ngram") >= 0.9


@pytest.mark.parametrize("alphas, best", [
    ({"draft": 0.6, "ngram": 0.55}, "ngram"),  # a little better at a price: not worth it
    ({"draft": 0.8, "ngram": 0.2}, "draft"),  # much better: worth its draft steps
])
def test_composite_weighs_a_model_drafters_cost_against_its_acceptance(alphas, best):
    env = Environment("cost", (MODEL, NGRAM), (Phase(60.0, 1),), (RequestType(1.0, alphas),), new_tokens=(64, 96))
    _, outcomes = run("composite", dict(drafters=["draft", "ngram"]), env, steps=500)
    assert drafted_with(second_half(outcomes), best) >= 0.8


# -- model-based lengths ----------------------------------------------------------------
@pytest.mark.parametrize("name, params", [
    ("adaspec", dict(drafter="draft")),
    ("smartspec", dict(drafter="draft")),
    ("hf_heuristic", dict(drafter="draft")),
    ("composite", dict(drafters=["draft"])),
])
def test_drafts_are_longer_when_more_of_them_are_accepted(name, params):
    def mean_gamma(alpha):
        _, outcomes = run(name, params, one_drafter(MODEL, alpha, (Phase(60.0, 1),), new_tokens=(64, 96)),
                          steps=300)
        late = second_half(outcomes)
        return sum(s.gamma for o in late for s in o.sequences) / len(late)

    assert mean_gamma(0.9) >= mean_gamma(0.45) + 1.0


# -- DSDE ---------------------------------------------------------------------------------
def test_dsde_lengths_shrink_while_kl_is_volatile_and_recover_when_it_calms():
    """Sequence 1's KL turns volatile for two steps (0.55, 0.05, 0.55, ...: its mean, and
    with it SF, stays at least as high), then calms again; sequence 0's stays calm."""
    pol = make_policy("dsde", drafter="draft", sl_a_max=8, warmup_steps=3, batch_cap=False, rng=random.Random(0))

    def step(t: int, volatile_1: bool):
        d = pol.decide(ctx(batch=2, step=t))
        seqs = []
        for i in (0, 1):
            g = d.arm_for(i).gamma
            if i == 1 and volatile_1:
                kl = [0.55 if j % 2 == 0 else 0.05 for j in range(g)]
            else:
                kl = [0.3 + 0.02 * ((t + j + i) % 3 - 1) for j in range(g)]
            seqs.append(seq(i, "draft", g, 1, kl=kl))
        pol.observe(outcome(seqs, step=t))
        return [pol.length_for(i) for i in (0, 1)]

    calm = [step(t, False) for t in range(20)][-1]
    volatile = [step(t, True) for t in range(20, 22)][-1]
    assert volatile[1] < calm[1] and volatile[1] < volatile[0]
    recovered = [step(t, False) for t in range(22, 62)][-1]
    assert recovered[1] > volatile[1]


# -- MetaSD -------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm, extra", [
    ("ucb", {}), ("ducb", {}), ("swucb", {}), ("sh", {}), ("exp3", dict(exp3_gamma=0.1)),
])
def test_metasd_gives_each_request_the_drafter_that_suits_it(algorithm, extra):
    """Request 0 is code-like (n-gram lookup matches), request 1 chat-like (the model drafter
    matches); the bandit of each must settle on its own better drafter."""
    pol = make_policy("metasd", drafters=["draft", "ngram"], gamma=4, algorithm=algorithm,
                      rng=random.Random(0), **extra)
    good = {0: "ngram", 1: "draft"}
    rng = random.Random(1)
    picks = {0: [], 1: []}
    for i in good:
        pol.on_request_start(i)
    for t in range(300):
        d = pol.decide(ctx(2, step=t))
        seqs = []
        for i in good:
            arm = d.arm_for(i)
            a = 0.85 if arm.drafter == good[i] else 0.3
            acc = [min(1.0, max(0.0, a + rng.uniform(-0.1, 0.1))) for _ in range(arm.gamma)]
            seqs.append(seq(i, arm.drafter, arm.gamma, 2, tv=[1 - x for x in acc], p_draft=acc))
            picks[i].append(arm.drafter)
        pol.observe(outcome(seqs))
    for i in good:
        assert picks[i][-100:].count(good[i]) >= 80, (i, algorithm)


# -- a parked drafter teaches nothing -------------------------------------------------------
PARKED = (DrafterInfo("draft", True, False, 100), DrafterInfo("ngram", False, True))


def _played(c: StepContext, decision, total=0.05) -> StepOutcome:
    seqs = [SequenceOutcome(v.seq_id, None, 0, 0, 1, planned_drafter=decision.arm_for(v.seq_id).drafter,
                            planned_gamma=decision.arm_for(v.seq_id).gamma, context_len=v.context_len)
            for v in c.sequences]
    return StepOutcome(c.step, c.batch_size, seqs, total_time_s=total, context=c)


def test_nightjar_learns_nothing_from_steps_its_drafter_was_parked_for():
    pol = make_policy("nightjar", drafter="draft", elastic=False, rng=random.Random(0))
    for t in range(30):
        c = ctx(2, step=t, drafters=PARKED)
        d = pol.decide(c)
        assert d.arms == {}
        pol.observe(_played(c, d))
    assert pol.sums == {} and pol.prev_gamma == 0
    c = ctx(2, step=30)
    d = pol.decide(c)
    pol.observe(_played(c, d))
    assert list(pol.sums) == [(2, d.arm_for(0).gamma)]


def test_banditspec_learns_nothing_from_steps_an_arms_drafter_was_parked_for():
    pol = make_policy("banditspec", drafters=["draft"], gammas=[0, 2, 4], rng=random.Random(0))
    for t in range(30):
        c = ctx(2, step=t, drafters=PARKED)
        pol.observe(_played(c, pol.decide(c)))
    assert all(b.t == 0 for b in pol.bandits.values())
    c = ctx(2, step=30)
    pol.observe(_played(c, pol.decide(c)))
    assert sum(b.t for b in pol.bandits.values()) == 1


def test_composite_counts_the_tokens_a_model_free_drafter_did_not_propose():
    """n-gram lookup that finds no continuation drafts fewer tokens than planned, or none:
    the missing ones are a failed trial (else alpha is that of the lucky matches). A model
    drafter that stops early stops on its own confidence: no failure."""
    def alpha_after(drafter, drafted, planned):
        pol = make_policy("composite", drafters=["draft", "ngram"], rng=random.Random(0))
        c = ctx(1)
        for t in range(20):
            s = SequenceOutcome(0, drafter if drafted else None, drafted, drafted, drafted + 1,
                                planned_drafter=drafter, planned_gamma=planned, drafted=drafted)
            pol.observe(StepOutcome(t, 1, [s], total_time_s=0.05, context=c))
        return pol.alpha(0, drafter)

    assert alpha_after("ngram", 2, 4) < 0.75 < alpha_after("ngram", 4, 4)
    assert alpha_after("draft", 2, 8) > 0.9
