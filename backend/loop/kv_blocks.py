"""The target's KV cache as a pool of fixed-size blocks, one block table per sequence.

Plain Python bookkeeping (no tensors), in the manner of nano-vllm's block manager,
plus what speculative decoding and elastic memory need:
- `truncate` frees whole blocks past a sequence's new length after rejected drafts;
- `shrink` / `grow` resize the pool when the memory budget moves between the KV
  cache and drafter weights; `shrink` migrates live blocks out of the reclaimed
  range and returns the moves so the engine can copy their data.

Token position i of a sequence lives in block table[i // block_size] at offset
i % block_size. Free blocks are a min-heap, so allocation takes the lowest free id
and live blocks stay packed low, which keeps shrink migrations few.

A speculative step: `append(seq, 1 + gamma)` before verification (room for the
pending token and the drafts), then `truncate(seq, old_len + 1 + accepted)`.

Example (block_size 4, 6 blocks): allocate(7, 6) -> table [0, 1] (len 6);
append(7, 5) -> [0, 1, 2] (len 11); truncate(7, 8) -> [0, 1] (block 2 freed);
allocate(8, 9) -> [2, 3, 4]; free(7) frees 0, 1; shrink(3) moves 3 -> 0 and
4 -> 1, so sequence 8's table becomes [2, 0, 1] and the pool has 3 blocks.
"""
from __future__ import annotations

import heapq
from typing import Dict, Iterable, List, Tuple


class OutOfBlocks(RuntimeError):
    """Not enough free blocks; the pool is unchanged. Preempt (see `preemption_victims`) and retry."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V for every layer: 2 * layers * kv_heads * head_dim * bytes.

    Example: 16 layers, 8 KV heads, head_dim 64, fp16 -> 32768 bytes per token.
    """
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def blocks_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int, resident_weight_bytes: int = 0) -> int:
    """How many KV blocks fit in what the budget leaves after resident drafter weights.

    Example: 1 GiB budget, 256 MiB of drafter weights, 32768 B/token, 16-token blocks
    (512 KiB each) -> 768 MiB / 512 KiB = 1536 blocks.
    """
    if bytes_per_token <= 0 or block_size <= 0:
        raise ValueError(f"kv_blocks: bytes_per_token and block_size must be > 0, got {bytes_per_token}, {block_size}")
    return max(0, (budget_bytes - resident_weight_bytes) // (bytes_per_token * block_size))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"kv_blocks: need num_blocks >= 0 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free: List[int] = list(range(num_blocks))  # a heap (sorted is a valid heap)
        self._tables: Dict[int, List[int]] = {}
        self._lens: Dict[int, int] = {}

    # --- questions -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_retained(self) -> int:
        """Blocks of cells kept for later prompts (backend/loop/retained.py), held under negative ids:
        in use, but given up whenever a sequence needs them."""
        return sum(len(t) for i, t in self._tables.items() if i < 0)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def seq_ids(self) -> List[int]:
        return list(self._tables)

    def block_table(self, seq_id: int) -> List[int]:
        return list(self._tables[seq_id])

    def seq_len(self, seq_id: int) -> int:
        return self._lens[seq_id]

    def locate(self, seq_id: int, pos: int) -> Tuple[int, int]:
        """(block, offset) holding token position `pos` of the sequence."""
        if not 0 <= pos < self._lens[seq_id]:
            raise IndexError(f"kv_blocks: position {pos} outside sequence {seq_id} of length {self._lens[seq_id]}")
        return self._tables[seq_id][pos // self.block_size], pos % self.block_size

    def slot_mapping(self, seq_id: int, start: int = 0, end: int | None = None) -> List[int]:
        """Flat cache slots (block * block_size + offset) of positions [start, end)."""
        table, bs = self._tables[seq_id], self.block_size
        end = self._lens[seq_id] if end is None else end
        return [table[i // bs] * bs + i % bs for i in range(start, end)]

    def can_allocate(self, n_tokens: int) -> bool:
        return self.blocks_for(n_tokens) <= len(self._free)

    def can_append(self, seq_id: int, n_new: int) -> bool:
        return self.extra_blocks(seq_id, n_new) <= len(self._free)

    # --- changes ---------------------------------------------------------------------
    def allocate(self, seq_id: int, n_tokens: int) -> List[int]:
        """A new sequence with room for `n_tokens` (its prompt); returns its block table."""
        if seq_id in self._tables:
            raise ValueError(f"kv_blocks: sequence {seq_id} already allocated")
        if n_tokens < 0:
            raise ValueError(f"kv_blocks: n_tokens must be >= 0, got {n_tokens}")
        self._tables[seq_id] = self._take(self.blocks_for(n_tokens))
        self._lens[seq_id] = n_tokens
        return list(self._tables[seq_id])

    def append(self, seq_id: int, n_new: int) -> List[int]:
        """Grow the sequence by `n_new` tokens; returns the blocks added (often none)."""
        if n_new < 0:
            raise ValueError(f"kv_blocks: n_new must be >= 0, got {n_new}")
        new = self._take(self.extra_blocks(seq_id, n_new))
        self._tables[seq_id].extend(new)
        self._lens[seq_id] += n_new
        return new

    def truncate(self, seq_id: int, new_len: int) -> List[int]:
        """Shorten the sequence (drop rejected drafts); returns the whole blocks freed."""
        if not 0 <= new_len <= self._lens[seq_id]:
            raise ValueError(f"kv_blocks: cannot truncate sequence {seq_id} of length {self._lens[seq_id]} to {new_len}")
        table = self._tables[seq_id]
        keep = self.blocks_for(new_len)
        freed = table[keep:]
        del table[keep:]
        self._lens[seq_id] = new_len
        self._give(freed)
        return freed

    def free(self, seq_id: int) -> int:
        """The sequence left (finished or preempted); returns how many blocks it freed."""
        table = self._tables.pop(seq_id)
        del self._lens[seq_id]
        self._give(table)
        return len(table)

    def grow(self, n_blocks: int) -> None:
        """Add blocks num_blocks .. num_blocks + n_blocks - 1 (the budget grew)."""
        if n_blocks < 0:
            raise ValueError(f"kv_blocks: n_blocks must be >= 0, got {n_blocks}")
        self._give(range(self.num_blocks, self.num_blocks + n_blocks))
        self.num_blocks += n_blocks

    def shrink(self, n_blocks: int) -> List[Tuple[int, int]]:
        """Give back the highest-numbered `n_blocks`; returns (old, new) block moves.

        Live blocks in the reclaimed range move to the lowest free blocks below it and
        block tables are remapped. Every source is >= the new size and every destination
        below it and was free, so the caller may copy old -> new in any order (batched),
        and must do so before the next forward. Raises OutOfBlocks if fewer than
        `n_blocks` are free (preempt first).
        """
        if not 0 <= n_blocks <= self.num_blocks:
            raise ValueError(f"kv_blocks: cannot shrink a pool of {self.num_blocks} blocks by {n_blocks}")
        if n_blocks > len(self._free):
            raise OutOfBlocks(f"kv_blocks: shrink by {n_blocks} needs that many free blocks, {len(self._free)} free")
        cut = self.num_blocks - n_blocks
        low_free = sorted(b for b in self._free if b < cut)
        moves: List[Tuple[int, int]] = []
        for table in self._tables.values():
            for i, blk in enumerate(table):
                if blk >= cut:
                    moves.append((blk, low_free[len(moves)]))
                    table[i] = moves[-1][1]
        self._free = low_free[len(moves):]  # sorted, so already a heap
        self.num_blocks = cut
        return moves

    def preemption_victims(self, n_blocks_needed: int, order: Iterable[int]) -> List[int]:
        """Youngest-first sequences to free (and recompute later) until `n_blocks_needed` are free.

        `order` lists candidate sequences oldest first (e.g. by arrival); leave out the
        sequence that needs the room. Returns [] if enough blocks are already free;
        raises OutOfBlocks if preempting every candidate would not be enough.
        Example: free 1, sequences [1, 2, 3] (oldest first) holding 2, 1, 2 blocks,
        need 4 -> [3, 2] (1 + 2 + 1 = 4).
        """
        have = len(self._free)
        victims: List[int] = []
        for seq_id in reversed(list(order)):
            if have >= n_blocks_needed:
                break
            victims.append(seq_id)
            have += len(self._tables[seq_id])
        if have < n_blocks_needed:
            raise OutOfBlocks(f"kv_blocks: need {n_blocks_needed} blocks, at most {have} can be freed")
        return victims

    def extra_blocks(self, seq_id: int, n_new: int) -> int:
        """Blocks the sequence would need to grow by `n_new` tokens."""
        return self.blocks_for(self._lens[seq_id] + n_new) - len(self._tables[seq_id])

    # --- internals -------------------------------------------------------------------

    def _take(self, n: int) -> List[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"kv_blocks: need {n} blocks, {len(self._free)} free")
        return [heapq.heappop(self._free) for _ in range(n)]

    def _give(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            heapq.heappush(self._free, b)
