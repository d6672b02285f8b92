"""n-gram prompt lookup (Saxena 2023; transformers' prompt_lookup_num_tokens).

Find the most recent earlier occurrence of the sequence's last n tokens (n from
max_n down to min_n) and propose the tokens that followed it. An incremental
index (n-gram -> position after its latest occurrence) makes each proposal O(1)
instead of a scan over the context.

Example: tokens [a b c d a b] with n=2: the suffix "a b" last occurred ending at
position 2, so the proposal is [c d a ...].
"""
from __future__ import annotations

from typing import Dict, Sequence

from .base import Draft, Drafter, register


class _Index:
    __slots__ = ("tables", "indexed")

    def __init__(self, ns):
        self.tables: Dict[int, dict] = {n: {} for n in ns}
        self.indexed = 0  # n-grams ending before this position (exclusive end) are indexed


@register
class NgramDrafter(Drafter):
    name = "ngram"
    is_model = False

    def __init__(self, min_n: int = 2, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.ns = list(range(max_n, min_n - 1, -1))
        self.index: Dict[int, _Index] = {}

    def _update(self, idx: _Index, tokens: Sequence[int]) -> None:
        # Index every n-gram that has a continuation: exclusive end e < len(tokens).
        for e in range(max(idx.indexed, 1), len(tokens)):
            for n, table in idx.tables.items():
                if e >= n:
                    table[tuple(tokens[e - n: e])] = e
        idx.indexed = max(idx.indexed, len(tokens))

    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        idx = self.index.get(seq_id)
        if idx is None or idx.indexed > len(tokens):
            idx = self.index[seq_id] = _Index(self.ns)
        self._update(idx, tokens)
        if gamma <= 0:
            return Draft(tokens=[])
        for n in self.ns:
            if len(tokens) <= n:
                continue
            e = idx.tables[n].get(tuple(tokens[-n:]))
            if e is not None:
                out = list(tokens[e: e + gamma])
                return Draft(tokens=out, confidences=[1.0] * len(out))
        return Draft(tokens=[])

    def release(self, seq_id: int) -> None:
        self.index.pop(seq_id, None)
