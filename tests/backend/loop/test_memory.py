"""One budget for KV blocks and drafter weights; preemption under a budget too small for the load."""
from dataclasses import dataclass

import pytest

from backend.engines.torch_llama import TorchLlama
from backend.loop.kv_blocks import OutOfBlocks
from backend.loop.memory import KVMemory
from loop_helpers import greedy, make_loop, run_all


@dataclass
class FakeDrafter:  # only the numbers KVMemory reads
    weight_bytes: int
    kv_bytes_per_token: int
    resident: bool = True


def test_budget_is_shared_and_parking_gives_the_drafter_back_to_the_pool():
    d = FakeDrafter(weight_bytes=64_000, kv_bytes_per_token=10)
    mem = KVMemory(budget_bytes=224_000, target_kv_bytes_per_token=90, model_drafters={"code": d}, block_size=16)
    # (224000 - 64000) // (16 * (90 + 10)) = 100 blocks with the drafter; 224000 // (16 * 90) = 155 without.
    assert mem.pool.num_blocks == 100
    assert mem.drafter_blocks("code") == 55
    mem.parked("code")
    assert mem.pool.num_blocks == 155
    assert mem.drafter_blocks("code") == 55
    mem.pool.allocate(1, 16 * 120)  # the extra room is usable
    with pytest.raises(OutOfBlocks):
        mem.reserve_for_reload("code")  # 35 free < 55 needed: the reload waits
    assert mem.pool.num_blocks == 155 and "code" not in mem.resident
    mem.pool.truncate(1, 16 * 50)
    moves = mem.reserve_for_reload("code")
    assert mem.pool.num_blocks == 100 and "code" in mem.resident
    assert all(new < 100 <= old for old, new in moves)
    assert all(b < 100 for b in mem.pool.block_table(1))


def test_a_budget_without_room_for_the_cache_is_refused():
    with pytest.raises(ValueError, match="no room"):
        KVMemory(1000, 90, {"code": FakeDrafter(2000, 10)})


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=6, max_context=256)


PROMPTS = ["Write a short story about a lighthouse keeper.", "List ten fruits and their colours:",
           "Explain recursion to a child.", "a b c a b c a b c a b", "Describe the water cycle.",
           "The quick brown fox jumps over the lazy dog. The quick brown fox"]


def test_all_requests_complete_unchanged_under_a_tight_kv_budget(engine, tokenizer):
    """Six requests, a budget for ~3 sequences: admission waits, growth preempts the youngest,
    preempted ones are recomputed, and every output equals the unconstrained run's."""
    reqs = [greedy(p, 48) for p in PROMPTS]
    free = run_all(make_loop(engine, tokenizer, "static", drafter="ngram", gamma=4), reqs)
    budget = 3 * 64 * engine.kv_bytes_per_token  # 12 blocks of 16 tokens
    tight = make_loop(engine, tokenizer, "static", drafter="ngram", gamma=4, kv_budget_bytes=budget)
    out = run_all(tight, reqs)
    assert tight.stats.preemptions > 0
    assert max(o.batch_size for o in tight.trace) < len(PROMPTS)
    for a, b in zip(free, out):
        assert not b.errors
        assert b.text == a.text
    assert tight.pool.num_free == tight.pool.num_blocks  # everything given back


def test_a_request_that_can_never_fit_gets_a_clear_error(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "off", kv_budget_bytes=2 * 16 * engine.kv_bytes_per_token)
    sinks = run_all(loop, [greedy("word " * 60, 8), greedy("Hi", 4)])
    assert "memory budget" in sinks[0].errors[0]
    assert not sinks[1].errors and sinks[1].chunks[-1].finish_reason == "length"
