"""The engine loop's scheduler without an engine or torch: admission, chunked prefill's pieces,
fitting a step in memory (drafts dropped, then the youngest preempted), contiguous slots."""
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List

from backend.loop.kv_blocks import BlockPool
from backend.loop.scheduler import Scheduler
from backend.loop.stats import LoopStats


@dataclass(eq=False)
class Seq:
    """The fields of backend.generation.sequence.Sequence the scheduler reads and writes."""
    seq_id: int
    prompt_len: int
    arrival_s: float = 0.0
    generated: int = 0
    slot: int = -1
    kv_len: int = 0
    preemptions: int = 0
    scheduled_ns: int = 0
    tokens: List[int] = field(default_factory=list)

    @property
    def prefill_len(self) -> int:
        return self.prompt_len + self.generated - 1 if self.generated else self.prompt_len

    @property
    def prefilling(self) -> bool:
        return self.kv_len < self.prefill_len


class Slots:
    def __init__(self):
        self.calls = []

    def move_slot(self, src, dst, length):
        self.calls.append(("move", src, dst, length))

    def truncate(self, slot, length):
        self.calls.append(("truncate", slot, length))


def scheduler(blocks=64, block_size=16, max_batch=4, chunk=0, chunks=1):
    return Scheduler(max_batch, chunk, BlockPool(blocks, block_size), Slots(), LoopStats(), prefill_chunks=chunks)


def queued(s: Scheduler, *prompt_lens):
    seqs = [Seq(i + 1, n, arrival_s=float(i)) for i, n in enumerate(prompt_lens)]
    s.waiting.extend(seqs)
    return seqs


def test_importing_the_scheduler_imports_no_torch():
    code = "import sys, backend.loop.scheduler; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_admission_fills_slots_in_order_up_to_max_batch_with_the_prompts_blocks():
    s = scheduler(max_batch=2)
    a, b, c = queued(s, 20, 40, 10)
    assert s.admit() == []
    assert s.running == [a, b] and [a.slot, b.slot] == [0, 1] and list(s.waiting) == [c]
    assert len(s.pool.block_table(a.seq_id)) == 2 and len(s.pool.block_table(b.seq_id)) == 3
    assert a.scheduled_ns > 0


def test_admission_keeps_a_block_of_growth_per_running_sequence():
    s = scheduler(blocks=4, block_size=16)
    a, b = queued(s, 32, 16)
    s.admit()
    # a: 2 blocks (+1 growth) leaves 2; b needs 1 block + 2 growth blocks: waits
    assert s.running == [a] and list(s.waiting) == [b]


def test_a_prompt_the_whole_budget_cannot_hold_is_refused_and_the_next_admitted():
    s = scheduler(blocks=2, block_size=16)
    big, small = queued(s, 40, 8)
    refused = s.admit()
    assert [seq for seq, _ in refused] == [big] and "needs 41 tokens of KV cache" in refused[0][1]
    assert s.running == [small]


def test_prefill_pieces_end_at_chunk_multiples_oldest_first_within_the_budget():
    s = scheduler(chunk=32)
    a, b, c = queued(s, 70, 10, 20)
    s.admit()
    assert s.prefill_pieces() == [(a, 0, 32)]
    a.kv_len = 32
    assert s.prefill_pieces() == [(a, 32, 64)]
    a.kv_len = 64
    assert s.prefill_pieces() == [(a, 64, 70), (b, 0, 10)]  # 6 + 10 tokens fit in 32, then c's 20 do not
    a.kv_len, b.kv_len = 70, 10
    assert s.prefill_pieces() == [(c, 0, 20)]


def test_prefill_pieces_do_not_depend_on_other_traffic():
    """A prompt's pieces end at the same positions whoever shares the iteration."""
    alone, shared = scheduler(chunk=32), scheduler(chunk=32, chunks=4)
    (x,) = queued(alone, 100)
    _, y = queued(shared, 5, 100)
    for s, seq in ((alone, x), (shared, y)):
        s.admit()
    ends = {}
    for s, seq in ((alone, x), (shared, y)):
        cuts = []
        while any(p.prefilling for p in s.running):
            for p, start, end in s.prefill_pieces():
                p.kv_len = end
                if p is seq:
                    cuts.append(end)
        ends[id(s)] = cuts
    assert ends[id(alone)] == ends[id(shared)] == [32, 64, 96, 100]


def test_several_prompts_prefilling_share_up_to_prefill_chunks_chunks_one_each():
    """Prompts waiting together take one chunk each, up to prefill_chunks chunks' tokens in all;
    one prompt alone beside running streams takes one chunk an iteration (they wait one chunk)."""
    s = scheduler(chunk=32, chunks=3, max_batch=5, blocks=128)
    a, b, c, d = queued(s, 100, 100, 100, 100)
    s.admit()
    assert s.prefill_pieces() == [(a, 0, 32), (b, 0, 32), (c, 0, 32)]
    for seq in (a, b, c):
        seq.kv_len = 32
    assert s.prefill_pieces() == [(a, 32, 64), (b, 32, 64), (c, 32, 64)]  # oldest first: d waits
    beside = scheduler(chunk=32, chunks=3)
    streaming, x = queued(beside, 4, 100)
    beside.admit()
    streaming.kv_len = 4  # prefilled: it decodes while x prefills
    assert beside.prefill_pieces() == [(x, 0, 32)]


def test_a_prompt_alone_with_nothing_decoding_takes_up_to_prefill_chunks_chunks():
    """Nobody waits on the iteration, so the lone prompt takes up to prefill_chunks chunks at once,
    its pieces still ending at chunk multiples or the prompt's end; once another sequence runs
    beside it, one chunk an iteration again."""
    s = scheduler(chunk=32, chunks=3, blocks=128)
    (x,) = queued(s, 150)
    s.admit()
    x.kv_len = 10  # e.g. a reused prefix: the piece still ends at a chunk multiple
    assert s.prefill_pieces() == [(x, 10, 96)]
    x.kv_len = 96
    assert s.prefill_pieces() == [(x, 96, 150)]
    (y,) = [Seq(9, 40, arrival_s=9.0)]
    s.waiting.append(y)
    s.admit()
    y.kv_len = 40
    assert s.prefill_pieces() == [(x, 96, 128)]


def test_whole_prompts_when_the_chunk_is_zero():
    s = scheduler(chunk=0)
    a, b = queued(s, 300, 50)
    s.admit()
    assert s.prefill_pieces() == [(a, 0, 300), (b, 0, 50)]


def test_fit_keeps_gammas_that_fit():
    s = scheduler()
    a, b = queued(s, 16, 16)
    s.admit()
    assert s.fit({a.seq_id: 4, b.seq_id: 2}) == ({a.seq_id: 4, b.seq_id: 2}, [])
    assert s.stats.memory_gamma_cuts == 0


def test_fit_drops_drafts_first_then_preempts_the_youngest():
    s = scheduler(blocks=4, block_size=4, max_batch=2)
    a, b = queued(s, 4, 4)  # one full block each; 2 free
    for seq in (a, b):
        seq.generated = 1  # running: cached 4, one pending token (prefill_len 4)
    s.admit()
    a.kv_len = b.kv_len = 4
    # 1 + 4 tokens each need 2 blocks each (4 > 2 free): drafts go, 1 + 0 needs 1 each: fits
    assert s.fit({a.seq_id: 4, b.seq_id: 4}) == ({a.seq_id: 0, b.seq_id: 0}, [])
    assert s.stats.memory_gamma_cuts == 1 and s.running == [a, b]
    s.pool.allocate(99, 8)  # someone else took the free blocks
    gammas, preempted = s.fit({a.seq_id: 0, b.seq_id: 0})
    assert preempted == [b] and gammas == {a.seq_id: 0}
    assert list(s.waiting) == [b] and b.kv_len == 0 and b.preemptions == 1 and s.stats.preemptions == 1
    assert b.seq_id not in s.pool and b.slot == -1


def test_vacating_moves_the_last_sequence_into_the_hole():
    s = scheduler()
    a, b, c = queued(s, 16, 16, 16)
    s.admit()
    c.kv_len = 16
    s.vacate(a)
    assert s.running == [c, b] and c.slot == 0 and b.slot == 1 and a.slot == -1
    assert s.slots.calls == [("move", 2, 0, 16)]
    assert a.seq_id not in s.pool
    s.vacate(b)  # the last one: its slot is cleared, nothing moves
    assert s.slots.calls[-1] == ("truncate", 1, 0) and s.running == [c]


def test_preempted_sequences_resume_before_newer_requests():
    s = scheduler(max_batch=1)
    a, b = queued(s, 16, 16)
    s.admit()
    s.preempt(a)
    assert list(s.waiting) == [a, b]
    s.admit()
    assert s.running == [a]


def test_blocks_held_for_later_are_reclaimed_before_drafts_are_dropped_or_anyone_is_preempted():
    s = scheduler(blocks=4, block_size=4, max_batch=2)
    held = [3, 2]  # blocks held for later (retained cells), given back one holder at a time

    def reclaim(seq):
        if not held:
            return False
        s.pool.free(-len(held))
        held.pop()
        return True

    s.reclaim = reclaim
    s.pool.allocate(-1, 12)
    s.pool.allocate(-2, 4)  # 4 of 4 blocks held
    (a,) = queued(s, 4)
    assert s.admit() == [] and s.running == [a] and held == []  # both holders gave theirs up
    a.generated, a.kv_len = 1, 4
    assert s.fit({a.seq_id: 4}) == ({a.seq_id: 4}, []) and s.stats.memory_gamma_cuts == 0
