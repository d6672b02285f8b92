"""Speculation never changes what the target produces: greedy output with any
drafter and length equals plain greedy decoding token for token (fp32)."""
import pytest

from backend.engines.torch_llama import TorchLlama
from backend.drafters import make_drafter
from backend.drafters.feature import load_model_drafter
from policy import POLICIES, Arm, Decision, MemoryAction, Policy
from policy.base import resident_names
from loop_helpers import greedy, make_loop, run_all, served_policy

# -- model drafters (distilled by build_engines/distill_drafter.py; the fixture builds them once) -------

@pytest.fixture(scope="module")
def model_drafter(built_drafter):
    def load(name, engine):
        return load_model_drafter(name, built_drafter(name), dtype="fp32", max_slots=engine.max_slots,
                                  max_context=engine.max_context, target=engine)
    return load


ARTICLE = ("The Amazon rainforest covers much of the Amazon basin of South America. This basin encompasses "
           "seven million square kilometres, of which five and a half million are covered by the rainforest. "
           "The region includes territory belonging to nine nations and 3,344 indigenous territories.")
CODE = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
PROMPTS = [
    f"Summarise this text in one sentence.\n\n{ARTICLE}",
    f"Repeat the following text exactly.\n\n{ARTICLE}",
    f"Rewrite this function with a loop instead of recursion:\n\n{CODE}",
    f"Add type hints to this code:\n{CODE}",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "List the first ten prime numbers:",
    "Translate to French: The cat sits on the mat. The cat sits on the mat.",
    "Write a haiku about autumn leaves.",
    "Explain why the sky is blue in two sentences.",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "a b c a b c a b c a b",
    "Q: What is 12 times 12?\nA:",
    "import numpy as np\n\ndef normalize(x):\n",
    "Dear team,\n\nThank you for",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "<html>\n<body>\n<ul>\n<li>one</li>\n<li>two</li>\n",
    "Recipe for pancakes:\n1.",
    "SELECT name, age FROM users WHERE",
    "The mitochondria is the powerhouse of the cell. The mitochondria",
    "In 1969, Neil Armstrong",
    "Write a short poem that repeats the line 'the river runs' three times.",
]


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=8, max_context=512)


@pytest.fixture(scope="module")
def plain(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "off", max_batch=1)
    return [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS])]


def _token_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("drafter,gamma", [("ngram", 2), ("ngram", 5), ("suffix", 4)])
def test_speculative_equals_plain_greedy_batch1(engine, tokenizer, plain, drafter, gamma):
    assert len(PROMPTS) >= 20
    loop = make_loop(engine, tokenizer, "static", max_batch=1, drafter=drafter, gamma=gamma)
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"speculative output differs for {prompt[:40]!r}"
        assert b.num_output_tokens == a.num_output_tokens
    # Speculation really happened (otherwise this test would prove nothing).
    assert sum(c.num_accepted_tokens for c in spec) > 50
    assert loop.stats.drafted > 0


def test_speculative_equals_plain_greedy_in_a_continuous_batch(engine, tokenizer, plain):
    """All prompts at once through 8 slots: joins, leaves, slot moves and ragged verify."""
    loop = make_loop(engine, tokenizer, "static", max_batch=8, drafter="ngram", gamma=4)
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"batched speculative output differs for {prompt[:40]!r}"
    assert max(o.batch_size for o in loop.trace) == 8



@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_losslessly_in_the_engine_loop(engine, tokenizer, plain, name, model_drafter):
    """Each registered policy, built from its example config, drives the real loop;
    whatever arms it picks, the output is plain greedy's."""
    drafters = {n: make_drafter(n) for n in ("ngram", "suffix")}
    drafters.update({n: model_drafter(n, engine) for n in ("code", "chat")})  # the server's default set
    loop = make_loop(engine, tokenizer, "off", max_batch=4, drafters=drafters)
    loop.policy = served_policy(name, engine="torch", dtype="fp32")
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS[:4]])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"{name}: output differs for {prompt[:40]!r}"
    if name != "off":
        assert loop.stats.drafted > 0, f"{name} never speculated on copy-heavy prompts"


@pytest.mark.parametrize("name", ["code", "chat", "chat-feature"])
def test_model_drafter_equals_plain_greedy_in_a_continuous_batch(engine, tokenizer, plain, name, model_drafter):
    drafters = {name: model_drafter(name, engine)}
    loop = make_loop(engine, tokenizer, "static", max_batch=4, drafters=drafters, drafter=name, gamma=3)
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"{name} drafter: output differs for {prompt[:40]!r}"
    assert loop.stats.accepted > 20, "the drafter never had a draft accepted: the test proves little"


class ParkThenReload(Policy):
    """Drafts with one model drafter whenever it is resident; parks it at step 4, asks it back at 8."""
    name = "park_then_reload"

    def __init__(self, drafter):
        super().__init__()
        self.drafter, self.steps = drafter, 0

    def decide(self, ctx):
        self.steps += 1
        actions = {4: (MemoryAction("offload", self.drafter),), 8: (MemoryAction("reload", self.drafter),)}
        arms = ({v.seq_id: Arm(self.drafter, 3) for v in ctx.sequences}
                if self.drafter in resident_names(ctx) else {})
        return Decision(arms=arms, memory_actions=actions.get(self.steps, ()))


@pytest.mark.parametrize("name", ["chat", "chat-feature"])
def test_lossless_across_a_drafter_park_and_reload_mid_generation(engine, tokenizer, plain, name, model_drafter):
    drafter = model_drafter(name, engine)
    loop = make_loop(engine, tokenizer, "off", max_batch=4, drafters={name: drafter})
    loop.policy = ParkThenReload(name)
    blocks_resident = loop.pool.num_blocks
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS[:8]])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"output differs across park/reload for {prompt[:40]!r}"
    assert loop.stats.drafter_parks == 1 and loop.stats.drafter_reloads == 1
    steps_with_draft = [o.step for o in loop.trace if o.drafted]
    assert min(steps_with_draft) < 3 and max(steps_with_draft) > 8  # drafted before the park and after the reload
    assert not any(3 <= o.step < 7 and o.drafted for o in loop.trace)  # never while parked
    assert loop.pool.num_blocks == blocks_resident  # the reload took its memory back
