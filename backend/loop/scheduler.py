"""Who runs this iteration, and with what memory: the engine loop's scheduler. Torch-free and
engine-free (tests/backend/loop/test_scheduler.py drives it with a fake slot holder).

* Admission: waiting sequences take free batch slots (0..B-1, contiguous) and the KV blocks of
  their whole prompt, keeping a block of growth per running sequence so that admitting does not
  force a preemption; a prompt the whole budget cannot hold is refused.
* Chunked prefill: oldest sequences first, at most one chunk of `prefill_chunk` tokens a prompt
  an iteration, and at most `prefill_chunks` chunks in all: one prompt prefilling stalls the
  running streams by one chunk, several share up to `prefill_chunks` of them (a loaded server
  spends more of each iteration on prompts, amortising the decode step). Each piece ends at a
  multiple of the chunk size or at the prompt's end, so a prompt's pieces never depend on other
  traffic.
* Memory fit: when a step's tokens do not fit in the pool, cells retained for reuse are given up
  first (`reclaim`: backend/loop/retained.py), then drafts are dropped (γ = 0 for everyone), then
  the youngest sequences are preempted: out of the batch with their tokens, back
  to the head of the queue, recomputed when room returns.
* Vacating: a leaving sequence's slot is refilled by moving the last one (the engine reads K/V
  as views, not gathers), and its blocks go back to the pool.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Tuple

from .kv_blocks import BlockPool
from .stats import LoopStats

if TYPE_CHECKING:  # torch-free at run time: the scheduler reads a sequence's fields, nothing else
    from ..generation.sequence import Sequence

log = logging.getLogger("specserve.loop")

Piece = Tuple["Sequence", int, int]  # (sequence, first prompt position, end) of one prefill forward


class Slots(Protocol):
    """What the scheduler asks of the engine when slots change (backend/engines: Engine)."""

    def move_slot(self, src: int, dst: int, length: int) -> None: ...

    def truncate(self, slot: int, length: int) -> None: ...


class Scheduler:
    def __init__(self, max_batch: int, prefill_chunk: int, pool: BlockPool, slots: Slots, stats: LoopStats,
                 reclaim: Optional[Callable[[Optional["Sequence"]], bool]] = None,
                 on_admit: Optional[Callable[["Sequence"], None]] = None, prefill_chunks: int = 1):
        """reclaim(seq): frees some blocks held for later (retained cells), those `seq` (being admitted;
        None in a step) could reuse last -> False when nothing is left to free.
        on_admit(seq): a sequence just took its slot (it may start from cached cells: kv_len)."""
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0 = whole prompts), got {prefill_chunk}")
        if prefill_chunks < 1:
            raise ValueError(f"prefill_chunks must be >= 1, got {prefill_chunks}")
        self.max_batch, self.prefill_chunk, self.prefill_chunks = max_batch, prefill_chunk, prefill_chunks
        self.pool, self.slots, self.stats = pool, slots, stats
        self.reclaim = reclaim or (lambda seq: False)
        self.on_admit = on_admit or (lambda seq: None)
        self.waiting: "collections.deque[Sequence]" = collections.deque()
        self.running: List[Sequence] = []  # running[i].slot == i

    def admit(self) -> List[Tuple[Sequence, str]]:
        """Give waiting sequences free slots and their prompt's blocks. -> the refused ones, with why
        (out of the queue; the caller fails them)."""
        admitted, refused = 0, []
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            n = seq.prefill_len
            room = n + self.pool.block_size * (len(self.running) + 1)
            while not self.pool.can_allocate(room) and self.reclaim(seq):
                pass
            if not self.pool.can_allocate(room):
                if not self.running and not admitted and not self.pool.can_allocate(n + 1):
                    self.waiting.popleft()
                    refused.append((seq, f"the request needs {n + 1} tokens of KV cache; the memory budget holds "
                                         f"{self.pool.num_blocks * self.pool.block_size}"))
                    continue
                break
            self.waiting.popleft()
            self.pool.allocate(seq.seq_id, n)
            seq.scheduled_ns = seq.scheduled_ns or time.time_ns()
            seq.slot = len(self.running)
            self.running.append(seq)
            self.on_admit(seq)
            admitted += 1
        return refused

    def prefilling(self) -> List[Sequence]:
        """Running sequences whose prompt is not yet cached, oldest first."""
        return sorted((s for s in self.running if s.prefilling), key=lambda s: (s.arrival_s, s.seq_id))

    def prefill_pieces(self) -> List[Piece]:
        """This iteration's prefill work: [(seq, start, end)], oldest first, at most one chunk a
        sequence and min(prefilling sequences, prefill_chunks) chunks' tokens in all (at least one
        piece); chunk 0 = every prompt whole. A prompt prefilling alone while no sequence decodes
        takes up to prefill_chunks chunks at once: no stream waits on the iteration, and one
        forward reads the weights once for all its rows (llama.cpp, 2-core AMX Xeon: a 512-token
        prompt in 4 chunks of 128 263 ms, in one piece 232). Pieces end at chunk multiples or the
        prompt's end either way, and an engine computes a row alike whatever piece it is in (the
        engine contract: chunked prefill equals one prefill)."""
        chunk, todo = self.prefill_chunk, self.prefilling()
        if not chunk:
            return [(s, s.kv_len, s.prefill_len) for s in todo]
        solo = len(todo) == 1 and len(self.running) == 1
        span = self.prefill_chunks if solo else 1  # chunks a prompt may take this iteration
        pieces, budget = [], chunk * max(1, min(len(todo), self.prefill_chunks))
        for seq in todo:
            end = min(seq.prefill_len, (seq.kv_len // chunk + span) * chunk)
            if pieces and end - seq.kv_len > budget:
                break
            pieces.append((seq, seq.kv_len, end))
            budget -= end - seq.kv_len
            if budget <= 0:
                break
        return pieces

    def fit(self, gammas: Dict[int, int]) -> Tuple[Dict[int, int], List[Sequence]]:
        """Make a step of 1 + γ tokens per sequence (gammas: seq_id -> γ) fit in the pool: drop
        drafts, then preempt the youngest (prefilling or not: a prefilling sequence holds its
        whole prompt's blocks). -> (the gammas of those still running, the preempted)."""
        def need() -> int:
            return sum(self.pool.extra_blocks(s.seq_id, 1 + gammas[s.seq_id]) for s in self.running
                       if s.seq_id in gammas)
        while need() > self.pool.num_free and self.reclaim(None):
            pass
        if need() <= self.pool.num_free:
            return gammas, []
        if any(gammas.values()):
            gammas = dict.fromkeys(gammas, 0)
            self.stats.memory_gamma_cuts += 1
        preempted = []
        while self.running and need() > self.pool.num_free:
            youngest = max(self.running, key=lambda s: (s.arrival_s, s.seq_id))
            self.preempt(youngest)
            preempted.append(youngest)
        return {s.seq_id: gammas[s.seq_id] for s in self.running if s.seq_id in gammas}, preempted

    def preempt(self, seq: Sequence) -> None:
        """Out of the batch, tokens kept; resumes (recomputing its cache) before newer requests."""
        log.info("preempting sequence %d (%d tokens) for lack of KV blocks", seq.seq_id, len(seq.tokens))
        self.vacate(seq)
        seq.kv_len = 0
        seq.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def vacate(self, seq: Sequence) -> None:
        """Give back its batch slot (the last sequence moves into the hole) and its KV blocks."""
        if 0 <= seq.slot < len(self.running) and self.running[seq.slot] is seq:
            i, last = seq.slot, self.running.pop()
            if last is not seq:
                self.slots.move_slot(last.slot, i, last.kv_len)
                last.slot = i
                self.running[i] = last
            else:
                self.slots.truncate(i, 0)
        seq.slot = -1
        if seq.seq_id in self.pool:
            self.pool.free(seq.seq_id)
