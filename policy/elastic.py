"""Elastic drafter memory trigger (Nightjar 000, §6), with hysteresis.

offload a resident model drafter when SD is disabled AND N_free < tau_low for
T_persist consecutive steps; reload it when the waiting queue is empty AND
N_free > N_draft + tau_low. Reload is asynchronous: after asking for it we wait
for the engine to report the drafter resident (DrafterInfo.resident) and do not
use it before (the reference code flipped its flag too early).
"""
from __future__ import annotations

import math
from typing import List, Set

from .types import MemoryAction, StepContext


def kv_pressure(queue_len: int, kv_free_blocks: int, kv_total_blocks: int, tau_low_frac: float) -> bool:
    """Requests wait and fewer than tau_low blocks are free: drafts would preempt them.

    >>> kv_pressure(1, 99, 1000, 0.1), kv_pressure(0, 99, 1000, 0.1), kv_pressure(1, 100, 1000, 0.1)
    (True, False, False)
    """
    return queue_len > 0 and kv_free_blocks < math.ceil(tau_low_frac * kv_total_blocks)


def tau_low_blocks(ctx: StepContext, tau_low_frac: float) -> int:
    """tau_low in blocks: a fraction of the pool (paper's best ≈ 10%).

    >>> tau_low_blocks(StepContext(0, [], [], kv_total_blocks=1000), 0.1)
    100
    """
    return int(math.ceil(tau_low_frac * ctx.kv_total_blocks))


class ElasticMemory:
    """Per-policy trigger state: the persistence counter and pending reloads."""

    def __init__(self, tau_low_frac: float = 0.1, t_persist: int = 8):
        self.tau_low_frac, self.t_persist = tau_low_frac, t_persist
        self.low_steps = 0
        self.offloaded: Set[str] = set()  # parked by us, not yet asked back
        self.reloading: Set[str] = set()  # asked back, not yet reported resident

    def update(self, ctx: StepContext, sd_enabled: bool) -> List[MemoryAction]:
        tau = tau_low_blocks(ctx, self.tau_low_frac)
        models = [d for d in ctx.drafters if d.is_model]
        self.reloading -= {d.name for d in models if d.resident}
        actions: List[MemoryAction] = []
        self.low_steps = self.low_steps + 1 if (not sd_enabled and ctx.kv_free_blocks < tau) else 0
        if self.low_steps >= self.t_persist:
            for d in models:
                if d.resident and d.name not in self.reloading:
                    actions.append(MemoryAction("offload", d.name))
                    self.offloaded.add(d.name)
            self.low_steps = 0
            return actions
        for d in models:
            n_draft = d.size_blocks
            if (not d.resident and d.name in self.offloaded and ctx.queue_len == 0
                    and ctx.kv_free_blocks > n_draft + tau):
                actions.append(MemoryAction("reload", d.name))
                self.offloaded.discard(d.name)
                self.reloading.add(d.name)
        return actions
