"""Adaptive speculation policies (pure Python; see ALGORITHMS.md)."""
from .base import POLICIES, Policy, register
from .types import (NO_SPECULATION, Arm, Decision, DrafterInfo, MemoryAction, SequenceOutcome,
                    SequenceView, StepContext, StepOutcome)
from . import static  # noqa: F401  (registers off/static)


def make_policy(name: str, **params) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return cls(**params)


__all__ = ["POLICIES", "Policy", "register", "make_policy", "Arm", "NO_SPECULATION", "Decision",
           "DrafterInfo", "MemoryAction", "SequenceOutcome", "SequenceView", "StepContext", "StepOutcome"]
