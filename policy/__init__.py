"""Adaptive speculation policies (pure Python; see docs/algorithms.md)."""
from .base import POLICIES, Policy, register
from .params import PolicyConfigError
from .types import (NO_SPECULATION, Arm, Decision, DrafterInfo, MemoryAction, SequenceOutcome,
                    SequenceView, StepContext, StepOutcome)
# one import per policy module registers it
from . import static, vllm_disable, hf_heuristic, smartspec  # noqa: F401,E401  baselines
from . import nightjar, adaspec, dsde, metasd, banditspec, composite  # noqa: F401,E401  papers + ours


def make_policy(name: str, **params) -> Policy:
    """Build a registered policy; `params` are its config fields plus the optional
    runtime objects clock=, rng= (and profile=/switch_cost= where used)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise PolicyConfigError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return cls(**params)


__all__ = ["POLICIES", "Policy", "PolicyConfigError", "register", "make_policy", "Arm", "NO_SPECULATION",
           "Decision", "DrafterInfo", "MemoryAction", "SequenceOutcome", "SequenceView", "StepContext",
           "StepOutcome"]
