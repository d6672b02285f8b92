"""`profile_costs --engine trtllm` (NOT YET RUN ON A GPU: no tensorrt_llm here): the padded
profile it writes from the iteration times it measures, how it times an iteration, the
profiling drafter, and the converter that made configs/profiles/trtllm-default.json."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from build_engines import profile_costs
from build_engines.profile_costs import CountingDrafterLogic, TrtllmTimer, from_gpu_step_costs, padded_table
from policy.profiles import StepTimeProfile

ROOT = Path(__file__).resolve().parents[2]


def fake_cost(ctx, b, t):
    return 0.005 + 1e-4 * b * t + 1e-6 * ctx


class FakeTimer:
    """What TrtllmTimer answers, from fake_cost; records what it was asked on which engine."""

    def __init__(self, k, log):
        self.k, self.log, self.closed = k, log, False

    def __call__(self, ctx, b, speculate):
        self.log.append((self.k, ctx, b, speculate))
        return fake_cost(ctx, b, 1 + self.k if speculate else 1)

    def close(self):
        self.closed = True


def test_the_padded_table_one_engine_per_draft_length_and_plain_steps_on_the_first():
    log, timers = [], []

    def timer_for(k):
        timers.append(FakeTimer(k, log))
        return timers[-1]

    table = padded_table((512, 2048), (1, 8), (1, 2, 5), timer_for)
    assert [t.k for t in timers] == [1, 4] and all(t.closed for t in timers)
    assert {(k, s) for k, _, _, s in log} == {(1, False), (1, True), (4, True)}  # t = 1: speculation off on K=1
    assert table == [[[fake_cost(c, b, t) for t in (1, 2, 5)] for b in (1, 8)] for c in (512, 2048)]


def test_engine_trtllm_writes_a_padded_profile_the_policies_load(tmp_path, monkeypatch):
    log = []
    monkeypatch.setattr(TrtllmTimer, "build", classmethod(lambda cls, ckpt, k, max_batch, max_context, repeats:
                                                          FakeTimer(k, log)))
    argv = ["--engine", "trtllm", "--checkpoint", str(tmp_path / "llama-8b"), "--model", "llama-8b",
            "--out-dir", str(tmp_path)]
    assert profile_costs.main(argv) == 0
    path = tmp_path / "llama-8b-trtllm.json"
    d = json.loads(path.read_text())
    default = json.loads(profile_costs.TRTLLM_DEFAULT.read_text())
    assert d["verify"] == "padded" and d["engine"] == "trtllm" and "--engine trtllm" in d["source"]
    assert d["tokens_per_seq"] == list(profile_costs.TRTLLM_TOKENS) and d["batch"] == default["batch"]
    assert d["draft_s"] == default["draft_s"]  # the target only is measured
    assert len({k for k, *_ in log}) == len(profile_costs.TRTLLM_TOKENS) - 1
    p = StepTimeProfile.load(str(path))
    for ctx in d["ctx_buckets"]:
        for b in (1, 32, 128):
            for t in profile_costs.TRTLLM_TOKENS:
                assert p.target_shape(ctx, b, t) == pytest.approx(fake_cost(ctx, b, t), abs=1e-7)
    # there: a second run measures nothing
    log.clear()
    assert profile_costs.main(argv) == 0 and not log


class FakeLLM:
    """llm.generate over B prompts: each iteration advances a clock by `step_s` and is counted by
    the drafter as TensorRT-LLM would ask it; a few prefill iterations first (they cancel out)."""

    def __init__(self, drafter, clock, step_s=0.02, prefill_iters=3, accepted_every=5):
        self.drafter, self.clock, self.step_s = drafter, clock, step_s
        self.prefill_iters, self.accepted_every, self.shut = prefill_iters, accepted_every, False

    def generate(self, prompts, params):
        self.clock.now += 0.5  # request set-up and responses: the same in every run
        iters = self.prefill_iters + params.max_tokens - 1
        if self.drafter.speculate:  # some drafts accepted: fewer iterations than tokens
            iters -= params.max_tokens // self.accepted_every
        for _ in range(iters):
            self.drafter.should_use_spec_decode([object()] * len(prompts), 128, 8192, self.drafter.k)
            self.clock.now += self.step_s


def test_an_iteration_is_timed_by_difference_over_the_iterations_counted(monkeypatch):
    clock = SimpleNamespace(now=0.0)
    drafter = CountingDrafterLogic.__new__(CountingDrafterLogic)
    drafter.k, drafter.speculate, drafter.iterations = 4, True, 0
    llm = FakeLLM(drafter, clock)
    monkeypatch.setattr("backend.services.trtllm._api.sampling_params_class",
                        lambda: lambda **kw: SimpleNamespace(**kw))
    timer = TrtllmTimer(llm, drafter, end_id=2, repeats=3, clock=lambda: clock.now)
    assert timer(512, 8, True) == pytest.approx(0.02)
    assert timer(512, 8, False) == pytest.approx(0.02) and drafter.speculate is False


def test_the_profiling_drafter_pads_every_request_and_counts_iterations():
    class Base:  # TensorRT-LLM 1.2's Drafter.__init__ keywords (tests/backend/services/trtllm/upstream_api.json)
        def __init__(self, max_draft_len, max_total_draft_tokens, max_concurrency=None, draft_len_schedule=None):
            self.max_draft_len, self.max_total_draft_tokens = max_draft_len, max_total_draft_tokens

    d = type("D", (CountingDrafterLogic, Base), {})(3)
    assert d.max_total_draft_tokens == 3
    reqs = [SimpleNamespace(py_draft_tokens=[]) for _ in range(2)]
    assert d.should_use_spec_decode(reqs, 8, 8192, 3) and d.iterations == 1
    d.should_use_spec_decode([], 8, 8192, 3)  # an idle loop is no iteration
    d.speculate = False
    assert not d.should_use_spec_decode(reqs, 8, 8192, 3) and d.iterations == 2
    d.prepare_draft_tokens(SimpleNamespace(generation_requests=reqs, context_requests=[]))
    assert [r.py_draft_tokens for r in reqs] == [[profile_costs.DRAFT_TOKEN] * 3] * 2


def test_the_default_trtllm_curve_is_the_converted_h200_run(tmp_path):
    src = "docs/results/gpu_step_costs_h200.json"
    costs = json.loads((ROOT / src).read_text())
    assert from_gpu_step_costs(costs, src) == json.loads(profile_costs.TRTLLM_DEFAULT.read_text())
    out = tmp_path / "p.json"
    assert profile_costs.main(["--from-gpu-step-costs", str(ROOT / src), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["measured_s"][0][-1][2] == pytest.approx(costs["target"]["gpu_s"][0][-1][2], abs=1e-7)
    for rows in d["padded_target_s"]:  # non-decreasing in t
        assert all(b >= a for row in rows for a, b in zip(row, row[1:]))
