"""One memory budget for the target's KV blocks and the resident model drafters.

    blocks = (budget - Σ resident drafters' weight bytes) // (block_size * bytes per token)
    bytes per token = target KV + Σ resident model drafters' KV (a drafter caches the
                      same tokens, so its KV is reserved along with the target's)

Parking a drafter (Nightjar §6) returns its weights and its share of every block to
the pool (`grow`); reloading takes them back first (`shrink`, which migrates live
blocks out of the reclaimed range), so the budget holds at every moment. A reload
that cannot shrink the pool (too few free blocks) is refused and retried later.

On the CPU engine a sequence's keys/values live in its batch slot, so the block
table is the admission and preemption ledger and a shrink's moves are table
remaps only; a paged GPU engine would copy the moved blocks (the moves are returned).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from .kv_blocks import BlockPool, OutOfBlocks

log = logging.getLogger("specserve.memory")

BLOCK_TOKENS = 16


class KVMemory:
    def __init__(self, budget_bytes: int, target_kv_bytes_per_token: int, model_drafters: Dict[str, object],
                 block_size: int = BLOCK_TOKENS):
        """model_drafters: name -> object with weight_bytes, kv_bytes_per_token and resident."""
        self.budget = budget_bytes
        self.block_size = block_size
        self.target_bpt = target_kv_bytes_per_token
        self.drafters = model_drafters
        self.resident = {n for n, d in model_drafters.items() if d.resident}
        self.pool = BlockPool(self.blocks_with(self.resident), block_size)
        if self.pool.num_blocks == 0:
            raise ValueError(f"KV budget {budget_bytes} B leaves no room for the KV cache after drafter weights")

    @staticmethod
    def budget_for(tokens: int, target_bpt: int, model_drafters: Dict[str, object]) -> int:
        """The budget that holds `tokens` of KV with every drafter resident (no memory pressure)."""
        bpt = target_bpt + sum(d.kv_bytes_per_token for d in model_drafters.values())
        return tokens * bpt + sum(d.weight_bytes for d in model_drafters.values())

    def blocks_with(self, resident) -> int:
        bpt = self.target_bpt + sum(self.drafters[n].kv_bytes_per_token for n in resident)
        free_bytes = self.budget - sum(self.drafters[n].weight_bytes for n in resident)
        return max(0, free_bytes // (bpt * self.block_size))

    def drafter_blocks(self, name: str) -> int:
        """KV blocks the drafter's residency costs (Nightjar's N_draft)."""
        with_it = self.resident | {name}
        return self.blocks_with(with_it - {name}) - self.blocks_with(with_it)

    def parked(self, name: str) -> None:
        """The drafter's memory is free: give it to the pool."""
        if name in self.resident:
            before = self.blocks_with(self.resident)
            self.resident.discard(name)
            self.pool.grow(self.blocks_with(self.resident) - before)

    def reserve_for_reload(self, name: str) -> List[Tuple[int, int]]:
        """Take the drafter's memory back from the pool before loading it. Raises OutOfBlocks."""
        if name in self.resident:
            return []
        after = self.blocks_with(self.resident | {name})
        moves = self.pool.shrink(self.pool.num_blocks - after)
        self.resident.add(name)
        return moves


class DrafterMemory:
    """Applies the policy's memory actions (MemoryAction) to the model drafters: parks a resident
    one, starts reloading a parked one; counts both. With a `ledger` (our loop's KVMemory) a park
    gives the drafter's bytes to the KV pool and a reload takes them back first, deferred while too
    few blocks are free; without one (TensorRT-LLM, whose KV pool is sized at start) it only moves
    the weights."""

    def __init__(self, drafters: Dict[str, object], ledger: Optional[KVMemory] = None):
        self.model_drafters = {n: d for n, d in drafters.items() if getattr(d, "is_model", False)}
        self.ledger = ledger
        self.parks = self.reloads = 0

    def __call__(self, actions) -> None:
        for action in actions:
            d = self.model_drafters.get(action.drafter)
            if d is None:
                continue
            if action.kind == "offload" and d.resident:
                d.park()
                if self.ledger is not None:
                    self.ledger.parked(action.drafter)
                self.parks += 1
                log.info("parked drafter %s%s", action.drafter, self._pool())
            elif action.kind == "reload" and not d.resident and not d.reloading:
                if self.ledger is not None:
                    try:
                        self.ledger.reserve_for_reload(action.drafter)  # CPU engine: moves are table remaps
                    except OutOfBlocks:
                        log.debug("reload of %s deferred: too few free KV blocks", action.drafter)
                        continue
                d.start_reload()
                self.reloads += 1
                log.info("reloading drafter %s%s", action.drafter, self._pool())

    def _pool(self) -> str:
        return f"; KV pool now {self.ledger.pool.num_blocks} blocks" if self.ledger is not None else ""


__all__ = ["DrafterMemory", "KVMemory", "OutOfBlocks", "BLOCK_TOKENS"]
