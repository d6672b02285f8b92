"""The drafter contract.

A drafter sees a sequence's committed tokens (prompt + output, never unverified
drafts) and proposes up to γ tokens. Model drafters also return q, their full
distribution per drafted position, and confidences q(d_j); model-free drafters
return q=None, meaning one-hot at the proposal (confidence 1.0).
Drafters that keep per-sequence state (model drafters' KV cache) learn what was
accepted through `commit` and forget sequences through `release`.

The engine loop calls `propose_batch` once per drafter per step with every sequence
that drafter serves; model drafters override it to run one batched forward per draft
sub-step, model-free drafters inherit the per-sequence loop.
"""
from __future__ import annotations

import abc
from typing import Dict, List, Optional, Sequence, Type

from policy.speculator import ContinueFn, Draft, DraftRequest


class Drafter(abc.ABC):
    name: str = ""
    is_model: bool = False
    resident: bool = True  # usable now; model drafters are not while parked or reloading
    reloading: bool = False  # a parked model drafter's weights are coming back (drafters/model.py)
    wants_features: bool = False  # reads the target's features: the loop calls observe_features (drafters/feature.py)
    wants_guides: bool = False  # reads guided sequences' grammar states: the loop binds `guides` (drafters/grammar.py)

    @abc.abstractmethod
    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        """Propose up to `gamma` tokens to follow `tokens` (the committed sequence)."""

    def propose_batch(self, requests: List[DraftRequest], keep_going: Optional[ContinueFn] = None) -> List[Draft]:
        """One Draft per request, in order. A failure raises for the whole group."""
        return [self.propose(r.seq_id, r.tokens, r.gamma) for r in requests]

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None:
        """The committed sequence grew to `tokens` (after acceptance)."""

    def release(self, seq_id: int) -> None:
        """The sequence left; drop its state."""


DRAFTERS: Dict[str, Type[Drafter]] = {}


def register(cls: Type[Drafter]) -> Type[Drafter]:
    DRAFTERS[cls.name] = cls
    return cls


def make_drafter(name: str, **params) -> Drafter:
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; known: {', '.join(sorted(DRAFTERS))}")
    return DRAFTERS[name](**params)
