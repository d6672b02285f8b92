"""KV reuse across requests: the ledger of retained cells (no engine), the engine's retain and
restore (cells bit for bit a prefill's), and the loop's reuse, lossless: greedy text with reuse
equals text without it, for repeated prompts and a chat's next turns, alone, batched, and under a
budget tight enough to give retained cells up and preempt."""
import pytest
import torch

from backend.engines.llama_cpp import LlamaCpp, served_gguf
from backend.loop.kv_blocks import BlockPool
from backend.loop.retained import RetainedPrompts
from loop_helpers import greedy, make_loop, run_all
from test_lossless import PROMPTS

MAX_TOKENS = 16
# What a chat client resends each turn (a system prompt, a document): enough shared tokens to reuse.
PREAMBLE = ("You are a careful assistant. Answer briefly and plainly, in the style of a reference book, "
            "and never repeat the question. ")


# -- the ledger --------------------------------------------------------------------------
def store(r, tokens):
    """What the loop does when a sequence leaves: claim a stream, (copy the cells,) count its blocks."""
    stream = r.keep(tokens)
    return stream >= 0 and r.count(stream)


def test_match_finds_the_longest_shared_prefix_above_the_minimum():
    r = RetainedPrompts(3, BlockPool(64, 4), min_tokens=4)
    assert store(r, list(range(10)))
    assert store(r, [0, 1, 2, 3, 4, 99])
    assert r.match(list(range(20)), limit=19) == (0, 10)
    assert r.match(list(range(20)), limit=7) == (0, 7)  # never past the limit (a token left to prefill)
    assert r.match([0, 1, 2, 3, 4, 99, 7], limit=6) == (1, 6)
    assert r.match([0, 1, 2, 9], limit=3) == (-1, 0)  # 3 shared tokens: below the minimum


def test_blocks_are_counted_and_the_least_recently_used_goes_first():
    pool = BlockPool(8, 4)
    r = RetainedPrompts(2, pool, min_tokens=1)
    a, b, c = [1] * 8, [2] * 8, [3] * 8
    assert store(r, a) and store(r, b)
    assert pool.num_free == 4 and r.tokens_kept == 16
    r.hit(r.match(a, 8)[0])  # a was used last: b goes first
    assert store(r, c) and r.match(b, 8) == (-1, 0) and r.match(a, 8)[1] == 8
    assert r.evict_one() and r.evict_one() and not r.evict_one()
    assert pool.num_free == pool.num_blocks


def test_a_longer_sequence_replaces_the_entry_it_extends_and_a_held_one_is_not_kept_twice():
    r = RetainedPrompts(2, BlockPool(16, 4), min_tokens=1)
    store(r, [1, 2, 3])
    assert r.keep([1, 2, 3, 4, 5]) == 0 and r.count(0)  # the next turn of the same conversation
    assert r.keep([1, 2, 3]) == -1  # already held (a prefix of what stream 0 keeps)
    assert r.tokens_kept == 5 and r.pool.num_free == 16 - 2


def test_sequences_leaving_in_one_step_get_streams_of_their_own():
    r = RetainedPrompts(3, BlockPool(16, 4), min_tokens=1)
    streams = [r.keep([i] * 4) for i in range(3)]  # claimed before any is counted
    assert sorted(streams) == [0, 1, 2] and all(r.count(s) for s in streams)
    assert r.pool.num_free == 16 - 3


def test_a_sequence_outgrowing_another_that_left_in_the_same_step_takes_its_stream_counted_once():
    """Two sequences of one conversation finish in the same step: the later claim replaces the
    earlier (not counted yet) on the same stream. The loop counts each stream once (dict.fromkeys
    in KVReuse.count); a stream given up since counts nothing."""
    r = RetainedPrompts(2, BlockPool(16, 4), min_tokens=1)
    a, b = r.keep([1, 2, 3]), r.keep([1, 2, 3, 4, 5])
    assert a == b == 0 and r.count(0) and r.pool.num_free == 16 - 2 and r.tokens_kept == 5
    c = r.keep([7, 8])
    r.forget(c)
    assert not r.count(c) and r.pool.num_free == 16 - 2


def test_storing_gives_up_others_when_the_pool_is_short_and_refuses_what_never_fits():
    pool = BlockPool(4, 4)
    r = RetainedPrompts(2, pool, min_tokens=1)
    store(r, [1] * 12)
    assert store(r, [2] * 8)  # the first one goes
    assert r.tokens_kept == 8
    assert not store(r, [3] * 20)
    assert pool.num_free == pool.num_blocks and r.tokens_kept == 0


# -- the engine --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=8, max_context=512, retain_streams=3)
    yield eng
    eng.close()
    torch.set_num_threads(threads)


def test_restored_cells_give_the_logits_a_prefill_gives(engine):
    tokens = list(range(300, 380))
    engine.forward([0], [0], [tokens[:60]], logit_rows=[[]])
    engine.forward([0], [60], [tokens[60:64]])  # cells from a step, as a sequence's are
    engine.retain(0, 2, 64)
    engine.truncate(0, 0)
    engine.restore(2, 5, 50)
    assert engine.cached_length(5) == 50
    restored = engine.forward([5], [50], [tokens[50:80]])
    prefilled = engine.forward([1], [0], [tokens[:80]], logit_rows=[list(range(50, 80))])
    assert torch.equal(restored, prefilled)
    engine.restore(2, 6, 64)  # the stream keeps its cells after a restore
    assert engine.cached_length(6) == 64
    for slot in (1, 5, 6):
        engine.truncate(slot, 0)
    with pytest.raises(ValueError):
        engine.retain(0, 3, 1)  # no such stream
    with pytest.raises(ValueError):
        engine.restore(2, 1, 65)  # more than it holds


# -- the loop, lossless ---------------------------------------------------------------------
def conversation(first_texts):
    """Second turns: each first prompt, its answer and a follow-up (the whole history resent, as a
    chat client does), and the first prompts again."""
    return [p + a + "\nAnd then?" for p, a in first_texts] + [p for p, _ in first_texts]


def texts(loop, prompts):
    return [s.chunks[-1].text for s in run_all(loop, [greedy(p, MAX_TOKENS) for p in prompts])]


@pytest.mark.parametrize("batch,budget_tokens", [(1, None), (8, None), (8, 640)],
                         ids=["alone", "batch8", "tight-budget"])
def test_reuse_across_requests_is_lossless(engine, tokenizer, batch, budget_tokens):
    first = [PREAMBLE + p for p in PROMPTS[:4]]
    plain = make_loop(engine, tokenizer, "off", max_batch=1, reuse_kv=False)
    want_first = texts(plain, first)
    second = conversation(list(zip(first, want_first)))
    want_second = texts(plain, second)
    assert plain.stats.kv_reuse_lookups == 0

    budget = budget_tokens * engine.kv_bytes_per_token if budget_tokens else None
    loop = make_loop(engine, tokenizer, "static", max_batch=batch, drafter="ngram", gamma=3, kv_budget_bytes=budget)
    assert texts(loop, first) == want_first
    got = texts(loop, second)
    differ = [p[:40] for p, a, b in zip(second, want_second, got) if a != b]
    assert not differ, f"with KV reuse, {len(differ)} of {len(second)} outputs differ: {differ[:3]}"
    st = loop.stats
    assert st.kv_reuse_lookups == len(first) + len(second)
    assert st.kv_reuse_hits > 0 and st.prefix_tokens_reused > 0
    if not budget_tokens:  # each first turn's next turn finds it (or its repeat finds the next turn)
        assert st.kv_reuse_hits >= engine.retain_streams
    assert loop.pool.num_free == loop.pool.num_blocks - sum(
        loop.pool.blocks_for(len(e.tokens)) for e in loop.reuse.retained.entries if e is not None)


def test_reused_blocks_are_reported_as_tensorrt_llm_reports_them(engine, tokenizer):
    """return_perf_metrics' kv_cache_reused_blocks: the whole blocks a prompt took from retained
    cells (none the first time, most of it when resent); new + reused = total; the loop counts the
    same blocks for the metrics' nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused"}."""
    loop = make_loop(engine, tokenizer, "off", max_batch=1)
    prompt = PREAMBLE + PROMPTS[0]
    first, again = run_all(loop, [greedy(prompt, MAX_TOKENS, return_perf_metrics=True)] * 2)
    a, b = first.chunks[-1].perf, again.chunks[-1].perf
    bs = loop.pool.block_size
    n_prompt = len(tokenizer(prompt).input_ids)
    assert a["kv_cache_reused_blocks"] == 0 and b["kv_cache_reused_blocks"] == (n_prompt - 1) // bs > 0
    for p in (a, b):
        assert p["kv_cache_alloc_new_blocks"] + p["kv_cache_reused_blocks"] == p["kv_cache_alloc_total_blocks"]
        assert p["kv_cache_alloc_total_blocks"] == -(-(n_prompt + MAX_TOKENS) // bs)
    assert loop.stats.kv_blocks_reused == b["kv_cache_reused_blocks"]
