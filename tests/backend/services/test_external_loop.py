"""An engine that owns its loop can drive the speculation component (issue: TensorRT-LLM's
PyTorch backend calls a drafter hook once per iteration with nothing but token lists and
KV statistics). A fake such engine — its own scheduler and greedy verification on the
torch engine — produces exactly plain greedy output under every policy."""
import pytest

from backend.drafters import make_drafter
from backend.engines.torch_llama import TorchLlama
from own_loop import OwnLoopEngine
from policy import POLICIES, make_policy
from policy.external import IterationDrafter
from policy.simulator import DEFAULT_PARAMS
from policy.speculator import Speculator

PROMPTS = [
    "Repeat exactly: the river runs, the river runs, the river runs.",
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "Once upon a time, in a small village by the sea,",
]
MAX_NEW = 24


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=3, max_context=256)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(p).input_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def plain(engine, prompts):
    return OwnLoopEngine(engine).generate(prompts, MAX_NEW)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_external_loop_equals_plain_greedy(engine, prompts, plain, name):
    params = dict(DEFAULT_PARAMS.get(name, {}))
    for key in ("drafter",):
        if key in params:
            params[key] = "ngram"
    if "drafters" in params:
        params["drafters"] = ["ngram", "suffix"]
    spec = Speculator(make_policy(name, **params), {n: make_drafter(n) for n in ("ngram", "suffix")},
                     lookahead=True)
    own = OwnLoopEngine(engine, IterationDrafter(spec, max_draft_len=6))
    out = own.generate(prompts, MAX_NEW)
    assert out == plain
    if name not in ("off",):
        assert own.drafted > 0, f"{name} never speculated through the hook"


def test_the_hook_reports_what_the_engine_accepted(engine, prompts):
    outcomes = []
    spec = Speculator(make_policy("static", drafter="ngram", gamma=4), {"ngram": make_drafter("ngram")},
                      on_outcome=outcomes.append)
    own = OwnLoopEngine(engine, IterationDrafter(spec, max_draft_len=4))
    own.generate(prompts, MAX_NEW)
    assert own.accepted > 0
    assert sum(o.accepted for o in outcomes) == own.accepted
    assert sum(o.drafted for o in outcomes) == own.drafted
