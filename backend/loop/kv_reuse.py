"""KV reuse in our loop: an admitted prompt starts from cells already cached where it can, and a
finished sequence leaves its cells for later prompts.

Two sources of cached cells (both bit for bit what a prefill caches, so reuse is lossless):
  retained  the cells finished sequences left in the engine's retained streams (llama.cpp's
            `retain_streams`; the ledger of which stream holds which tokens is retained.py): the
            longest prefix a prompt shares with one is copied into its slot (`restore`)
  prefix    the chat template's shared first tokens, prefilled once into the engine's prefix
            stream (llama.cpp's `prefix_stream`, the `reuse_prefix` setting), copied the same way
Only the rest of the prompt is prefilled. Retained cells hold blocks of the loop's pool and are
given up, least recently used first, when admission or a step needs them (`reclaim`).
"""
from __future__ import annotations

import logging
from typing import List, Optional

from ..generation.request import chat_prefix
from ..generation.sequence import Sequence
from .kv_blocks import BlockPool
from .retained import RetainedPrompts
from .stats import LoopStats

log = logging.getLogger("specserve.loop")


class KVReuse:
    """`streams`: the engine's retained streams the loop uses (0: no reuse across requests);
    `reuse_prefix`: copy the chat template's shared first tokens where the engine can."""

    def __init__(self, engine, tokenizer, pool: BlockPool, stats: LoopStats, *, streams: int,
                 reuse_prefix: bool, max_context: int):
        self.engine, self.pool, self.stats = engine, pool, stats
        self.retained = RetainedPrompts(streams, pool) if streams else None
        self.prefix_ids: List[int] = []
        if reuse_prefix and getattr(engine, "supports_prefix", False):
            self.prefix_ids = chat_prefix(tokenizer)[: max_context // 2]
            if self.prefix_ids:
                engine.set_prefix(self.prefix_ids)

    def restore(self, seq: Sequence) -> None:
        """An admitted prompt starts from cached cells where it can (copied into its slot now, before
        anything else admitted may need the retained cells' blocks): the longest prefix it shares with
        a finished sequence's retained cells, or the chat template's shared first tokens from the
        engine's prefix stream; only the rest is prefilled."""
        p = self.prefix_ids
        if seq.kv_len:
            return
        shared = len(p) if p and seq.prefill_len > len(p) and seq.tokens[: len(p)] == p else 0
        if self._restore_retained(seq, longer_than=shared) or not shared:
            return
        try:
            seq.kv_len = self.engine.load_prefix(seq.slot)
        except Exception:  # the prompt is prefilled whole instead; so are later ones
            log.exception("copying the shared prompt prefix failed; prefix reuse is off from now")
            self.prefix_ids = []
            return
        self._count_reuse(seq)

    def _restore_retained(self, seq: Sequence, longer_than: int) -> bool:
        """Copy the longest prefix of seq's prompt that retained cells hold (if longer than
        `longer_than`; one prompt token is always left to prefill: its logits give the first token)."""
        if self.retained is None or seq.generated:
            return False
        self.stats.kv_reuse_lookups += 1
        stream, n = self.retained.match(seq.tokens, seq.prefill_len - 1)
        if n <= longer_than:
            return False
        try:
            self.engine.restore(stream, seq.slot, n)
        except Exception:
            log.exception("restoring retained cells failed; prefilling the prompt whole")
            self.engine.truncate(seq.slot, 0)
            return False
        self.retained.hit(stream)
        seq.kv_len = n
        self.stats.kv_reuse_hits += 1
        self._count_reuse(seq)
        return True

    def _count_reuse(self, seq: Sequence) -> None:
        """seq starts from kv_len cached cells: counted as reused tokens each time (a resumed sequence
        too), and as the request's reused blocks (return_perf_metrics, the metrics) only the first time."""
        self.stats.prefix_tokens_reused += seq.kv_len
        if not seq.generated:
            seq.reused_tokens = seq.kv_len
            self.stats.kv_blocks_reused += seq.kv_len // self.pool.block_size

    def reclaim(self, seq: Optional[Sequence]) -> bool:
        """The scheduler's reclaim: give up retained cells for blocks someone needs now, the least
        recently used first, and those the sequence being admitted (if any) would reuse last."""
        mine = self.retained.match(seq.tokens, seq.prefill_len - 1)[0] if seq is not None and not seq.generated else -1
        return self.retained.evict_one(but=mine) or self.retained.evict_one()

    def retain(self, seq: Sequence) -> int:
        """A finished sequence leaves its cached cells to a retained stream (before its slot is vacated)
        -> the stream, whose blocks `count` counts once the sequence gave its own back; -1 if none."""
        if self.retained is None or seq.slot < 0 or seq.kv_len < self.retained.min_tokens:
            return -1
        n = min(seq.kv_len, len(seq.tokens))  # a stop may have left accepted drafts' cells uncommitted
        stream = self.retained.keep(seq.tokens[:n])
        if stream < 0:  # already retained
            return -1
        try:
            self.engine.retain(seq.slot, stream, n)
        except Exception:
            log.exception("retaining the cells of sequence %d failed", seq.seq_id)
            self.retained.forget(stream)
            return -1
        return stream

    def count(self, streams: List[int]) -> None:
        """Count the blocks of the streams `retain` gave this step, their sequences' blocks being back
        in the pool now. Sequences finishing in one step may claim the same stream (the later one
        outgrew the earlier one's tokens, or took its place): its blocks are counted once, for what
        it holds now."""
        for stream in dict.fromkeys(streams):
            if stream >= 0:
                self.retained.count(stream)
