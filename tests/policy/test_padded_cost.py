"""An engine that pads drafts (TensorRT-LLM 1.2) costs T(B, 1 + gamma) a step, every sequence
verifying the iteration's gamma: the profile's padded table, the step-time model reading it by
batch size, the composite planning with it, and `speculates_at` asking it before an iteration."""
import copy
import json
import logging
import random

import pytest

from backend.served_policy import TRTLLM_DEFAULTS, load_policy
from backend.server_config import ServerConfig
from policy import make_policy
from policy.params import PolicyConfigError
from policy.planner import plan_step
from policy.profiles import StepTimeProfile
from policy.steptime import StepTimeModel

from helpers import NGRAM, ctx

BATCH, TOKENS = (1, 4, 16, 64, 128), tuple(range(1, 10))


def padded(cost, buckets=(4096,)) -> StepTimeProfile:
    """A padded profile whose target time is cost(B, t); the token-batch table left as if unmeasured."""
    table = tuple(tuple(tuple(cost(b, t) for t in TOKENS) for b in BATCH) for _ in buckets)
    zeros = tuple(0.0 for _ in BATCH)
    return StepTimeProfile(buckets, BATCH, tuple(zeros for _ in buckets), tuple(zeros for _ in buckets), zeros, zeros,
                           shape_batch=BATCH, shape_tokens=TOKENS, shape_target_s=table, verify="padded")


def compute_bound(b, t):
    """Each token verified costs 0.1 ms: free at B=1, a whole step's worth per gamma at B=128."""
    return 0.010 + 1e-4 * b * t


def memory_bound(b, t):
    return 0.010 + 1e-6 * b * t


def composite(profile, **kw):
    return make_policy("composite", profile=profile, drafters=["ngram"], rng=random.Random(0), **kw)


# -- the profile ------------------------------------------------------------------------------
def test_the_padded_table_interpolates_in_batch_and_tokens_and_extrapolates_linearly():
    p = padded(compute_bound)
    assert p.padded and not StepTimeProfile.default().padded
    assert p.target_shape(100, 16, 3) == pytest.approx(compute_bound(16, 3))  # a grid point
    assert p.target_shape(100, 40, 2.5) == pytest.approx(compute_bound(40, 2.5))  # inside: bilinear = exact here
    assert p.target_shape(100, 256, 12) == pytest.approx(compute_bound(256, 12))  # beyond: the linear fit


def test_a_padded_profile_file_loads_with_its_token_batch_table_derived(tmp_path):
    d = {"verify": "padded", "ctx_buckets": [512, 2048], "batch": list(BATCH), "tokens_per_seq": list(TOKENS),
         "padded_target_s": [[[compute_bound(b, t) * (1 + c / 2048) for t in TOKENS] for b in BATCH]
                             for c in (512, 2048)],
         "draft_s": [[0.001] * len(BATCH)] * 2}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    p = StepTimeProfile.load(str(path))
    assert p.padded and p.token_batch == BATCH and p.ctx_buckets == (512, 2048)
    assert p.target_shape(2000, 64, 5) == pytest.approx(compute_bound(64, 5) * 2)  # the 2048 bucket
    # AdaSpec and SmartSpec read n tokens as B = n // 4 sequences of 4 (profile_costs' shape)
    assert p.target(100, 64) == pytest.approx(compute_bound(16, 4) * 1.25)
    assert p.target(100, 1) == pytest.approx(compute_bound(1, 1) * 1.25)
    d["padded_target_s"][1] = d["padded_target_s"][1][:3]
    path.write_text(json.dumps(d))
    with pytest.raises(PolicyConfigError, match="padded_target_s"):
        StepTimeProfile.load(str(path))


def test_an_old_profile_reads_as_before_whatever_the_batch(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"ctx_buckets": [128], "token_batch": [1, 2, 8], "target_s": [[0.01, 0.02, 0.08]],
                                "draft_s": [[0.001, 0.002, 0.008]]}))
    p = StepTimeProfile.load(str(path))
    assert not p.padded and p.target(100, 4) == pytest.approx(0.04)
    m = StepTimeModel(p, ema=0.2)
    assert m.profiled(100.0, 6, 2, 1, batch=2) == m.profiled(100.0, 6, 2, 1)
    assert m.row(1, 2, 100.0, 1, 0, 4) == [m.step_time(1, 100.0, 2 + g, g, 0) for g in range(5)]


# -- the step-time model ------------------------------------------------------------------------
def test_with_a_padded_profile_the_batch_pays_the_iterations_gamma_whatever_the_tokens_say():
    p = padded(compute_bound)
    m = StepTimeModel(p, ema=0.2)
    for n_tokens in (64, 65, 64 + 64 * 3):  # one sequence drafting 3, or all 64 of them: the same step
        assert m.profiled(1000.0, n_tokens, 3, 0, batch=64) == pytest.approx(p.target_shape(1001.5, 64, 4))
    assert m.profiled(1000.0, 64, 0, 0, batch=64) == pytest.approx(compute_bound(64, 1))  # a plain step
    row = m.row(64, 64, 1000.0, 1, 0, 8)  # one sequence of 64 drafting g
    assert row == pytest.approx([compute_bound(64, 1 + g) for g in range(9)])


def test_the_composite_learns_its_step_time_against_the_padded_shape():
    pol = composite(padded(compute_bound))
    c = ctx(batch=16, drafters=(NGRAM,), ctx_len=1000)
    from policy.types import SequenceOutcome, StepOutcome
    seqs = [SequenceOutcome(i, "ngram" if i == 0 else None, 4 if i == 0 else 0, 1, 2) for i in range(16)]
    pol.observe(StepOutcome(0, 16, seqs, total_time_s=2 * compute_bound(16, 5), context=c))
    assert pol.times.ratio[(16, "free", 4)][0] == pytest.approx(2.0)  # one drafter of 16: T(16, 5) all the same


# -- planning -------------------------------------------------------------------------------------
def alphas_seen(pol, alphas):
    for i, a in enumerate(alphas):
        pol.acceptance.observe_step(i, [("ngram", round(200 * a), 200)])


def test_eliminating_a_drafting_sequence_saves_nothing_unless_it_is_the_last():
    alphas = [0.9, 0.9, 0.9, 0.02]
    steep = lambda b, t: 0.010 + 0.001 * b * t  # noqa: E731  every token verified costs
    for profile, keep_all in ((padded(steep), True),
                              (StepTimeProfile((4096,), BATCH, (tuple(steep(1, n) for n in BATCH),),
                                               ((0.0,) * 5,), (0.0,) * 5, (0.0,) * 5), False)):
        pol = composite(profile, explore=0.0, optimism=0.0)
        alphas_seen(pol, alphas)
        arms = pol.decide(ctx(batch=4, drafters=(NGRAM,), ctx_len=1000)).arms
        assert arms and (set(arms) == {0, 1, 2, 3}) == keep_all, profile.padded
    # the planner itself: one sequence left drafting at a padded cost, dropping it is plain decoding
    m = StepTimeModel(padded(steep), ema=0.2)
    row = m.row(4, 4, 1000.0, 4, 0, 8)
    plan = plan_step(alphas, [False] * 4, row, lambda n, g, nm: m.step_time(4, 1000.0, n, g, nm, 4),
                     [0.0] * 9, None, 0.0)
    assert plan.gamma > 0 and plan.keep == frozenset(range(4))


def test_at_large_batches_long_gammas_get_expensive_for_the_whole_batch():
    gammas = {}
    for b in (1, 128):
        pol = composite(padded(compute_bound), explore=0.0, optimism=0.0)
        alphas_seen(pol, [0.7] * b)
        arms = pol.decide(ctx(batch=b, drafters=(NGRAM,), ctx_len=1000)).arms
        gammas[b] = max((a.gamma for a in arms.values()), default=0)
    assert gammas[1] == 8 and gammas[128] < 3


# -- speculates_at --------------------------------------------------------------------------------
def test_speculates_at_small_batches_not_where_padding_costs_more_than_it_gains():
    pol = composite(padded(compute_bound), prior_alpha=0.5)
    pol.decide(ctx(batch=2, drafters=(NGRAM,), ctx_len=1000))  # what it last saw: the context, the drafters
    assert pol.speculates_at(1) and pol.speculates_at(4)
    assert not pol.speculates_at(128)  # E(.5, 1) = 1.5 tokens for 1.56x the step
    cheap = composite(padded(memory_bound), prior_alpha=0.5)
    assert cheap.speculates_at(128)  # verification nearly free: speculation pays at any batch


def test_no_speculation_when_acceptance_is_about_zero():
    pol = composite(padded(compute_bound), prior_alpha=0.5)
    assert pol.speculates_at(1)
    alphas_seen(pol, [0.0] * 4)
    for _ in range(30):
        alphas_seen(pol, [0.0])
    assert pol.acceptance.global_alpha("ngram") < 0.001
    assert not pol.speculates_at(1) and not pol.speculates_at(64)  # 1 + alpha tokens for 1% more time at B=1
    # verification nearly free: only a rate of exactly 0 (no token gained) never pays
    assert not composite(padded(memory_bound), prior_alpha=0.0).speculates_at(1)


def test_speculates_at_heeds_the_slo_and_kv_pressure():
    pol = composite(padded(compute_bound), prior_alpha=0.9)
    assert pol.speculates_at(4)
    assert not pol.speculates_at(4, queue_len=3, kv_free_blocks=5, kv_total_blocks=1000)  # decide would not draft
    assert pol.speculates_at(4, queue_len=3, kv_free_blocks=500, kv_total_blocks=1000)
    pol.decide(ctx(batch=4, drafters=(NGRAM,), ctx_len=1000, slo=compute_bound(4, 1) * 1.0001))
    assert not pol.speculates_at(4)  # only plain steps meet the SLO
    pol.decide(ctx(batch=4, drafters=(NGRAM,), ctx_len=1000, slo=None))
    assert pol.speculates_at(4)


def test_speculates_at_learns_nothing():
    pol = composite(padded(compute_bound), prior_alpha=0.5)
    pol.decide(ctx(batch=8, drafters=(NGRAM,), ctx_len=1000))
    alphas_seen(pol, [0.6] * 8)

    def state():
        return (pol.rng.getstate(), copy.deepcopy(pol.acceptance.glob), copy.deepcopy(pol.acceptance.seq),
                copy.deepcopy(pol.pulls), copy.deepcopy(pol.times.ratio), pol._drafting, pol._seen,
                copy.deepcopy(pol.memory.__dict__))

    before = state()
    answers = [pol.speculates_at(b) for b in (1, 3, 8, 64, 128, 1000) for _ in range(3)]  # fewer than probe_every
    assert state() == before and any(answers) and not all(answers)


# -- the served default on trtllm -------------------------------------------------------------------
@pytest.fixture
def project(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "p.yaml").write_text("policy: composite\nparams:\n  drafters: [ngram]\n"
                                     "  profile_path: profiles/m-{engine}.json\n"
                                     "  switch_cost_path: profiles/m-{engine}.switch.json\n")
    return tmp_path


def test_trtllm_without_its_own_profile_plans_with_the_default_curve(project, caplog):
    cfg = ServerConfig(checkpoint="ckpt", policy="p.yaml", engine="trtllm")
    with caplog.at_level(logging.INFO, logger="specserve"):
        pol = load_policy(cfg, project)
    assert pol.times.profile == StepTimeProfile.load(str(TRTLLM_DEFAULTS["profile_path"]))
    assert pol.times.profile.padded
    assert any(r.levelno == logging.INFO and "trtllm-default.json" in r.getMessage() for r in caplog.records)
    # the switch cost has no default of its own: left out, with the usual warning
    assert any(r.levelno == logging.WARNING and "m-trtllm.switch.json" in r.getMessage() for r in caplog.records)
    # a measured profile wins
    (project / "profiles").mkdir()
    (project / "profiles" / "m-trtllm.json").write_text(json.dumps(
        {"ctx_buckets": [128], "token_batch": [1, 2], "target_s": [[0.03, 0.06]], "draft_s": [[0.0, 0.0]]}))
    assert load_policy(cfg, project).times.profile.target_s[0][0] == pytest.approx(0.03)


def test_other_engines_still_drop_a_missing_profile(project):
    pol = load_policy(ServerConfig(checkpoint="ckpt", policy="p.yaml", engine="torch"), project)
    assert pol.times.profile == StepTimeProfile.default()


def test_the_default_trtllm_curve_says_where_it_came_from():
    d = json.loads(TRTLLM_DEFAULTS["profile_path"].read_text())
    assert d["verify"] == "padded" and d["ctx_buckets"] == [512, 2048]
    for word in ("H200", "llama3-8b", "random", "2026-11-26", "bench/gpu_step_costs.py", "docs/results.md"):
        assert word in d["source"]
    p = StepTimeProfile.load(str(TRTLLM_DEFAULTS["profile_path"]))
    # the H200's kernel times (docs/results.md): 13.52 ms for 128 plain steps at 512 cached, 32.98 at t = 7
    assert p.target_shape(512, 128, 1) == pytest.approx(0.01352, abs=1e-5)
    assert p.target_shape(512, 128, 8) == pytest.approx(0.03298, abs=1e-5)  # t=8 read up to t=7's (monotone)
    assert p.draft(512, 1) == pytest.approx(0.00182, abs=1e-5)


def test_a_static_pad_length_prices_every_speculating_iteration_at_it():
    """TensorRT-LLM 1.2 pads to the served max_draft_len whatever gamma is (pad_to): a step of any
    gamma >= 1 costs T(B, 1 + pad_to), so when speculation is on the plan drafts the full length
    (shorter drafts save nothing), and speculates_at weighs that whole cost."""
    import dataclasses
    m = StepTimeModel(dataclasses.replace(padded(compute_bound), pad_to=8), ema=0.2)
    assert m.profiled(1000.0, 64, 1, 0, 64) == pytest.approx(compute_bound(64, 9))
    assert m.profiled(1000.0, 64, 0, 0, 64) == pytest.approx(compute_bound(64, 1))
    pol = composite(dataclasses.replace(padded(compute_bound), pad_to=8), explore=0.0, optimism=0.0)
    alphas_seen(pol, [0.7])
    arms = pol.decide(ctx(batch=1, drafters=(NGRAM,), ctx_len=1000)).arms
    assert {a.gamma for a in arms.values()} == {8}
    assert pol.speculates_at(1) and not pol.speculates_at(128)  # 128 x 9 tokens: 5.6x a plain step


def test_the_default_trtllm_curve_pads_to_the_served_draft_length():
    from backend.services.trtllm.serving import DEFAULT_MAX_DRAFT_LEN
    assert StepTimeProfile.load(str(TRTLLM_DEFAULTS["profile_path"])).pad_to == DEFAULT_MAX_DRAFT_LEN


def test_a_no_ends_in_a_probe_so_the_policy_keeps_learning():
    """An engine that skips the hook in iterations without speculation (TensorRT-LLM 1.2) shows
    the policy nothing then: after probe_every "no"s in a row for a batch-size bucket, one "yes"
    lets `decide` explore and the step be learned from. probe_every 0 never probes."""
    pol = composite(padded(compute_bound), prior_alpha=0.5, probe_every=5)
    pol.decide(ctx(batch=2, drafters=(NGRAM,), ctx_len=1000))
    answers = [pol.speculates_at(128) for _ in range(10)]
    assert answers == [False] * 4 + [True] + [False] * 4 + [True]
    assert pol.speculates_at(1)  # another bucket, where speculation pays: yes, and no probe count
    never = composite(padded(compute_bound), prior_alpha=0.5, probe_every=0)
    assert not any(never.speculates_at(128) for _ in range(200))
