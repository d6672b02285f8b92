"""The target's profile is a table by shape, T(context, B sequences, t tokens each), measured
within the profile's budget, with the token-batch table read off it (build_engines/shape_table.py)."""
import json

import pytest

from build_engines import profile_costs
from build_engines.shape_table import SHAPE_BATCH, SHAPE_MAX_TOKENS, SHAPE_PRIORITY, SHAPE_TOKENS, interpolate_shapes
from policy.profiles import StepTimeProfile


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def llama_like(ctx, b, t):
    """A step whose cost is not a function of B x t alone: 8 ms a pass, 2.5 ms a token, and
    verifying dearer the more sequences do (so 32 x 1 < 8 x 4 and 16 x 4 < 32 x 2, as in the
    figures issue 40's (B, t) work started from: 108 < 148 ms and 204 < 251), plus attention."""
    return 0.008 + 0.0025 * b * t + 1e-4 * b * b * (t - 1) + 2e-6 * ctx * b * t


class FakeEngine:
    """Advances the profiler's clocks by the step's cost; records the shapes it ran."""

    def __init__(self, clock):
        self.clock, self.shapes = clock, []

    def forward(self, slots, starts, tokens, logit_rows=None):
        b, t = len(slots), len(tokens[0])
        assert all(len(x) == t for x in tokens) and len(set(starts)) == 1
        self.shapes.append((b, t))
        self.clock.now += llama_like(starts[0], b, t)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(profile_costs.time, "monotonic", c)
    monkeypatch.setattr(profile_costs.time, "perf_counter", c)
    return c


def test_the_target_profile_is_a_table_by_shape_with_the_token_batch_table_read_off_it(clock, tmp_path):
    engine = FakeEngine(clock)
    target = profile_costs.target_profile(engine, repeats=3, budget_s=1000)
    ctxs = profile_costs.CTX_BUCKETS
    assert target["verify"] == "ragged"
    assert (target["batch"], target["tokens_per_seq"]) == (list(SHAPE_BATCH), list(SHAPE_TOKENS))
    assert max(b for b, _ in engine.shapes) == max(SHAPE_BATCH)
    assert max(t for _, t in engine.shapes) == max(SHAPE_TOKENS)
    # every shape of up to SHAPE_MAX_TOKENS tokens measured; the larger ones extended along t
    small = [[b * t <= SHAPE_MAX_TOKENS for t in SHAPE_TOKENS] for b in SHAPE_BATCH]
    assert target["shape_measured"] == [small] * len(ctxs) and not all(map(all, small))
    for ctx, rows in zip(ctxs, target["shape_target_s"]):
        assert rows == [[pytest.approx(llama_like(ctx, b, t), rel=0 if b * t <= SHAPE_MAX_TOKENS else 0.15)
                         for t in SHAPE_TOKENS] for b in SHAPE_BATCH]
    # the token-batch table every policy can read: n tokens as shape_for(n), as it was measured before
    assert target["token_batch"] == list(profile_costs.TOKEN_BATCH)
    for ctx, row in zip(ctxs, target["target_s"]):
        assert row == [pytest.approx(llama_like(ctx, *profile_costs.shape_for(n))) for n in target["token_batch"]]
    assert target["measured"] == [[True] * len(profile_costs.TOKEN_BATCH)] * len(ctxs)
    # the policy loads it, and reads a step by its shape
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**target, "draft_s": [[0.0] * len(target["token_batch"])] * len(ctxs)}))
    p = StepTimeProfile.load(str(path))
    assert not p.padded and p.target_step(512, 64, 32) == pytest.approx(llama_like(512, 32, 2))
    assert p.target_step(512, 64, 32) > 1.05 * p.target(512, 64)  # 32 x 2 costs more than 16 x 4
    assert p.target_step(512, 32, 32) < 0.9 * p.target(512, 32)  # 32 x 1 less than 8 x 4


def test_within_a_tight_budget_the_informative_shapes_come_first_and_the_rest_is_interpolated(clock):
    engine = FakeEngine(clock)
    target = profile_costs.target_profile(engine, repeats=3, budget_s=8)
    index = {(b, t): (i, j) for i, b in enumerate(SHAPE_BATCH) for j, t in enumerate(SHAPE_TOKENS)}
    for rows, marks in zip(target["shape_target_s"], target["shape_measured"]):
        measured = {s for s, (i, j) in index.items() if marks[i][j]}
        assert (1, 1) in measured and len(measured) < len(index)  # each context's first point, not all
        assert set(SHAPE_PRIORITY[0]) <= measured  # batch-1 speculation and the decode anchors
        for b, row in zip(SHAPE_BATCH, rows):  # unmeasured points filled, more tokens never cheaper
            assert min(row) > 0 and all(y >= x for x, y in zip(row, row[1:])), (b, row)
    assert sum(target["measured"][0]) >= 3  # the token-batch table marks what was measured
    assert clock.now < 8 + 3 * 0.3  # the budget, give or take a context's first points


def test_shapes_not_measured_are_read_along_their_batch_then_their_tokens_then_by_token_count():
    known = {(1, 1): 0.010, (1, 4): 0.025, (8, 1): 0.030, (32, 1): 0.108, (32, 2): 0.251}
    got = dict(zip([(1, 2), (16, 1), (32, 4), (8, 2)],
                   interpolate_shapes([(1, 2), (16, 1), (32, 4), (8, 2)], known)))
    assert got[1, 2] == pytest.approx(0.015)  # in t through B = 1's points
    assert got[16, 1] == pytest.approx(0.030 + 0.078 * 8 / 24)  # in B through t = 1's
    assert got[32, 4] == pytest.approx(0.251 + 2 * 0.143)  # in t, beyond: the last segment extended
    assert got[8, 2] == pytest.approx(0.030 + 0.078 * 8 / 24)  # neither has two: by token count, 16 of them


def test_an_old_profile_without_the_table_by_shape_is_measured_again(tmp_path):
    """A profile of version 2 (by token count only) is not reused: the policy would read
    shapes it does not have."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"profile_version": 2, "engine": "torch/bf16", "ctx_buckets": [128],
                                "token_batch": [1], "target_s": [[0.01]], "measured": [[True]]}))
    assert profile_costs.reusable_target(path, "torch/bf16") is None
    path.write_text(json.dumps({**json.loads(path.read_text()), "profile_version": profile_costs.PROFILE_VERSION,
                                "verify": "ragged", "batch": [1], "tokens_per_seq": [1],
                                "shape_target_s": [[[0.01]]], "shape_measured": [[[True]]]}))
    assert profile_costs.reusable_target(path, "torch/bf16")["shape_target_s"] == [[[0.01]]]
