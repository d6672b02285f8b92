"""KV reuse in the loop (backend/loop/kv_reuse.py) with a stand-in engine that records its copies:
a prompt starts from the longest prefix retained cells share with it, else from the chat
template's shared first tokens, always leaving one prompt token to prefill; a failed copy falls
back to prefilling; finished sequences leave their cells once, counted in the pool; memory
pressure gives up the least recently used cells, those an admitted prompt would reuse last.
The same with the real engine, lossless: tests/backend/loop/test_retained.py."""
import pytest

from backend.generation.request import GenerationRequest
from backend.generation.sequence import Sequence
from backend.loop.kv_blocks import BlockPool
from backend.loop.kv_reuse import KVReuse
from backend.loop.stats import LoopStats

PREFIX = list(range(1000, 1020))  # the chat template's shared first tokens (20)


class Engine:
    """Records the loop's copies; a name in `fail` makes that copy raise."""
    supports_prefix = True

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def _call(self, name, *args):
        self.calls.append((name, *args))
        if name in self.fail:
            raise RuntimeError(f"{name} failed")

    def set_prefix(self, ids):
        self._call("set_prefix", list(ids))

    def load_prefix(self, slot):
        self._call("load_prefix", slot)
        return len(PREFIX)

    def restore(self, stream, slot, n):
        self._call("restore", stream, slot, n)

    def retain(self, slot, stream, n):
        self._call("retain", slot, stream, n)

    def truncate(self, slot, n):
        self._call("truncate", slot, n)


class ChatTokenizer:
    """A chat template of PREFIX, then the user's text one token per character."""
    chat_template = "stand-in"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return PREFIX + [ord(c) for c in messages[0]["content"]] + [7]


def seq(seq_id, tokens, slot=0, kv_len=0, generated=0):
    prompt = tokens[: len(tokens) - generated]
    return Sequence(seq_id=seq_id, request=GenerationRequest("x", max_new_tokens=16), sink=None, prompt_ids=list(prompt),
                    tokens=list(tokens), detok=None, eos_ids=frozenset(), slot=slot, kv_len=kv_len)


def reuse(engine=None, streams=2, prefix=False, blocks=64):
    pool = BlockPool(blocks, 16)
    return KVReuse(engine or Engine(), ChatTokenizer(), pool, LoopStats(), streams=streams, reuse_prefix=prefix,
                   max_context=512)


def finish(r, s):
    """What the loop does when s finishes: retain its cells, give its blocks back, count the stream."""
    stream = r.retain(s)
    r.count([stream])
    return stream


def held(r):
    return [s for s, e in enumerate(r.retained.entries) if e is not None]


def test_a_prompt_starts_from_the_longest_retained_prefix_one_token_left_to_prefill():
    r = reuse()
    a = list(range(40))
    assert finish(r, seq(1, a, slot=3, kv_len=40)) == 0
    assert r.engine.calls == [("retain", 3, 0, 40)] and r.pool.num_free == 64 - 3
    b = seq(2, a[:30] + [99, 98], slot=1)
    r.restore(b)
    assert b.kv_len == 30 and ("restore", 0, 1, 30) in r.engine.calls
    same = seq(3, a, slot=2)
    r.restore(same)
    assert same.kv_len == 39  # the last prompt token is prefilled: its logits give the first token
    st = r.stats
    assert (st.kv_reuse_lookups, st.kv_reuse_hits, st.prefix_tokens_reused) == (2, 2, 69)
    assert (b.reused_tokens, st.kv_blocks_reused) == (30, 30 // 16 + 39 // 16)


def test_a_resumed_sequence_counts_its_cells_but_not_as_the_requests_reused_blocks():
    r = reuse(prefix=True)
    resumed = seq(1, PREFIX + [5, 6, 7, 8], slot=0, generated=2)  # preempted after two tokens
    r.restore(resumed)
    assert resumed.kv_len == len(PREFIX) and r.stats.prefix_tokens_reused == len(PREFIX)
    assert resumed.reused_tokens == 0 and r.stats.kv_blocks_reused == 0
    assert r.stats.kv_reuse_lookups == 0  # retained cells are for new prompts only


def test_the_chat_prefix_serves_when_no_retained_cells_are_longer():
    r = reuse(prefix=True)
    assert r.prefix_ids == PREFIX and r.engine.calls == [("set_prefix", PREFIX)]
    finish(r, seq(1, PREFIX + [1, 2], slot=0, kv_len=22))  # shares only 22 tokens
    s = seq(2, PREFIX + [1, 2, 3, 4, 5], slot=4)
    r.restore(s)
    assert s.kv_len == 22 and r.engine.calls[-1] == ("restore", 0, 4, 22)
    t = seq(3, PREFIX + [9, 9, 9], slot=5)
    r.restore(t)
    assert t.kv_len == len(PREFIX) and r.engine.calls[-1] == ("load_prefix", 5)
    other = seq(4, [1, 2, 3] * 10, slot=6)
    r.restore(other)
    assert other.kv_len == 0 and r.engine.calls[-1] == ("load_prefix", 5)  # nothing to copy


def test_a_failed_restore_prefills_the_prompt_whole():
    r = reuse(Engine(fail={"restore"}))
    finish(r, seq(1, list(range(40)), slot=0, kv_len=40))
    s = seq(2, list(range(40)), slot=2)
    r.restore(s)
    assert s.kv_len == 0 and r.engine.calls[-1] == ("truncate", 2, 0) and r.stats.kv_reuse_hits == 0


def test_a_failed_prefix_copy_turns_prefix_reuse_off():
    r = reuse(Engine(fail={"load_prefix"}), streams=0, prefix=True)
    s = seq(1, PREFIX + [1, 2, 3], slot=0)
    r.restore(s)
    assert s.kv_len == 0 and r.prefix_ids == []
    r.restore(seq(2, PREFIX + [4, 5], slot=1))
    assert [c[0] for c in r.engine.calls].count("load_prefix") == 1


def test_what_is_not_retained():
    r = reuse(Engine(fail={"retain"}))
    assert r.retain(seq(1, list(range(40)), slot=0, kv_len=40)) == -1  # the copy failed
    assert r.retained.tokens_kept == 0
    r.engine.fail.clear()
    assert r.retain(seq(2, list(range(10)), slot=0, kv_len=10)) == -1  # fewer than 16 cells
    assert r.retain(seq(3, list(range(40)), slot=-1, kv_len=40)) == -1  # no slot (never admitted)
    assert finish(r, seq(4, list(range(40)), slot=0, kv_len=40)) == 0
    assert r.retain(seq(5, list(range(30)), slot=1, kv_len=30)) == -1  # stream 0 holds them already
    assert reuse(streams=0).retain(seq(6, list(range(40)), slot=0, kv_len=40)) == -1  # reuse off
    only_committed = seq(7, [50 + i for i in range(20)], slot=2, kv_len=23)  # a stop left draft cells behind
    assert r.retain(only_committed) == 1 and r.engine.calls[-1] == ("retain", 2, 1, 20)


def test_two_sequences_of_one_conversation_finishing_in_one_step_are_counted_once():
    r = reuse()
    a, b = seq(1, list(range(20)), slot=0, kv_len=20), seq(2, list(range(40)), slot=1, kv_len=40)
    streams = [r.retain(a), r.retain(b)]
    assert streams == [0, 0]
    r.count(streams)
    assert r.pool.num_free == 64 - 3 and r.retained.tokens_kept == 40


def test_reclaim_gives_up_the_least_recently_used_cells_and_the_admitted_prompts_last():
    r = reuse(streams=3, blocks=8)
    for i in range(3):  # streams 0, 1, 2, oldest first: 2 blocks each
        finish(r, seq(i, list(range(100 * i, 100 * i + 32)), slot=0, kv_len=32))
    assert r.pool.num_free == 2
    mine = seq(9, list(range(32)) + [7], slot=1)  # would reuse stream 0, the oldest
    assert r.reclaim(mine) and held(r) == [0, 2]
    assert r.reclaim(mine) and held(r) == [0]
    assert r.reclaim(mine) and held(r) == [] and not r.reclaim(mine)
    assert r.pool.num_free == 8
    finish(r, seq(4, list(range(32)), slot=0, kv_len=32))
    assert r.reclaim(None) and not r.reclaim(None)  # a step's need: whatever is kept


@pytest.mark.parametrize("flag", [False, True])
def test_without_streams_only_the_prefix_is_reused(flag):
    r = reuse(streams=0, prefix=flag)
    s = seq(1, PREFIX + [1, 2, 3], slot=0)
    r.restore(s)
    assert r.retained is None and s.kv_len == (len(PREFIX) if flag else 0)
    r.count([r.retain(seq(2, list(range(40)), slot=0, kv_len=40))])
    assert r.pool.num_free == 64
