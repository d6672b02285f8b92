"""An engine that runs each sequence's own tokens (llama.cpp) is priced by the step's shape, B
sequences of n / B tokens, from the profile's table by shape (build_engines/shape_table.py), not
by its token count alone."""
import json

import pytest

from policy.goodput import adaspec_step_time
from policy.profiles import StepTimeProfile
from policy.steptime import StepTimeModel

BATCH, TOKENS = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8)
# the figures issue 40's (B, t) work started from (seconds): the verify curve of session 26 for
# 1 and 32 streams (docs/results.md) and a version-2 profile's n / 4 x 4 shapes
MEASURED = {(1, 1): 0.0104, (1, 2): 0.0135, (1, 4): 0.0206, (1, 8): 0.0330, (32, 1): 0.108, (32, 2): 0.251,
            (2, 4): 0.0298, (4, 4): 0.0632, (8, 4): 0.148, (16, 4): 0.204, (32, 4): 0.4635}


def cost(b, t):
    """The measured points; the others linear in t through a B's t = 1 and t = 4 points."""
    if (b, t) in MEASURED:
        return MEASURED[b, t]
    one = MEASURED.get((b, 1), 0.0104 + (0.108 - 0.0104) * (b - 1) / 31)
    four = MEASURED.get((b, 4), 0.4635 * b / 32)
    return one + (four - one) * (t - 1) / 3


@pytest.fixture
def profile(tmp_path) -> StepTimeProfile:
    """A profile as build_engines/profile_costs.py writes it for llama.cpp (version 3)."""
    token_batch = [1, 2, 4, 8, 16, 32, 64, 128]
    as_measured_before = [(1, 1), (1, 2), (1, 4), (2, 4), (4, 4), (8, 4), (16, 4), (32, 4)]  # shape_for(n)
    path = tmp_path / "smollm2-135m-llama.cpp-Q8_0.json"
    path.write_text(json.dumps({
        "profile_version": 3, "engine": "llama.cpp/Q8_0", "ctx_buckets": [512], "verify": "ragged",
        "batch": list(BATCH), "tokens_per_seq": list(TOKENS),
        "shape_target_s": [[[cost(b, t) for t in TOKENS] for b in BATCH]],
        "token_batch": token_batch, "target_s": [[cost(b, t) for b, t in as_measured_before]],
        "draft_s": [[2e-5 * n for n in token_batch]]}))
    return StepTimeProfile.load(str(path))


def test_verifying_at_32_streams_costs_what_32_sequences_of_2_tokens_do(profile):
    """The token-count table read 32 x 1 as 8 x 4 (148 ms) and 32 x 2 as 16 x 4 (204 ms): with
    these figures verifying one draft looked 1.4 decode steps where it cost 2.3."""
    m = StepTimeModel(profile, ema=0.2)
    decode, verify = m.profiled(300.0, 32, 0, 0, batch=32), m.profiled(300.0, 64, 1, 0, batch=32)
    assert (decode, verify) == (pytest.approx(0.108), pytest.approx(0.251))
    assert verify / decode == pytest.approx(2.32, abs=0.01)
    # the composite's row: all 32 drafting g tokens verify 1 + g each
    t3 = (cost(32, 2) + cost(32, 4)) / 2  # between the table's t = 2 and 4
    assert m.row(0, 32, 300.0, 32, 0, 3) == pytest.approx([cost(32, 1), cost(32, 2), t3, cost(32, 4)])
    # one stream verifying 7 drafts runs 1 x 8, not 2 x 4
    assert m.profiled(300.0, 8, 7, 0, batch=1) == pytest.approx(0.0330)
    # AdaSpec and SmartSpec price their steps the same way
    assert adaspec_step_time(profile, 1, 32, 32 * 300, draft_steps=0) == pytest.approx(0.251)
    assert adaspec_step_time(profile, 0, 32, 32 * 300) == pytest.approx(0.108)


def test_a_ragged_step_costs_the_cheaper_of_one_padded_pass_and_a_split_one(profile):
    """llama.cpp runs 16 of 32 sequences verifying 4 tokens beside 16 decoding as one pass padded
    to 4 tokens each, or as 32 x 1 then the 16's drafts (a micro-batch takes as many tokens from
    each of a run of consecutive sequences): scattered among the slots, one more pass each, 16 x
    T(1, 3); not as 32 sequences of 2.5 tokens, nor the 16's drafts as one pass."""
    m = StepTimeModel(profile, ema=0.2)
    t1x3 = (cost(1, 2) + cost(1, 4)) / 2  # between the table's t = 2 and 4
    split = cost(32, 1) + 16 * t1x3
    assert split != pytest.approx(cost(32, 1) + (cost(16, 2) + cost(16, 4)) / 2)  # not one pass of 16 x 3
    want = min(split, cost(32, 4))
    assert m.profiled(300.0, 80, 3, 0, batch=32) == pytest.approx(want)
    assert m.row(0, 32, 300.0, 16, 0, 3)[3] == pytest.approx(want)  # the composite's row, 16 drafting
    # two of 32 verifying 4: a decode pass and two passes of 1 x 3, cheaper than padding 32 to 4
    assert cost(32, 1) + 2 * t1x3 < cost(32, 4)
    assert m.profiled(300.0, 38, 3, 0, batch=32) == pytest.approx(cost(32, 1) + 2 * t1x3)
    # one sequence of 32 verifying 8 tokens: a decode pass and a pass of 1 x 7
    assert m.profiled(300.0, 39, 7, 0, batch=32) == pytest.approx(cost(32, 1) + (cost(1, 4) + 3 * cost(1, 8)) / 4)


def test_without_the_batch_or_the_table_the_token_count_table_is_read(profile, tmp_path):
    assert profile.target_step(300.0, 64) == pytest.approx(0.204)
    path = tmp_path / "v2.json"
    d = json.loads(next(tmp_path.glob("*Q8_0.json")).read_text())
    path.write_text(json.dumps({k: v for k, v in d.items() if k not in ("shape_target_s", "verify")}))
    old = StepTimeModel(StepTimeProfile.load(str(path)), ema=0.2)
    assert old.profiled(300.0, 64, 1, 0, batch=32) == pytest.approx(0.204)
