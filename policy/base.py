"""Policy interface and registry. Add a policy: one module, one `@register` line."""
from __future__ import annotations

import abc
import random
import time
from typing import Callable, Dict, Mapping, Type

from .params import NoParams, build_config
from .types import Decision, StepContext, StepOutcome

Clock = Callable[[], float]


class Policy(abc.ABC):
    """Decides the arm per sequence each step and learns from each StepOutcome.

    Policies never touch tensors or read the time or global RNG themselves: the
    clock and the RNG are injected so runs are deterministic and replayable.

    Parameters arrive either as a ready `config` record (type `Config`) or as
    keyword arguments, which are validated into one (`params.build_config`).
    """

    name: str = ""
    Config: type = NoParams

    def __init__(self, config=None, *, clock: Clock = time.monotonic,
                 rng: random.Random | None = None, **params):
        self.clock = clock
        self.rng = rng if rng is not None else random.Random(0)
        if config is None:
            config = build_config(self.Config, params, self.name)
        elif params:
            raise TypeError(f"{type(self).__name__}: pass either config or parameters, not both")
        self.cfg = config

    @abc.abstractmethod
    def decide(self, ctx: StepContext) -> Decision: ...

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from what the step did. Default: nothing to learn."""

    def continue_drafting(self, ctx: StepContext, seq_id: int, confidences: list) -> bool:
        """Asked between draft sub-steps of a model drafter (AdaSpec's
        predict-execute-correct). `confidences` are q of the tokens drafted so far."""
        return True

    def verify_lengths(self, ctx: StepContext, drafts: Mapping[int, list]) -> Mapping[int, int]:
        """Asked after drafting, before verification: how many of each sequence's
        drafted tokens to verify (AdaSpec's draft-token elimination). `drafts`
        maps seq_id -> q of its drafted tokens. Default: verify all of them."""
        return {seq_id: len(q) for seq_id, q in drafts.items()}

    def lookahead(self) -> Mapping[str, int]:
        """Model-free drafters to ask before deciding, with the most tokens to ask for: the
        speculator shows each sequence's ready draft length (`SequenceView.available`) and
        checks the drafts not played against the committed tokens (`SequenceOutcome.shadow`).
        Default: none."""
        return {}

    def lookahead_stride(self, batch_size: int) -> int:
        """Look ahead this step for one sequence in this many (those whose seq_id + step is a
        multiple of it, so each sequence's turn comes round): the drafts' cost, Python's, grows
        with the batch, and a step the policy will not plan needs them only for learning.
        Default 1: every sequence."""
        return 1

    def speculates_at(self, batch_size: int, *, queue_len: int = 0, kv_free_blocks: int = 0,
                      kv_total_blocks: int = 0) -> bool:
        """Asked once per iteration, before an engine that pads every draft to one length
        (TensorRT-LLM 1.2: backend/services/trtllm/drafter.py) schedules it: can any sequence of
        a batch of `batch_size` speculate? False switches speculation off for the whole
        iteration (no drafts, and no padded positions verified). Default True: the per-sequence
        `decide` settles it inside the iteration."""
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


def resident_names(ctx: StepContext) -> set:
    """Names of drafters usable this step."""
    return {d.name for d in ctx.drafters if d.resident}


def is_model_drafter(ctx: StepContext, name: str) -> bool:
    """Whether `name` is a model drafter (one that costs draft steps); model-free drafters
    (n-gram, suffix lookup) draft at no step cost."""
    return any(d.name == name and d.is_model for d in ctx.drafters)


def bucket_of(batch_size: int) -> int:
    """Power-of-two batch-size bucket: 1, 2, 4 (3-4), 8 (5-8), 16, ...

    >>> [bucket_of(b) for b in (1, 2, 3, 5, 8, 9, 33)]
    [1, 2, 4, 8, 8, 16, 64]
    """
    b = 1
    while b < batch_size:
        b *= 2
    return b
