"""`observe(outcome)` learns from the outcome alone: nothing stashed at `decide`.

Every registered policy runs a seeded simulator episode (batch sizes 1, 32, 8 and 2;
KV pressure at 32, so composite and nightjar park their model drafter and reload it).
A second instance with the same seed is told the same things, but every StepOutcome and
StepContext it sees went through a JSON round trip (`to_dict` / `from_dict`), as a
recorded trace does:
* `test_round_tripped_outcomes_give_the_same_decisions`: it decides alongside and must
  decide the same, step after step;
* `test_observe_alone_learns_what_decide_and_observe_learn`: it never decides at all,
  only observes, and must learn the same statistics (a policy that read state stashed
  at `decide` would learn nothing, or something else).
"""
import json
import random
from dataclasses import asdict, replace

import pytest

from policy import POLICIES, make_policy
from policy.environments import Phase, mixed
from policy.simulator import DEFAULT_PARAMS, simulate
from policy.types import StepContext, StepOutcome

CASES = {name: (name, params) for name, params in DEFAULT_PARAMS.items()}
CASES.update({
    "off": ("off", {}),
    "composite-model-free": ("composite", dict(drafters=["ngram"])),
    "dsde-short": ("dsde", dict(drafter="draft", sl_a_max=3, warmup_steps=2, short_window=4, long_window=12)),
    "metasd-exp3": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="exp3")),
    "metasd-sh": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="sh")),
    "metasd-ducb": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="ducb")),
    "metasd-swucb": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="swucb")),
    "nightjar-step": ("nightjar", dict(drafter="draft", loss_average="step")),
    "nightjar-parks": ("nightjar", dict(drafter="draft", t_persist=2)),  # steps with its drafter parked
    "banditspec-exp3spec": ("banditspec", dict(drafters=["draft"], gammas=[0, 1, 2, 3, 4], algorithm="exp3spec")),
    "banditspec-drafters": ("banditspec", dict(drafters=["draft", "ngram"], gammas=[4], reward="acceptance_length")),
})
STEPS = 200


def test_every_registered_policy_is_covered():
    assert {name for name, _ in CASES.values()} == set(POLICIES)


def episode_env():
    """Mixed requests under load phases; a KV pool small enough that batch 64 runs short."""
    return replace(mixed(), phases=(Phase(2.0, 1), Phase(12.0, 32, queue=8), Phase(5.0, 8), Phase(60.0, 2)),
                   new_tokens=(24, 64), kv_total_blocks=700)


def round_trip_outcome(o: StepOutcome) -> StepOutcome:
    return StepOutcome.from_dict(json.loads(json.dumps(o.to_dict())))


def round_trip_context(ctx: StepContext) -> StepContext:
    return StepContext.from_dict(json.loads(json.dumps(asdict(ctx))))


def _pair(label):
    name, params = CASES[label]
    return make_policy(name, rng=random.Random(0), **params), make_policy(name, rng=random.Random(0), **params)


def _tell_both(a, b, observe_b):
    """Make every call the simulator makes on `a` reach `b` too (observe via `observe_b`)."""
    a_observe, a_start, a_end = a.observe, a.on_request_start, a.on_request_end

    def observe(outcome):
        a_observe(outcome)
        observe_b(outcome)

    def start(seq_id):
        a_start(seq_id)
        b.on_request_start(seq_id)

    def end(seq_id):
        a_end(seq_id)
        b.on_request_end(seq_id)

    a.observe, a.on_request_start, a.on_request_end = observe, start, end


@pytest.mark.parametrize("label", sorted(CASES))
def test_round_tripped_outcomes_give_the_same_decisions(label):
    a, b = _pair(label)
    differ = []
    a_decide, a_continue, a_verify = a.decide, a.continue_drafting, a.verify_lengths

    def decide(ctx):
        da, db = a_decide(ctx), b.decide(round_trip_context(ctx))
        if (da.arms, tuple(da.memory_actions)) != (db.arms, tuple(db.memory_actions)):
            differ.append(("decide", ctx.step))
        return da

    def continue_drafting(ctx, seq_id, confidences):
        ka = a_continue(ctx, seq_id, confidences)
        if ka != b.continue_drafting(ctx, seq_id, list(confidences)):
            differ.append(("continue_drafting", ctx.step))
        return ka

    def verify_lengths(ctx, drafts):
        la = a_verify(ctx, drafts)
        if dict(la) != dict(b.verify_lengths(ctx, {i: list(q) for i, q in drafts.items()})):
            differ.append(("verify_lengths", ctx.step))
        return la

    a.decide, a.continue_drafting, a.verify_lengths = decide, continue_drafting, verify_lengths
    _tell_both(a, b, lambda o: b.observe(round_trip_outcome(o)))
    r = simulate(a, episode_env(), steps=STEPS, seed=0)
    assert r.steps == STEPS and max(r.batch) == 32
    assert differ == []


def _bandit_state(bandit):
    return {k: (list(v) if hasattr(v, "__len__") and not isinstance(v, dict) else v)
            for k, v in vars(bandit).items() if k != "rng"}


def learned(p):
    """What a policy has learned (its statistics), by policy."""
    if p.name == "composite":
        return p.acceptance.glob, p.acceptance.seq, p.times.ratio, p.pulls
    if p.name == "nightjar":
        return p.sums, p.prev_gamma
    if p.name == "banditspec":
        return {k: _bandit_state(b) for k, b in p.bandits.items() if b.t > 0}, p.r_max
    if p.name == "dsde":
        return p.lengths, p.sl_max, p.warm_left, p.kl_pre
    if p.name == "metasd":
        if p.table is not None:
            t = p.table
            t._write_back()
            return {k: (t.counts[r].tolist(), t.sums[r].tolist()) for k, r in t.rows.items()}
        return {k: _bandit_state(b) for k, b in p.bandits.items()}
    if p.name == "adaspec":
        return p.c_bar, p._n_conf
    if p.name == "smartspec":
        return p.alpha
    if p.name == "hf_heuristic":
        return p.gamma
    assert type(p).observe is POLICIES["off"].observe, f"{p.name} learns: say what in learned()"
    return None


@pytest.mark.parametrize("label", sorted(CASES))
def test_observe_alone_learns_what_decide_and_observe_learn(label):
    a, b = _pair(label)
    checked = []

    def observe_b(outcome):
        b.observe(round_trip_outcome(outcome))
        if outcome.step % 20 == 0 or outcome.step == STEPS - 1:
            checked.append(outcome.step)
            assert learned(b) == learned(a), f"step {outcome.step}"

    _tell_both(a, b, observe_b)
    simulate(a, episode_env(), steps=STEPS, seed=0)
    assert checked[-1] == STEPS - 1
