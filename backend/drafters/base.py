"""The drafter contract.

A drafter sees a sequence's committed tokens (prompt + output, never unverified
drafts) and proposes up to γ tokens. Model drafters also return q, their full
distribution per drafted position, and confidences q(d_j); model-free drafters
return q=None, meaning one-hot at the proposal (confidence 1.0).
Drafters that keep per-sequence state (model drafters' KV cache) learn what was
accepted through `commit` and forget sequences through `release`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Type

import torch


@dataclass
class Draft:
    tokens: list  # proposed token ids, len <= requested gamma
    q: Optional[torch.Tensor] = None  # [len(tokens), V] or None (one-hot)
    confidences: list = field(default_factory=list)  # q(d_j) per token

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(abc.ABC):
    name: str = ""
    is_model: bool = False

    @abc.abstractmethod
    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        """Propose up to `gamma` tokens to follow `tokens` (the committed sequence)."""

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None:
        """The committed sequence grew to `tokens` (after acceptance)."""

    def release(self, seq_id: int) -> None:
        """The sequence left; drop its state."""


DRAFTERS: Dict[str, Type[Drafter]] = {}


def register(cls: Type[Drafter]) -> Type[Drafter]:
    DRAFTERS[cls.name] = cls
    return cls


def make_drafter(name: str, **params) -> Drafter:
    try:
        return DRAFTERS[name](**params)
    except KeyError:
        raise ValueError(f"unknown drafter {name!r}; known: {', '.join(sorted(DRAFTERS))}") from None
