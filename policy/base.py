"""Policy interface and registry. Add a policy: one module, one `@register` line."""
from __future__ import annotations

import abc
import random
import time
from typing import Callable, Dict, Type

from .types import Decision, StepContext, StepOutcome

Clock = Callable[[], float]


class Policy(abc.ABC):
    """Decides the arm per sequence each step and learns from each StepOutcome.

    Policies never touch tensors or read the time or global RNG themselves: the
    clock and the RNG are injected so runs are deterministic and replayable.
    """

    name: str = ""

    def __init__(self, *, clock: Clock = time.monotonic, rng: random.Random | None = None):
        self.clock = clock
        self.rng = rng if rng is not None else random.Random(0)

    @abc.abstractmethod
    def decide(self, ctx: StepContext) -> Decision: ...

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from what the step did. Default: nothing to learn."""

    def continue_drafting(self, ctx: StepContext, seq_id: int, confidences: list) -> bool:
        """Asked between draft sub-steps of a model drafter (AdaSpec's
        predict-execute-correct). `confidences` are q of the tokens drafted so far."""
        return True

    def on_request_start(self, seq_id: int) -> None:
        """A new sequence joined (MetaSD re-initialises per request)."""

    def on_request_end(self, seq_id: int) -> None:
        """A sequence left the batch."""


POLICIES: Dict[str, Type[Policy]] = {}


def register(cls: Type[Policy]) -> Type[Policy]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a name")
    POLICIES[cls.name] = cls
    return cls
