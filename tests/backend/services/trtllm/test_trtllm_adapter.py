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

ROOT = Path(__file__).resolve().parents[4]
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
            # a dotted module path, or the package named to an import call ("tensorrt_llm" alone is
            # also NVIDIA's name of a Triton model, which the front end routes)
            if path.name != "_api.py" and isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith("tensorrt_llm."), f"{path} names a tensorrt_llm module; only _api.py may"
            if path.name != "_api.py" and isinstance(node, ast.Call) and node.args and \
                    isinstance(node.args[0], ast.Constant) and str(node.args[0].value).split(".")[0] == "tensorrt_llm":
                assert False, f"{path} imports tensorrt_llm by name; only _api.py may"


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
    assert max(set_lengths, default=0) <= MAX_DRAFT, "the hook set a draft longer than max_draft_len"
    # 1.2 verifies the static length in an iteration that speculates (padding), nothing in one that does not
    assert all(v == (MAX_DRAFT if it.spec_on else 0) for it in ex.iterations for v in it.verified)
    if name != "off":
        assert any(set_lengths), f"{name} never speculated through the hook"
    else:
        assert not any(it.spec_on for it in ex.iterations), "off must switch the iteration's speculation off"
        assert ex.drafted == 0, "under off the GPU verified padded positions"
    assert drafter.hook_errors == 0
    assert_within_record(upstream_record)


def test_the_policy_switches_an_iterations_speculation_off_before_it_is_padded(fake_trtllm, trt_engine, prompts,
                                                                               plain):
    """vLLM's disable-by-batch-size rule through speculates_at: iterations with 2+ active requests
    verify no extra position at all (before, 1.2's padding verified max_draft_len whatever the
    policy said); iterations with one verify the static length; output stays plain greedy."""
    drafter = adaptive(make_policy("vllm_disable_by_batch_size", drafter="ngram", gamma=2, disable_batch_size=2))
    ex = executor(trt_engine, drafter)
    assert ex.generate(prompts, [MAX_NEW, 4, 6]) == [plain[0], plain[1][:4], plain[2][:6]]
    busy = [it for it in ex.iterations if it.batch_size >= 2]
    alone = [it for it in ex.iterations if it.batch_size == 1]
    assert busy and alone
    assert all(not it.spec_on and not any(it.verified) for it in busy)
    assert all(it.spec_on and all(v == MAX_DRAFT for v in it.verified) for it in alone if it.verified)
    assert drafter.iteration_lengths[0] == len(busy) and drafter.iteration_lengths[MAX_DRAFT] == len(alone)


def test_mixed_context_and_generation_iterations_and_distinct_ids(fake_trtllm, upstream_record, trt_engine, prompts,
                                                                  plain):
    """Chunked prefill: a request's prompt takes several iterations as a context request while
    others generate in the same forward; the hook drafts for generation requests only, and keys
    the serving layer's counters by the LLM API's client id, not the executor's request id."""
    drafter = adaptive(make_policy("static", drafter="ngram", gamma=MAX_DRAFT))
    ex = executor(trt_engine, drafter, chunk=8)
    first = ex.add_request(prompts[0], MAX_NEW)
    for _ in range(4):
        ex.step()
    later = [ex.add_request(p, MAX_NEW) for p in prompts[1:]]
    while ex.step():
        pass
    assert [ex.done[c].generated for c in [first] + later] == plain
    assert any(it.context and it.set_lengths for it in ex.iterations), "no iteration mixed context and generation"
    stats = [drafter.request_stats(c) for c in [first] + later]
    assert all(ex.done[c].rid != c for c in [first] + later)  # executor ids start at max_batch_size, client ids at 1
    assert sum(d for d, _ in stats) == ex.drafted_by_hook and all(0 <= a <= d for d, a in stats)
    assert sum(d for d, _ in stats) > 0
    assert_within_record(upstream_record)


def test_queue_len_is_the_requests_waiting(fake_trtllm, trt_engine, prompts):
    """The policy's queue length is what waits for a slot: the serving layer's requests in flight
    minus the executor's active ones (not the context requests of the iteration)."""
    outcomes = []
    drafter = adaptive(make_policy("static", drafter="ngram", gamma=MAX_DRAFT), on_outcome=outcomes.append)
    ex = executor(trt_engine, drafter)  # 3 slots
    drafter.in_flight = lambda: len(ex.waiting) + len(ex.active)
    waiting_seen = []
    speculates = drafter.iteration_drafter.spec.policy.speculates_at

    def spy(batch_size, **load):
        waiting_seen.append((load["queue_len"], len(ex.waiting)))
        return speculates(batch_size, **load)

    drafter.iteration_drafter.spec.policy.speculates_at = spy
    ex.generate(prompts * 2, 6)
    assert waiting_seen and all(q == w for q, w in waiting_seen)
    assert any(q == 3 for q, _ in waiting_seen), "six requests on three slots: three wait at first"
    assert [o.context.queue_len for o in outcomes][:1] == [3]


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
    cids = [ex.add_request(p, MAX_NEW) for p in prompts]
    for _ in range(3):
        ex.step()
    victim = cids[0]
    assert victim not in ex.done
    ex.abort(victim)
    rid = ex.request(victim).rid  # the speculator knows requests by the executor's id
    # 1.2 acts on a cancel at the end of the next iteration: the victim is still drafted for and
    # verified in it, then ends in state GENERATION_COMPLETE
    ex.step()
    assert ex.done[victim].finish_reason == "cancelled"
    assert rid in {s for it in [drafter.iteration_drafter._known] for s in it} or rid in released
    # the next iteration's start closes its last step and lets it leave: the drafters forget it at
    # once, the policy after the next step it observes
    ex.step()
    spec = drafter.iteration_drafter.spec
    assert rid in released, "the drafters still hold the cancelled request"
    assert rid not in spec.last_drafter and rid not in drafter.iteration_drafter._known
    ex.step()
    assert rid in ended, "the policy was not told the cancelled request ended"
    while ex.step():
        pass
    # TensorRT-LLM does not call the hooks while idle: requests of the last busy iteration are
    # released when work arrives again
    ex.add_request(prompts[1], 6)
    while ex.step():
        pass
    rids = {ex.done[c].rid for c in cids}
    assert rids <= set(released) and rids <= set(ended)


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


def test_sampled_verification_keeps_the_targets_distribution(fake_trtllm, checkpoint, prompts):
    """1.2 verifies a sampled request's drafts (no draft logits) by sampling the target at every
    position and accepting drafts while they equal the samples. Drafting the target's likeliest
    second token after its likeliest first, that must leave the joint law of the first two tokens
    the target's own: a chi-square test of 480 samples (top_k 3, temperature 1) against
    p(t1) p(t2 | t1) computed from the engine, with most second tokens coming through drafts."""
    import math

    import torch

    from backend.drafters.base import Drafter
    from backend.engines.torch_llama import TorchLlama
    from policy.speculator import Draft

    prompt = prompts[1]
    eng = TorchLlama(checkpoint, dtype="fp32", max_slots=16, max_context=64)

    def top(tokens, k=3):
        logits = eng.forward([0], [0], [tokens], logit_rows=[[len(tokens) - 1]])[0]
        v, i = logits.topk(k)
        return dict(zip(i.tolist(), torch.softmax(v, -1).tolist()))

    p1 = top(prompt)
    p2 = {t1: top(prompt + [t1]) for t1 in p1}
    likeliest = {t1: max(row, key=row.get) for t1, row in p2.items()}

    class Likeliest(Drafter):
        name = "likeliest"

        def propose(self, seq_id, tokens, gamma):
            nxt = likeliest.get(tokens[-1]) if len(tokens) == len(prompt) + 1 else None
            drafts = [nxt] if nxt is not None and gamma > 0 else []
            return Draft(tokens=drafts, confidences=[1.0] * len(drafts))

    drafter = adaptive(make_policy("static", drafter="likeliest", gamma=1), {"likeliest": Likeliest()})
    ex = executor(eng, drafter)
    n = 480
    outs = ex.generate([prompt] * n, 3, temperature=1.0, top_k=3)  # 3: room for one draft after the first token
    assert ex.accepted > n / 4, "the drafts were hardly ever accepted: the test would not test verification"
    counts = {}
    for t in outs:
        counts[tuple(t[:2])] = counts.get(tuple(t[:2]), 0) + 1
    expected = {(a, b): n * p1[a] * p2[a][b] for a in p1 for b in p2[a]}
    assert set(counts) <= set(expected)
    cells = [(counts.get(k, 0), e) for k, e in expected.items() if e >= 5]
    rest = (n - sum(o for o, _ in cells), n - sum(e for _, e in cells))
    if rest[1] >= 5:
        cells.append(rest)
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    # the 99.9th percentile of chi-square(df), Wilson-Hilferty
    z = 3.09
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < crit, (chi2, crit, counts, expected)


def test_the_composite_verifies_nothing_extra_under_load_and_the_pad_length_alone(fake_trtllm, trt_engine, prompts,
                                                                                  plain):
    """The default policy on a padded cost where verification is free for one sequence and dear
    for a batch (each padded position costs a step's worth per extra sequence): iterations with
    three active requests run without speculation (no extra position verified), those with one
    speculate at the static length; greedy output stays plain."""
    import random

    from policy.profiles import StepTimeProfile
    batch, tokens = (1, 2, 3), tuple(range(1, MAX_DRAFT + 2))
    table = (tuple(tuple(0.01 * (1 + (b - 1) * (t - 1)) for t in tokens) for b in batch),)
    zeros = (0.0,) * 3
    profile = StepTimeProfile((4096,), batch, (zeros,), (zeros,), zeros, zeros, shape_batch=batch,
                              shape_tokens=tokens, shape_target_s=table, verify="padded", pad_to=MAX_DRAFT)
    policy = make_policy("composite", profile=profile, drafters=["ngram", "suffix"], rng=random.Random(0),
                         prior_alpha=0.6)
    drafter = adaptive(policy)
    ex = executor(trt_engine, drafter)
    assert ex.generate(prompts, [MAX_NEW, 3, 5]) == [plain[0], plain[1][:3], plain[2][:5]]
    busy = [it for it in ex.iterations if it.batch_size == 3]
    alone = [it for it in ex.iterations if it.batch_size == 1 and it.verified]
    assert busy and alone
    assert all(not it.spec_on and not any(it.verified) for it in busy), "padded positions verified under load"
    assert any(it.spec_on for it in alone), "the composite never speculated alone, where verification is free"
    assert all(v == MAX_DRAFT for it in alone if it.spec_on for v in it.verified)
