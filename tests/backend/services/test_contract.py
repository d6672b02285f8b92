"""The service contract (backend/services/contract.py): both services, our EngineLoop and
TrtllmService (against the fake `tensorrt_llm`), are a `Service`, with every member the front
ends use and call signatures that accept what the protocol passes; the front ends (the Triton
adapter, the metrics publisher) use those members without probing for them. No model is
loaded: the loop runs on a stub engine, the TensorRT-LLM service on a stub LLM (nothing is
served here; tests/backend/loop/test_engine_loop.py and trtllm/ serve)."""
import ast
import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.drafters import make_drafter
from backend.loop.stats import LoopStats
from backend.frontend.metrics import COUNTERS, PHASES
from backend.loop.offline import make_loop
from backend.generation.request import Limits
from backend.services import Service
from policy import make_policy

ROOT = Path(__file__).resolve().parents[3]
FRONT_ENDS = [ROOT / "backend" / "frontend" / "triton_models" / f"{name}.py" for name in ("model", "drain", "sink")] + [
    ROOT / "backend" / "frontend" / "metrics.py"]
MEMBERS = {n: v for n, v in vars(Service).items() if not n.startswith("_")}


class StubEngine:
    """The engine contract's attributes (backend/engines/contract.py); it never runs a step."""
    shape = SimpleNamespace(vocab=32, eos_token_id=0)
    max_slots, max_context = 4, 64
    name, kv_bytes_per_token, kv_capacity_tokens, supports_hidden = "stub", 8, 4 * 64, False

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    truncate = move_slot = forward


class StubTokenizer:
    eos_token_id = 0

    def __len__(self):
        return 32


class StubLLM:
    def shutdown(self):
        pass


@pytest.fixture
def engine_loop():
    return make_loop(StubEngine(), StubTokenizer(), "off", max_batch=2)


@pytest.fixture
def trtllm_service(fake_trtllm):
    from backend.services.trtllm.drafter import AdaptiveDrafter
    from backend.services.trtllm.serving import TrtllmService
    from policy.external import IterationDrafter
    from policy.speculator import Speculator

    spec = Speculator(make_policy("off"), {"ngram": make_drafter("ngram")})
    drafter = AdaptiveDrafter(IterationDrafter(spec, max_draft_len=4))
    return TrtllmService(StubLLM(), drafter, StubTokenizer(), Limits(max_new_tokens_limit=16, max_context=64), frozenset({0}),
                         max_batch=2, max_queue=8)


@pytest.fixture(params=["engine_loop", "trtllm_service"])
def service(request):
    return request.getfixturevalue(request.param)


def test_the_protocol_names_what_the_front_ends_use():
    assert set(MEMBERS) == {"submit", "start", "stop", "drain", "idle", "limits", "max_batch", "queue_depth",
                            "running", "pool", "drafters", "stats", "add_outcome_listener"}


def mismatches(impl, members=MEMBERS) -> list:
    """How `impl` falls short of the protocol's members: missing ones, a method where the protocol
    has a value or the other way round, and call signatures that do not accept the protocol's calls."""
    out = []
    for name, member in members.items():
        if not hasattr(impl, name):
            out.append(f"{name}: missing")
            continue
        value = getattr(impl, name)
        if isinstance(member, property):
            if inspect.ismethod(value):
                out.append(f"{name}: a method, the protocol reads a value")
            continue
        if not inspect.ismethod(value):
            out.append(f"{name}: not a method")
            continue
        out += [f"{name}: {p}" for p in signature_gaps(inspect.signature(member), inspect.signature(value))]
    return out


def signature_gaps(proto: inspect.Signature, impl: inspect.Signature) -> list:
    """The protocol's parameters (after self) must stand in the implementation at the same
    positions with the same names and kinds, with a default where the protocol has one; any
    further parameter of the implementation must have a default."""
    wanted = list(proto.parameters.values())[1:]
    have = list(impl.parameters.values())
    gaps = []
    for i, p in enumerate(wanted):
        q = have[i] if i < len(have) else None
        if q is None or (q.name, q.kind) != (p.name, p.kind):
            gaps.append(f"parameter {i} should be {p.name} ({p.kind.description}), is {q}")
        elif p.default is not p.empty and q.default is q.empty:
            gaps.append(f"{p.name} needs a default, as the protocol's {p}")
    gaps += [f"extra parameter {q} has no default" for q in have[len(wanted):]
             if q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return gaps


def test_both_services_keep_the_contract(service):
    assert isinstance(service, Service)
    assert mismatches(service) == []
    # what the members hold, as the front ends read them
    assert isinstance(service.limits, Limits) and isinstance(service.stats, LoopStats)
    assert service.max_batch == 2 and service.queue_depth == 0 and len(service.running) == 0 and service.idle
    pool = service.pool
    assert all(isinstance(getattr(pool, n), int) for n in ("num_blocks", "num_free", "block_size"))
    assert [(n, d.resident, d.reloading) for n, d in service.drafters.items()] == [
        (n, True, False) for n in service.drafters]
    service.add_outcome_listener(lambda outcome: None)


def test_the_check_finds_what_a_service_lacks(engine_loop):
    class Partial:  # no drain; stop without its timeout; limits as a method; one extra required parameter
        def __init__(self, loop):
            self.loop = loop

        def __getattr__(self, name):  # everything else is the loop's
            if name == "drain":
                raise AttributeError(name)
            return getattr(self.loop, name)

        def stop(self):
            pass

        def limits(self):
            return self.loop.limits

        def submit(self, req, sink, priority):
            return 0

    partial = Partial(engine_loop)
    assert not isinstance(partial, Service)
    assert sorted(m.split(":")[0] for m in mismatches(partial)) == ["drain", "limits", "stop", "submit"]


def probes(source: str) -> list:
    """hasattr/getattr calls that probe the service: on an expression naming it (service, or loop
    as the adapter called it), with a default (getattr(x, name, default) asks whether x has it),
    or with a fixed name (write x.name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr") and node.args):
            continue
        target = ast.unparse(node.args[0])
        fixed = len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
        if any(w in target for w in ("service", "loop")) or (node.func.id == "getattr" and (
                len(node.args) > 2 or fixed)):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", FRONT_ENDS, ids=lambda p: p.name)
def test_the_front_ends_use_the_contract_without_probing(path):
    assert probes(path.read_text()) == []


def test_the_probe_check_finds_probing():
    code = ('if hasattr(self.loop, "drain"):\n    pass\n'
            'x = getattr(getattr(self.service, "cfg", None), "limits", None)\n'
            'y = getattr(st, "prefill_tokens")\n'
            'z = getattr(chunk, name)\n')  # a name from a table: a lookup, not a probe
    assert sorted(p.split(":")[0] for p in probes(code)) == ["line 1", "line 3", "line 3", "line 4"]


def test_what_the_metrics_read_of_stats_are_loop_stats_fields():
    fields = {f.name for f in dataclasses.fields(LoopStats)}
    assert {field for field, _ in COUNTERS.values()} - fields == set()
    assert {f"{ph}_time_s" for ph in PHASES} - fields == set()
