"""Structured output inside our loop's step: the grammar states of the guided sequences running
(shared with the grammar drafter), every draft cut where it leaves its sequence's grammar, and
the rows of a step whose logits need not be computed.

A draft token is forced where its sequence's grammar allows that token alone
(GuideState.forced_rows): the constrained target emits it whatever the logits are, so its row is
left out of the forward (the LM head is ~13% of a row's cost on the CPU engine; 48% of JSON-schema
rows are forced) and verification sees a point mass on the draft token there (`with_forced_rows`).
The TensorRT-LLM service keeps its guided requests' states in backend/services/trtllm/guides.py.
"""
from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional

import torch

from ..generation.guided import GuideState
from ..generation.sequence import Sequence

log = logging.getLogger("specserve.loop")


class GuidedSequences:
    """The grammar states of the running guided sequences, by seq id. `skip_forced`: leave forced
    rows out of the forward (off where feature drafters run: every row is computed there)."""

    def __init__(self, drafters: Iterable, skip_forced: bool = True):
        self.states: Dict[int, GuideState] = {}
        self.skip_forced = skip_forced
        for d in drafters:  # the grammar drafter proposes what these states force
            if getattr(d, "wants_guides", False):
                d.guides = self.states

    def __len__(self) -> int:
        return len(self.states)

    def add(self, seq: Sequence) -> None:
        if seq.guide is not None:
            self.states[seq.seq_id] = seq.guide

    def remove(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)

    def trim(self, seq_id: int, tokens, draft) -> int:
        """The speculator's trim: how much of a draft the sequence's grammar allows."""
        state = self.states.get(seq_id)
        return len(draft) if state is None else state.valid_prefix(tokens, draft)

    def logit_rows(self, batch: List[Sequence], drafts) -> Optional[List[List[int]]]:
        """The rows of the step whose logits it needs, per sequence (its pending token, then its
        drafts): all but those of forced draft tokens, and always the last. None when every row
        is needed."""
        if not self.skip_forced or not self.states:
            return None
        rows, skipped = [], False
        for seq, d in zip(batch, drafts):
            n = len(d) + 1
            if seq.guide is None or n == 1:
                rows.append(list(range(n)))
                continue
            try:
                forced = seq.guide.forced_rows(seq.tokens, d.tokens)
            except Exception:  # its verification meets the same trouble and fails it alone
                log.exception("sequence %d: its grammar's masks failed; computing every row", seq.seq_id)
                forced = [False] * len(d)
            rows.append([j for j in range(n) if j == n - 1 or not forced[j]])
            skipped = skipped or len(rows[-1]) < n
        return rows if skipped else None


def with_forced_rows(computed: torch.Tensor, drafts: List[List[int]], rows: List[List[int]]) -> torch.Tensor:
    """The step's logits, one row per input token in batch order, from the rows computed
    (`rows` of each sequence, stacked) and, for the rows left out, a point mass on the draft
    token the grammar forces there (its constrained distribution: what verification then sees).

    >>> full = with_forced_rows(torch.zeros(2, 4), drafts=[[2, 1]], rows=[[0, 2]])  # row 1 left out
    >>> full[1].tolist()
    [-inf, 0.0, -inf, -inf]
    """
    sizes = [len(d) + 1 for d in drafts]
    starts = [0]
    for n in sizes[:-1]:
        starts.append(starts[-1] + n)
    kept, left = [], []  # rows computed; (row, forced token) of those left out
    for at, n, r, d in zip(starts, sizes, rows, drafts):
        computed_rows = set(r)
        kept += [at + j for j in r]
        left += [(at + j, int(d[j])) for j in range(n) if j not in computed_rows]
    full = torch.empty((sum(sizes), computed.shape[1]), dtype=computed.dtype)
    full.index_copy_(0, torch.tensor(kept, dtype=torch.long), computed)
    if left:
        idx = torch.tensor([i for i, _ in left], dtype=torch.long)
        full.index_fill_(0, idx, float("-inf"))
        full[idx, torch.tensor([t for _, t in left], dtype=torch.long)] = 0.0
    return full
