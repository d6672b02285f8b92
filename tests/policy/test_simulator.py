"""Convergence and regime behaviour in the synthetic environments (seeded, CPU-cheap)."""
import json
import random
from dataclasses import replace

import pytest

from policy import make_policy
from policy.environments import ENVIRONMENTS, batch_sweep, stationary
from policy.simulator import main, read_trace, replay, simulate

from helpers import record_trace

ROUNDS = 1000  # stated budget: best-arm ratio over rounds 500-1000 must reach 0.9
STATIONARY_LEARNERS = {
    # arm sets that contain the optimum (draft, gamma ~4); tolerance: within 2% of the oracle goodput
    "metasd": dict(drafters=["draft", "draft2", "ngram"], gamma=4),
    "metasd-ducb": dict(drafters=["draft", "draft2", "ngram"], gamma=4, algorithm="ducb"),
    "metasd-swucb": dict(drafters=["draft", "draft2", "ngram"], gamma=4, algorithm="swucb"),
    "banditspec-ucbspec": dict(drafters=["draft", "draft2", "ngram"], gammas=[4], reward="acceptance_length"),
}
LOOSE_LEARNERS = {
    # these pick gamma too; near the optimum goodput is flat, so within 5% of the oracle
    "banditspec-exp3spec": dict(drafters=["draft", "draft2", "ngram"], gammas=[4], reward="acceptance_length",
                                algorithm="exp3spec"),
    "composite": dict(drafters=["draft", "draft2", "ngram"], shrink=16.0, time_ema=0.05),
}


@pytest.mark.parametrize("label", sorted(STATIONARY_LEARNERS))
def test_stationary_convergence(label):
    pol = make_policy(label.split("-")[0], rng=random.Random(0), **STATIONARY_LEARNERS[label])
    r = simulate(pol, stationary(), steps=ROUNDS, seed=0)
    assert r.best_arm_ratio_between(ROUNDS // 2, ROUNDS) >= 0.9


@pytest.mark.parametrize("label", sorted(LOOSE_LEARNERS))
def test_stationary_convergence_within_5_percent(label):
    pol = make_policy(label.split("-")[0], rng=random.Random(0), **LOOSE_LEARNERS[label])
    r = simulate(pol, stationary(), steps=ROUNDS, seed=0)
    assert r.best_arm_ratio_between(ROUNDS // 2, ROUNDS, tol=0.05) >= 0.9


LONG_ROUNDS = 4000  # stated budget for the slower schedules: best-arm ratio over rounds 2000-4000 >= 0.9
LONG_LEARNERS = {
    # Nightjar (ADA-BINGREEDY) explores in ~H_n/sqrt(H) of each block's bins (b_B restarts at 1 every
    # block), uniformly over gamma 0..4 of which only 3 and 4 are within 2%: at H=2^10-2^11 that is
    # still ~7% off-optimum steps, so it needs the longer budget. Its loss is averaged per emitted
    # token (loss_average="token", the default); the paper's per-step mean of l_t = T_t/tokens_t
    # (loss_average="step") estimates E[T/tokens], which at batch 1 favours gamma 1-2 (Jensen) and
    # stays near 0.4 here — so that variant is not in this test (see policy/nightjar.py).
    "nightjar": (dict(drafter="draft"), False),
    # MetaSD re-initialises its bandit per request (003). Sequential Halving spends its whole budget
    # (32 rounds) exploring in every request and EXP3 needs hundreds of rounds, so with the
    # benchmark's 96-160-token requests (~40 steps) they restart before converging (0.5-0.6).
    # Long requests (one request spans the whole run) are the legitimate setting for them.
    # EXP3 mixes gamma/K uniform exploration into every draw (Alg. 7), so P(best) <= 1 - gamma (K-1)/K:
    # the default exp3_gamma=0.4 caps it at 0.73 by construction; 0.08 allows ~0.95.
    "metasd-sh": (dict(drafters=["draft", "draft2", "ngram"], gamma=4, algorithm="sh"), True),
    "metasd-exp3": (dict(drafters=["draft", "draft2", "ngram"], gamma=4, algorithm="exp3", exp3_gamma=0.08), True),
}


@pytest.mark.parametrize("label", sorted(LONG_LEARNERS))
def test_stationary_convergence_long_budget(label):
    params, long_requests = LONG_LEARNERS[label]
    env = replace(stationary(), phases=(replace(stationary().phases[0], seconds=1000.0),))
    if long_requests:
        env = replace(env, new_tokens=(20_000, 20_000))
    pol = make_policy(label.split("-")[0], rng=random.Random(0), **params)
    r = simulate(pol, env, steps=LONG_ROUNDS, seed=0)
    assert r.best_arm_ratio_between(LONG_ROUNDS // 2, LONG_ROUNDS) >= 0.9


def test_off_never_converges_in_stationary():  # the metric can fail
    r = simulate(make_policy("off"), stationary(), steps=200, seed=0)
    assert r.best_arm_ratio < 0.1 and r.regret > 50


@pytest.fixture(scope="module")
def batch_env():
    # the benchmark's load phases held 3x longer: UCBSpec's conservative radius needs
    # ~500 steps per batch-size bucket before exploitation dominates
    env = batch_sweep()
    return replace(env, phases=tuple(replace(p, seconds=3 * p.seconds) for p in env.phases))


@pytest.mark.parametrize("name, params", [
    ("nightjar", dict(drafter="draft", elastic=False)),
    ("banditspec", dict(drafters=["draft"], gammas=[0, 1, 2, 3, 4])),
    ("composite", dict(drafters=["draft"])),
])
def test_speculation_on_at_small_batch_off_at_large(batch_env, name, params):
    r = simulate(make_policy(name, rng=random.Random(0), **params), batch_env, seed=0)
    frac = {}
    for i, ph in enumerate(batch_env.phases):
        steps = r.steps_of_phase(i)
        half = steps.start + len(steps) // 2  # judge the second half of each phase: after learning
        frac[ph.batch] = r.spec_fraction_between(half, steps.stop)
    assert frac[1] >= 0.8 and frac[2] >= 0.8 and frac[4] >= 0.7, frac
    # mostly off at large batch; not zero: Nightjar explores 1/b of its bins and UCBSpec
    # keeps exploring gamma=1, which costs only ~7% at B=32
    assert frac[32] <= 0.4 and frac[64] <= 0.4, frac


def test_deterministic_by_seed():
    a = simulate(make_policy("composite", rng=random.Random(1)), stationary(), steps=150, seed=3)
    b = simulate(make_policy("composite", rng=random.Random(1)), stationary(), steps=150, seed=3)
    assert (a.tokens, a.gamma, a.time_s) == (b.tokens, b.gamma, b.time_s)


def test_record_and_replay_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    with open(path, "w") as f:
        simulate(make_policy("static", drafter="draft", gamma=3), stationary(), steps=80, seed=0,
                 record=lambda o: f.write(json.dumps(o.to_dict()) + "\n"))
    trace = read_trace(str(path))
    assert len(trace) == 80 and trace[0].sequences[0].gamma == 3
    same = replay(make_policy("static", drafter="draft", gamma=3), trace)
    assert same.agreement == 1.0 and same.covered == 1.0
    assert same.policy_goodput == pytest.approx(same.recorded_goodput)
    other = replay(make_policy("off"), trace)
    assert other.agreement == 0.0 and other.covered == 0.0


@pytest.mark.parametrize("name, params", [
    ("adaspec", dict(drafter="draft")),  # continue_drafting / verify_lengths: plays fewer than it plans
    ("nightjar", dict(drafter="draft")),  # learns from step times per batch size
    ("metasd", dict(drafters=["draft", "ngram"], gamma=4)),  # a bandit per request (on_request_start)
])
def test_replay_of_the_recording_policy_agrees_everywhere(name, params):
    env = ENVIRONMENTS["mixed"]()
    trace = record_trace(make_policy(name, rng=random.Random(0), **params), env, steps=200)
    r = replay(make_policy(name, rng=random.Random(0), **params), trace)
    assert (r.agreement, r.covered) == (1.0, 1.0)
    assert r.policy_goodput == pytest.approx(r.recorded_goodput)


class Spy:
    """Wraps a policy; keeps what the speculator told it."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.outcomes, self.started, self.ended = [], [], []

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def observe(self, outcome):
        self.outcomes.append(outcome)
        self.inner.observe(outcome)

    def on_request_start(self, seq_id):
        self.started.append(seq_id)

    def on_request_end(self, seq_id):
        self.ended.append(seq_id)


def test_replay_plays_the_policys_arms_on_the_recorded_verdicts():
    trace = record_trace(make_policy("static", drafter="draft", gamma=4), stationary(), steps=120)
    spy = Spy(make_policy("static", drafter="draft", gamma=2))
    r = replay(spy, trace)
    assert r.agreement == 0.0 and len(spy.outcomes) == len(trace)
    assert spy.started == [i for o in trace for i in o.joined] and spy.ended == [i for o in trace for i in o.left]
    for mine, o in zip(spy.outcomes, trace):
        assert mine.context == o.context and mine.total_time_s == o.total_time_s
        for s, rec in zip(mine.sequences, o.sequences):
            assert (s.seq_id, s.drafter, s.planned_gamma) == (rec.seq_id, "draft", 2)
            assert s.gamma == min(2, rec.gamma) and s.accepted == min(rec.accepted, s.gamma)
            assert s.emitted == min(s.accepted + 1, rec.emitted) and s.p_draft == rec.p_draft[:s.gamma]
    # a shorter gamma emits fewer tokens on the same verdicts
    assert sum(o.emitted for o in spy.outcomes) < sum(o.emitted for o in trace)


def test_replay_of_another_drafter_drafts_nothing():
    trace = record_trace(make_policy("static", drafter="draft", gamma=3), stationary(), steps=30)
    spy = Spy(make_policy("static", drafter="ngram", gamma=3))
    r = replay(spy, trace)
    assert r.agreement == 0.0 and r.covered == 0.0
    assert all((s.gamma, s.accepted, s.emitted) == (0, 0, 1) for o in spy.outcomes for s in o.sequences)


def test_replay_needs_recorded_contexts(tmp_path, capsys):
    trace = record_trace(make_policy("static", drafter="draft", gamma=3), stationary(), steps=10)
    trace[4] = replace(trace[4], context=None)
    with pytest.raises(ValueError, match="step 4 has no recorded context"):
        replay(make_policy("off"), trace)
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(o.to_dict()) + "\n" for o in trace))
    assert main(["--trace", str(path), "--policy", "off"]) == 2
    assert "step 4 has no recorded context" in capsys.readouterr().err


def test_cli_replays_a_trace(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    assert main(["--env", "stationary", "--policy", "static", "--steps", "40", "--record", str(path)]) == 0
    capsys.readouterr()
    assert main(["--trace", str(path), "--policy", "static", "off"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["static"][:2] == ["1.00", "1.00"] and rows["off"][:2] == ["0.00", "0.00"]


def test_cli_reports_table_and_config_errors(capsys, tmp_path):
    assert main(["--env", "stationary", "--policy", "static", "off", "--steps", "40"]) == 0
    out = capsys.readouterr().out
    assert "regret" in out and "static" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: static\nparams:\n  gamma: 99\n")
    assert main(["--config", str(bad), "--steps", "5"]) == 2
    assert "gamma=99 out of range" in capsys.readouterr().err
