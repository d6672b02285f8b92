"""Lossless on the served engine: with the llama.cpp engine (the served GGUF, Q8_0 KV
cache), speculative greedy output equals the same engine's plain greedy output token for
token on 52 varied prompts, under every registered policy, alone and in a continuous batch
of 8, and under a KV budget tight enough to preempt. Plain decoding in a batch of 8 equals
plain decoding alone too: the engine's logits do not depend on the batch (the contract
suite checks that at the level of single forwards, tolerance 0)."""

import pytest
import torch

from backend.drafters import make_drafter
from backend.drafters.feature import load_model_drafter
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from loop_helpers import greedy, make_loop, run_all, served_policy
from policy import POLICIES
from test_lossless import PROMPTS as BASE_PROMPTS

TOPICS = ["volcanoes", "the printing press", "honey bees", "black holes", "the Roman empire", "photosynthesis",
          "jazz", "chess openings", "glaciers", "vaccines"]
TEMPLATES = ["Explain {t} to a child in three sentences.", "Write a numbered list of five facts about {t}.",
             "Repeat exactly, twice: 'I have read about {t} today.'"]
PROMPTS = BASE_PROMPTS + [t.format(t=topic) for topic in TOPICS for t in TEMPLATES]
MAX_TOKENS = 24
# Policies that plan with this engine's measured cost curve (verifying 2 tokens costs ~1.8
# decode steps on 2 cores) and may price speculation out entirely, depending on the machine's
# profile: AdaSpec and SmartSpec never draft here, composite sometimes probes. The others
# must draft on the copy-heavy prompts (else the comparison proves little).
PRICED_OUT = ("adaspec", "smartspec", "composite")


@pytest.fixture(scope="module")
def engine(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs torch beside llama.cpp (backend/services/build.py)
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=8, max_context=512)
    yield eng
    eng.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def drafters(engine, built_drafter):
    """The server's drafter set: model-free ones and the distilled model drafters (torch)."""
    out = {n: make_drafter(n) for n in ("ngram", "suffix")}
    for name in ("code", "chat"):
        out[name] = load_model_drafter(name, built_drafter(name), dtype="bf16", max_slots=engine.max_slots,
                                       max_context=engine.max_context)
    return out


def texts(loop, prompts=PROMPTS):
    return [s.chunks[-1].text for s in run_all(loop, [greedy(p, MAX_TOKENS) for p in prompts])]


@pytest.fixture(scope="module")
def plain(engine, tokenizer):
    return texts(make_loop(engine, tokenizer, "off", max_batch=1))


def assert_same(want, got, what):
    differ = [p[:40] for p, a, b in zip(PROMPTS, want, got) if a != b]
    assert not differ, f"{what}: {len(differ)} of {len(want)} outputs differ, e.g. {differ[:3]}"


def test_enough_varied_prompts():
    assert len(set(PROMPTS)) >= 50


def test_plain_decoding_in_a_batch_of_8_equals_alone(engine, tokenizer, plain):
    loop = make_loop(engine, tokenizer, "off", max_batch=8)
    assert_same(plain, texts(loop), "plain, batch of 8")
    assert max(o.batch_size for o in loop.trace) == 8


@pytest.mark.parametrize("batch", [1, 8], ids=["alone", "batch8"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_is_lossless_on_llama_cpp(engine, tokenizer, plain, drafters, name, batch):
    loop = make_loop(engine, tokenizer, "off", max_batch=batch, drafters=drafters)
    loop.policy = served_policy(name, engine="llama.cpp")
    assert_same(plain, texts(loop), f"{name}, max_batch {batch}")
    if name not in ("off",) + PRICED_OUT:
        assert loop.stats.drafted > 0, f"{name} never speculated"


@pytest.mark.parametrize("chunk", [128, 16], ids=["served-chunk", "chunk16"])
def test_lossless_under_preemption(engine, tokenizer, chunk):
    """16 requests of 64 new tokens in 8 slots under a KV budget that holds the longest one and
    little more: sequences are preempted (their cells removed) and recomputed later, and still
    produce the text plain decoding gives them alone with an unconstrained budget. With 16-token
    prefill chunks, sequences are also preempted halfway through their prefill."""
    prompts, n = PROMPTS[:16], 64
    want = [s.chunks[-1].text for s in run_all(make_loop(engine, tokenizer, "off", max_batch=1),
                                               [greedy(p, n) for p in prompts])]
    longest = max(len(tokenizer(p).input_ids) for p in prompts) + n
    budget = (longest + 3 * 16) * engine.kv_bytes_per_token
    loop = make_loop(engine, tokenizer, "static", max_batch=8, kv_budget_bytes=budget, drafter="ngram", gamma=3,
                     prefill_chunk=chunk)
    got = [s.chunks[-1].text for s in run_all(loop, [greedy(p, n) for p in prompts])]
    differ = [p[:40] for p, a, b in zip(prompts, want, got) if a != b]
    assert not differ, f"under a tight KV budget {len(differ)} of {len(prompts)} outputs differ: {differ[:3]}"
    assert loop.stats.preemptions > 0, "the budget never forced a preemption: the test proves little"


def test_chunked_prefill_is_lossless(engine, tokenizer):
    """Long prompts prefilled in 64-token chunks, between the decode and verification steps of a
    batch of 8 (n-gram speculation), give the text they give prefilled whole, alone."""
    longs = [" ".join(PROMPTS[i: i + 12]) for i in range(0, 48, 12)]
    lengths = [len(tokenizer(p).input_ids) for p in longs]
    assert min(lengths) > 128 and max(lengths) + MAX_TOKENS < engine.max_context, lengths
    prompts = PROMPTS[:4] + longs + PROMPTS[4:8]
    want = texts(make_loop(engine, tokenizer, "off", max_batch=1, prefill_chunk=0), prompts)
    loop = make_loop(engine, tokenizer, "static", max_batch=8, prefill_chunk=64, drafter="ngram", gamma=3)
    got = texts(loop, prompts)
    differ = [p[:40] for p, a, b in zip(prompts, want, got) if a != b]
    assert not differ, f"with chunked prefill {len(differ)} of {len(prompts)} outputs differ: {differ[:3]}"
    assert loop.stats.drafted > 0


def test_prefix_reuse_is_lossless(checkpoint, tokenizer):
    """Chat-template prompts whose shared start (the template's system turn) is copied from the
    engine's prefix stream give the text they give prefilled whole, alone and in a batch of 8."""
    engine = LlamaCpp(served_gguf(checkpoint), max_slots=8, max_context=512, prefix_stream=True)
    try:
        reqs = [greedy(p, MAX_TOKENS, apply_chat_template=True) for p in PROMPTS[:16]]
        # The prefix is computed by the first load_prefix, on the loop's thread, not at start-up
        # (a llama_decode from a second thread slows every later step: llama_cpp.py set_prefix).
        engine.set_prefix([1, 2, 3])
        assert engine.cached_length(engine.max_slots) == 0
        plain = make_loop(engine, tokenizer, "off", max_batch=1, reuse_prefix=False)
        want = [s.chunks[-1].text for s in run_all(plain, reqs)]
        assert plain.stats.prefix_tokens_reused == 0
        for batch in (1, 8):
            loop = make_loop(engine, tokenizer, "static", max_batch=batch, drafter="ngram", gamma=3,
                             reuse_prefix=True)
            got = [s.chunks[-1].text for s in run_all(loop, [greedy(p, MAX_TOKENS, apply_chat_template=True)
                                                             for p in PROMPTS[:16]])]
            assert loop.reuse.prefix_ids and loop.stats.prefix_tokens_reused == 16 * len(loop.reuse.prefix_ids)
            differ = [p[:40] for p, a, b in zip(PROMPTS, want, got) if a != b]
            assert not differ, f"with prefix reuse, batch {batch}: {len(differ)} of 16 outputs differ: {differ[:3]}"
    finally:
        engine.close()
