"""Synthetic serving environments with known optimal arms (for the simulator).

An environment is data: drafters, a load schedule (phases of target batch size
and queue length), request types with per-drafter acceptance rates (optionally
drifting mid-request), and the CPU-shaped step cost of `costmodel`. Acceptance
is per draft position: a latent a_j ~ Beta(mean alpha) is the probability the
target accepts that token, so 1 - TV = a_j, p(x) = a_j, and the drafter's own
confidence q_j is a_j plus noise (AdaSpec's signal); KL is taken as -ln a_j.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    is_model: bool
    size_blocks: int = 0


@dataclass(frozen=True)
class Phase:
    """Load held for `seconds` of simulated time (wall-time phases, so a policy
    that slows steps down does not buy itself more time in a busy phase)."""

    seconds: float
    batch: int
    queue: int = 0


@dataclass(frozen=True)
class RequestType:
    """alpha per drafter; after `drift_at` generated tokens, `alpha_after` applies."""

    weight: float
    alpha: Dict[str, float]
    drift_at: Optional[int] = None
    alpha_after: Dict[str, float] = field(default_factory=dict)

    def alpha_at(self, drafter: str, generated: int) -> float:
        if self.drift_at is not None and generated >= self.drift_at:
            return self.alpha_after.get(drafter, self.alpha.get(drafter, 0.0))
        return self.alpha.get(drafter, 0.0)


@dataclass(frozen=True)
class Environment:
    name: str
    drafters: Tuple[DrafterSpec, ...]
    phases: Tuple[Phase, ...]
    request_types: Tuple[RequestType, ...]
    new_tokens: Tuple[int, int] = (96, 160)
    prompt_len: Tuple[int, int] = (64, 256)
    kv_total_blocks: int = 4096
    block_tokens: int = 16
    concentration: float = 6.0  # Beta(a, b) with a + b = concentration
    confidence_noise: float = 0.1
    time_noise: float = 0.03  # lognormal sigma on step time
    reload_steps: int = 5
    description: str = ""

    @property
    def duration_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    def phase_index(self, t: float) -> int:
        for i, p in enumerate(self.phases):
            if t < p.seconds:
                return i
            t -= p.seconds
        return len(self.phases) - 1

    def sample_position(self, rng: np.random.Generator, alpha: float, n: int):
        """-> (a_j acceptance probs, q_j drafter confidences) for n draft positions."""
        if n <= 0:
            return np.zeros(0), np.zeros(0)
        a = np.clip(alpha, 1e-3, 1 - 1e-3)
        acc = rng.beta(a * self.concentration, (1 - a) * self.concentration, size=n)
        conf = np.clip(acc + rng.normal(0.0, self.confidence_noise, size=n), 0.01, 0.99)
        return acc, conf


MODEL = DrafterSpec("draft", True, size_blocks=256)
MODEL2 = DrafterSpec("draft2", True, size_blocks=128)
NGRAM = DrafterSpec("ngram", False)


def stationary() -> Environment:
    return Environment(
        "stationary", (MODEL, MODEL2, NGRAM), (Phase(80.0, 1),),
        (RequestType(1.0, {"draft": 0.75, "draft2": 0.45, "ngram": 0.35}),),
        description="batch 1, fixed acceptance: draft .75 > draft2 .45 > ngram .35")


def drift() -> Environment:
    return Environment(
        "drift", (MODEL, NGRAM), (Phase(80.0, 1),),
        (RequestType(1.0, {"draft": 0.8, "ngram": 0.2}, drift_at=64, alpha_after={"draft": 0.3, "ngram": 0.85}),),
        new_tokens=(128, 128),
        description="batch 1, each request drifts at token 64: draft .8 -> .3, ngram .2 -> .85")


def batch_sweep() -> Environment:
    return Environment(
        "batch", (MODEL,), (Phase(20.0, 1), Phase(25.0, 32), Phase(20.0, 4), Phase(30.0, 64, queue=8),
                            Phase(20.0, 2)),
        (RequestType(1.0, {"draft": 0.7}),),
        new_tokens=(48, 96),
        description="load phases B=1,32,4,64,2; SD pays at small B, costs at B>=32")


def mixed() -> Environment:
    return Environment(
        "mixed", (MODEL, NGRAM),
        (Phase(15.0, 1), Phase(15.0, 8), Phase(20.0, 32, queue=4), Phase(15.0, 2), Phase(15.0, 16), Phase(15.0, 1)),
        (RequestType(0.4, {"draft": 0.55, "ngram": 0.85}),
         RequestType(0.4, {"draft": 0.75, "ngram": 0.1}),
         RequestType(0.2, {"draft": 0.8, "ngram": 0.2}, drift_at=48, alpha_after={"draft": 0.3, "ngram": 0.8})),
        new_tokens=(48, 128),
        description="load phases B=1..32, code-like (ngram .85), chat-like (draft .75), drifting requests")


ENVIRONMENTS = {"stationary": stationary, "drift": drift, "batch": batch_sweep, "mixed": mixed}
