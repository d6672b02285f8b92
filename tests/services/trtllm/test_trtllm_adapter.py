"""The TensorRT-LLM drafter hook (backend/services/trtllm) against a fake `tensorrt_llm` shaped
after the real 1.2.x sources (upstream_api.json records the names and signatures read):
the adapter uses nothing outside that record, and a fake executor that calls the hook every
iteration and verifies with the torch engine produces exactly plain greedy output under
every policy, keeps max_tokens, releases cancelled requests and never drafts past
max_draft_len. Not a GPU run: see docs/trtllm.md for what this cannot prove."""
import ast
import inspect
import pickle
from pathlib import Path

import pytest

from backend.drafters import make_drafter
from backend.drafters.ngram import NgramDrafter
from policy import POLICIES, make_policy
from policy.external import IterationDrafter
from policy.simulator import DEFAULT_PARAMS
from policy.speculator import Speculator

ROOT = Path(__file__).resolve().parents[3]
ADAPTER = ROOT / "backend" / "services" / "trtllm"
PROMPTS = [
    "Repeat exactly: the river runs, the river runs, the river runs.",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
]
MAX_NEW = 16
MAX_DRAFT = 4


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(p).input_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def plain(trt_engine, prompts):
    from own_loop import OwnLoopEngine
    return OwnLoopEngine(trt_engine).generate(prompts, MAX_NEW)


def policy_for(name):
    params = dict(DEFAULT_PARAMS.get(name, {}))
    if "drafter" in params:
        params["drafter"] = "ngram"
    if "drafters" in params:
        params["drafters"] = ["ngram", "suffix"]
    return make_policy(name, **params)


def adaptive(policy, drafters=None, max_draft_len=MAX_DRAFT, on_outcome=None):
    from backend.services.trtllm.drafter import AdaptiveDrafter
    drafters = drafters if drafters is not None else {n: make_drafter(n) for n in ("ngram", "suffix")}
    spec = Speculator(policy, drafters, on_outcome=on_outcome)
    return AdaptiveDrafter(IterationDrafter(spec, max_draft_len=max_draft_len))


def executor(engine, drafter, **kw):
    from fake_executor import FakePyExecutor
    return FakePyExecutor(engine, drafter, MAX_DRAFT, **kw)


def assert_within_record(record):
    from tensorrt_llm import _fake
    outside = sorted((kind, name) for kind, name in _fake.ACCESSES
                     if name not in set(record["classes"][kind].get("attributes", []))
                     | set(record["classes"][kind].get("methods", {})))
    assert not outside, f"the adapter touched names the upstream record does not have: {outside}"


# -- the record and the fake ----------------------------------------------------------------------
def test_the_fake_has_the_recorded_signatures(fake_trtllm, upstream_record):
    import importlib
    for module, names in upstream_record["modules"].items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
    from tensorrt_llm import _fake
    fakes = {qual: cls for cls, qual in _fake.KINDS.items()}
    for mod_name, names in upstream_record["modules"].items():
        for name in names:
            obj = getattr(importlib.import_module(mod_name), name)
            if isinstance(obj, type):
                fakes.setdefault(f"{mod_name}.{name}", obj)
    fakes.setdefault("tensorrt_llm.LLM", fake_trtllm.LLM)
    fakes.setdefault("tensorrt_llm.SamplingParams", fake_trtllm.SamplingParams)
    for qual, entry in upstream_record["classes"].items():
        cls = fakes.get(qual)
        if cls is None:
            continue  # recorded for the reader (PyExecutor), not faked as a class
        if "init" in entry:
            params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
            assert params == entry["init"], f"{qual}.__init__{params} != record {entry['init']}"
        for method, expected in entry.get("methods", {}).items():
            attr = inspect.getattr_static(cls, method)
            if isinstance(attr, property):
                continue
            params = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
            assert params[: len(expected)] == expected, f"{qual}.{method}{params} != record {expected}"
        for member in upstream_record["members"].get(qual, []):
            assert hasattr(cls, member), f"{qual}.{member}"


def test_the_recorder_catches_a_name_outside_the_record(fake_trtllm, upstream_record):
    from tensorrt_llm import _fake
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequest, SamplingConfig
    q = _fake.record(LlmRequest(1, [1, 2], 4, SamplingConfig()))
    q.py_draft_tokens = [3]
    assert_within_record(upstream_record)
    with pytest.raises(AttributeError):
        q.py_not_upstream
    with pytest.raises(AssertionError, match="py_not_upstream"):
        assert_within_record(upstream_record)


def _api_names():
    """(module, name) of every `_get(...)` in _api.py, and the attributes taken off them."""
    tree = ast.parse((ADAPTER / "_api.py").read_text())
    gets, members = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_get":
            gets.append(tuple(a.value for a in node.args))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", None) == "_get":
            members.append((".".join(a.value for a in node.value.args), node.attr))
    return gets, members


def test_only_api_imports_tensorrt_llm_and_only_recorded_names():
    record = __import__("json").loads((Path(__file__).parent / "upstream_api.json").read_text())
    gets, members = _api_names()
    assert gets, "no _get calls found in _api.py"
    for module, name in gets:
        assert name in record["modules"].get(module, []), f"_api.py uses {module}.{name}, not in the record"
    for qual, member in members:
        assert member in record["members"].get(qual, []), f"_api.py uses {qual}.{member}, not in the record"
    for path in ROOT.joinpath("backend").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "tensorrt_llm" for a in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "tensorrt_llm", path
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.split(".")[0] == "tensorrt_llm" and path.name != "_api.py":
                assert False, f"{path} names a tensorrt_llm module; only _api.py may"


def test_importing_the_adapter_does_not_import_tensorrt_llm():
    import subprocess
    import sys
    code = ("import sys, backend.services.trtllm, backend.services.trtllm.drafter, backend.services.trtllm.serving; "
            "assert not any(m.startswith('tensorrt_llm') for m in sys.modules); "
            "assert backend.services.trtllm.available() is False")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- the hook, on the fake executor --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_greedy_output_equals_plain_greedy_under_every_policy(fake_trtllm, upstream_record, trt_engine, prompts,
                                                              plain, name):
    drafter = adaptive(policy_for(name))
    ex = executor(trt_engine, drafter)
    assert ex.generate(prompts, MAX_NEW) == plain
    set_lengths = [n for it in ex.set_lengths for n in it]
    assert max(set_lengths) <= MAX_DRAFT, "the hook set a draft longer than max_draft_len"
    assert all(n == MAX_DRAFT for it in ex.verified_lengths for n in it), "1.2 pads every draft to max_draft_len"
    if name != "off":
        assert any(set_lengths), f"{name} never speculated through the hook"
    else:
        assert not any(set_lengths)
    assert drafter.hook_errors == 0
    assert_within_record(upstream_record)


def test_max_tokens_holds_and_drafts_stop_at_the_limit(fake_trtllm, trt_engine, prompts):
    drafter = adaptive(make_policy("static", drafter="ngram", gamma=MAX_DRAFT))
    ex = executor(trt_engine, drafter)
    limits = [1, 5, MAX_NEW]
    outs = ex.generate(prompts, limits)
    assert [len(o) for o in outs] == limits
    assert all(ex.done[rid].finish_reason == "length" for rid in ex.done)


def test_a_cancelled_request_is_released(fake_trtllm, trt_engine, prompts):
    released, ended = [], []

    class Recording(NgramDrafter):
        def release(self, seq_id):
            released.append(seq_id)
            super().release(seq_id)

    policy = make_policy("static", drafter="ngram", gamma=MAX_DRAFT)
    end = policy.on_request_end
    policy.on_request_end = lambda seq_id: (ended.append(seq_id), end(seq_id))
    drafter = adaptive(policy, {"ngram": Recording()})
    ex = executor(trt_engine, drafter)
    rids = [ex.add_request(p, MAX_NEW) for p in prompts]
    for _ in range(3):
        ex.step()
    victim = rids[0]
    assert victim not in ex.done
    ex.cancel(victim)
    # The next iteration the hook finds the victim gone, in state GENERATION_COMPLETE, closes its
    # last step and lets it leave (drafters forget it at once); the policy hears of that after the
    # next step it observes.
    ex.step()
    assert ex.done[victim].finish_reason == "cancelled"
    ex.step()
    spec = drafter.iteration_drafter.spec
    assert victim in released, "the drafters still hold the cancelled request"
    assert victim not in spec.last_drafter and victim not in drafter.iteration_drafter._known
    ex.step()
    assert victim in ended, "the policy was not told the cancelled request ended"
    while ex.step():
        pass
    # TensorRT-LLM does not call the hook while idle: requests of the last busy iteration are
    # released when work arrives again
    ex.add_request(prompts[1], 6)
    while ex.step():
        pass
    assert set(rids) <= set(released) and set(rids) <= set(ended)


def test_the_hook_reads_kv_stats_skips_dummies_and_reports_acceptance(fake_trtllm, upstream_record, trt_engine,
                                                                      prompts):
    outcomes = []
    drafter = adaptive(make_policy("static", drafter="ngram", gamma=MAX_DRAFT), on_outcome=outcomes.append)
    ex = executor(trt_engine, drafter, dummy=True)
    ex.generate(prompts, MAX_NEW)
    drafter.finish()
    assert all(it[-1] == MAX_DRAFT for it in ex.set_lengths), "the dummy's placeholder draft was touched"
    seen = {s.seq_id for o in outcomes for s in o.sequences}
    assert 0 not in seen, "a dummy request reached the policy"
    ctxs = [(o.context.kv_free_blocks, o.context.kv_total_blocks) for o in outcomes]
    assert ctxs == ex.kv_reported[: len(ctxs)]
    assert sum(o.accepted for o in outcomes) > 0
    drafted = sum(min(s.gamma, MAX_DRAFT) for o in outcomes for s in o.sequences)
    assert drafted == sum(n for it in ex.set_lengths for n in it[:-1])
    for rid in ex.done:  # per-request counters for the serving layer
        d, a = drafter.request_stats(rid)
        assert 0 <= a <= d
    assert_within_record(upstream_record)


def test_a_failing_policy_falls_back_to_no_drafts(fake_trtllm, trt_engine, prompts, plain):
    policy = make_policy("static", drafter="ngram", gamma=MAX_DRAFT)

    def broken(ctx):
        raise RuntimeError("policy bug")

    policy.decide = broken
    drafter = adaptive(policy)
    ex = executor(trt_engine, drafter)
    assert ex.generate(prompts[:1], MAX_NEW) == plain[:1]
    assert drafter.hook_errors > 0 and not any(n for it in ex.set_lengths for n in it)


def test_the_class_pickles_by_reference_and_worker_mode_is_refused_when_the_component_cannot(fake_trtllm, tmp_path):
    """TensorRT-LLM ships the speculative config to its worker process by pickling it unless
    TLLM_WORKER_USE_SINGLE_PROCESS=1. The dynamically built class resolves by name; today's
    component does not pickle (Speculator's default drafter_blocks is a lambda, the suffix
    drafter holds a lock), so build_llm serves single-process and refuses worker mode clearly."""
    from backend.services.trtllm.drafter import AdaptiveDrafter, adaptive_drafter_class
    from backend.services.trtllm.serving import build_llm
    from backend.server_config import ServerConfig
    assert pickle.loads(pickle.dumps(AdaptiveDrafter)) is adaptive_drafter_class()
    drafter = adaptive(policy_for("composite"))
    assert isinstance(drafter, fake_trtllm._torch.speculative.drafter.Drafter)
    assert drafter.max_total_draft_tokens == MAX_DRAFT and drafter._static_max_total_draft_tokens == MAX_DRAFT
    with pytest.raises(Exception):
        pickle.dumps(drafter)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="single_process=True"):
        build_llm(ServerConfig(checkpoint=str(tmp_path), policy="static"), ROOT, single_process=False)
