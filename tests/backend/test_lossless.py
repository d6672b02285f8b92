"""Speculation never changes what the target produces: greedy output with any
drafter and length equals plain greedy decoding token for token (fp32)."""
from pathlib import Path

import pytest

from backend.engines.torch_llama import TorchLlama
from policy import POLICIES
from policy.config import policy_from_config
from loop_helpers import greedy, make_loop, run_all

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


CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "policies"


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_losslessly_in_the_engine_loop(engine, tokenizer, plain, name):
    """Each registered policy, built from its example config, drives the real loop;
    whatever arms it picks, the output is plain greedy's."""
    loop = make_loop(engine, tokenizer, "off", max_batch=4)
    loop.policy = policy_from_config(str(CONFIGS / f"{name}.yaml"))
    spec = [s.chunks[-1] for s in run_all(loop, [greedy(p, 40) for p in PROMPTS[:4]])]
    for prompt, a, b in zip(PROMPTS, plain, spec):
        assert b.text == a.text, f"{name}: output differs for {prompt[:40]!r}"
    if name != "off":
        assert loop.stats.drafted > 0, f"{name} never speculated on copy-heavy prompts"
