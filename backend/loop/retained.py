"""KV reuse across requests: which retained stream of the engine keeps which tokens' cells.

When a sequence finishes, the engine copies its cached cells into a retained stream
(`LlamaCpp.retain`); a later prompt that starts with the same tokens (a chat's next turn
resends the whole history; agents and RAG resend the same documents) gets the longest
shared prefix copied back into its slot (`restore`) and prefills only the rest, in the same
chunk boundaries as a whole prefill (a chunk ends at a multiple of the chunk size, wherever
the prefill starts), so nothing depends on what was retained. The cells are bit for bit what
a prefill of the same tokens caches (the engine's kernels compute each row on its own), so
reuse is lossless (tests/backend/loop/test_retained.py).

Retained cells are counted in the KV block pool like a sequence's (under negative ids) and
given up least recently used when admission or a step needs the blocks, before anything
running is preempted. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .kv_blocks import BlockPool

# A whole-stream copy costs ~2.6 ms (2,048 cells, 2-core EPYC), a prefilled token ~1.6 ms: any shared
# prefix pays; 16 tokens keeps lookups from matching on a handful of common first tokens, and still
# catches the chat template's system turn (24 tokens for SmolLM2) from any earlier chat request.
MIN_REUSE_TOKENS = 16


@dataclass
class Retained:
    tokens: List[int]
    used: int  # logical time of its last store or hit (least recently used goes first)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of a[:limit] and b[:limit].

    >>> common_prefix([1, 2, 3, 4], [1, 2, 9], 10), common_prefix([1, 2, 3], [1, 2, 3], 2)
    (2, 2)
    """
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RetainedPrompts:
    def __init__(self, streams: int, pool: BlockPool, min_tokens: int = MIN_REUSE_TOKENS):
        self.entries: List[Optional[Retained]] = [None] * streams
        self.pool, self.min_tokens = pool, min_tokens
        self._time = 0

    @staticmethod
    def pool_id(stream: int) -> int:
        """The block pool's id of a retained stream's cells: negative, never a sequence's."""
        return -1 - stream

    def _tick(self) -> int:
        self._time += 1
        return self._time

    def match(self, tokens: Sequence[int], limit: int) -> Tuple[int, int]:
        """-> (stream, n): the retained stream sharing the longest prefix with tokens[:limit], and
        its length; (-1, 0) when none shares min_tokens."""
        best, best_n = -1, 0
        for stream, e in enumerate(self.entries):
            if e is not None:
                n = common_prefix(e.tokens, tokens, limit)
                if n > best_n:
                    best, best_n = stream, n
        return (best, best_n) if best_n >= self.min_tokens else (-1, 0)

    def hit(self, stream: int) -> None:
        self.entries[stream].used = self._tick()

    def keep(self, tokens: Sequence[int]) -> int:
        """Claim a stream for these tokens (their cells are copied there next): one already holding a
        prefix of them (now outgrown), else an empty one, else the least recently used, whose entry
        is given up. -> the stream, or -1 when one already holds them all. Their blocks are counted
        by `count`, once the sequence that leaves them has given its own back."""
        empty = -1
        for stream, e in enumerate(self.entries):
            if e is None:
                empty = stream if empty < 0 else empty
                continue
            n = common_prefix(e.tokens, tokens, len(tokens))
            if n == len(tokens):
                e.used = self._tick()
                return -1
            if n == len(e.tokens):
                empty = stream
                self._drop(stream)
                break
        if empty < 0:
            empty = min(range(len(self.entries)), key=lambda s: self.entries[s].used)
            self._drop(empty)
        self.entries[empty] = Retained(list(tokens), self._tick())
        return empty

    def count(self, stream: int) -> bool:
        """Count a kept stream's blocks in the pool, giving up the least recently used others while it
        lacks them. -> False when they do not fit (the entry is given up), or when the stream holds
        nothing any more (a later claim in the same step failed and gave it up)."""
        if self.entries[stream] is None:
            return False
        n = len(self.entries[stream].tokens)
        while not self.pool.can_allocate(n) and self.evict_one(but=stream):
            pass
        if not self.pool.can_allocate(n):
            self._drop(stream)
            return False
        self.pool.allocate(self.pool_id(stream), n)
        return True

    def forget(self, stream: int) -> None:
        """The copy into a kept stream failed: nothing is held there."""
        self._drop(stream)

    def evict_one(self, but: int = -1) -> bool:
        """Give up the least recently used entry's blocks (memory pressure). -> False when none is kept."""
        kept = [s for s, e in enumerate(self.entries) if e is not None and s != but]
        if not kept:
            return False
        self._drop(min(kept, key=lambda s: self.entries[s].used))
        return True

    def _drop(self, stream: int) -> None:
        if self.entries[stream] is not None:
            self.entries[stream] = None
            if self.pool_id(stream) in self.pool:
                self.pool.free(self.pool_id(stream))

    @property
    def tokens_kept(self) -> int:
        return sum(len(e.tokens) for e in self.entries if e is not None)
