"""Grouping ragged inputs so one padded forward wastes little (prefill, drafter catch-up)."""
from __future__ import annotations

from typing import List


def prefill_groups(lengths: List[int], max_waste: float = 0.25, max_padded_tokens: int = 4096) -> List[List[int]]:
    """Group prompts (by index) for batched prefill so padding stays small.

    A ragged forward pads every prompt to the longest in its group; prompts are
    taken shortest first and a group closes when padding would exceed `max_waste`
    of its real tokens or its padded size would exceed `max_padded_tokens`.

    >>> prefill_groups([250, 20, 240, 25])
    [[1, 3], [2, 0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: List[List[int]] = []
    real = 0
    for i in order:
        n = lengths[i]
        if groups:
            g = groups[-1]
            padded = n * (len(g) + 1)  # n is the new longest (ascending order)
            if padded <= (1 + max_waste) * (real + n) and padded <= max_padded_tokens:
                g.append(i)
                real += n
                continue
        groups.append([i])
        real = n
    return groups
