"""The vocabulary shared by the engine loop and every policy (see ALGORITHMS.md).

A *step* is one draft -> verify -> accept round for the running batch. Before a
step the loop builds a `StepContext` and asks `Policy.decide()` for a `Decision`:
one `Arm` (drafter, gamma) per running sequence plus optional memory actions.
After the step it reports one `StepOutcome` through `Policy.observe()`.

Pure Python: no torch, no numpy arrays in these records, so policies can be
replayed from recorded traces (`StepOutcome.to_dict` / `from_dict`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Sequence

OFF = None  # drafter name of the "no speculation" arm


@dataclass(frozen=True)
class Arm:
    """A (drafter, gamma) pair. gamma == 0 (or drafter None) is plain decoding."""

    drafter: Optional[str]
    gamma: int

    @property
    def speculates(self) -> bool:
        return self.drafter is not None and self.gamma > 0


NO_SPECULATION = Arm(OFF, 0)


@dataclass(frozen=True)
class DrafterInfo:
    """What a policy may know about one drafter."""

    name: str
    is_model: bool  # model drafters have weights, KV state and real q
    resident: bool  # usable now (model drafters can be parked / reloading)
    size_blocks: int = 0  # KV blocks its weights would occupy (N_draft)


@dataclass(frozen=True)
class SequenceView:
    """One running sequence as the policy sees it."""

    seq_id: int
    context_len: int  # tokens in the target's KV cache (prompt + generated)
    generated: int  # tokens generated so far
    max_new_tokens: int
    temperature: float
    last_drafter: Optional[str] = None  # drafter used in this sequence's previous step
    uncaught_tokens: Mapping[str, int] = field(default_factory=dict)  # per model drafter: tokens it must catch up


@dataclass(frozen=True)
class StepContext:
    step: int
    sequences: Sequence[SequenceView]
    drafters: Sequence[DrafterInfo]
    queue_len: int = 0  # requests waiting for a batch slot
    kv_free_blocks: int = 0
    kv_total_blocks: int = 0
    tpot_slo_s: Optional[float] = None  # time-per-output-token target, if any

    @property
    def batch_size(self) -> int:
        return len(self.sequences)


@dataclass(frozen=True)
class MemoryAction:
    kind: str  # "offload" | "reload"
    drafter: str


@dataclass(frozen=True)
class Decision:
    arms: Mapping[int, Arm]  # seq_id -> arm; a missing seq_id means NO_SPECULATION
    memory_actions: Sequence[MemoryAction] = ()

    def arm_for(self, seq_id: int) -> Arm:
        return self.arms.get(seq_id, NO_SPECULATION)


@dataclass
class SequenceOutcome:
    """What one sequence did in one step.

    accepted: draft tokens the target agreed with (0..gamma).
    emitted:  tokens appended to the output this step (accepted + 1, fewer only
              when the sequence stopped mid-step on EOS/stop word/max_tokens).
    p_draft:  target probability of each proposed draft token (verified positions).
    q_draft:  drafter probability of each proposed draft token (1.0 for model-free).
    kl / tv:  KL(p||q) and TV(p, q) per verified draft position, when the drafter
              has a full q distribution (model drafters); empty otherwise.
    """

    seq_id: int
    drafter: Optional[str]
    gamma: int
    accepted: int
    emitted: int
    p_draft: list = field(default_factory=list)
    q_draft: list = field(default_factory=list)
    kl: list = field(default_factory=list)
    tv: list = field(default_factory=list)


@dataclass
class StepOutcome:
    """The single record of what a step did; rewards, metrics and traces derive from it."""

    step: int
    batch_size: int
    sequences: list  # list[SequenceOutcome]
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    accept_time_s: float = 0.0
    total_time_s: float = 0.0  # whole step wall time incl. scheduling
    io_time_s: float = 0.0  # sending the step's responses (Triton response senders)
    kv_free_blocks: int = 0
    queue_len: int = 0

    @property
    def emitted(self) -> int:
        return sum(s.emitted for s in self.sequences)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.sequences)

    @property
    def drafted(self) -> int:
        return sum(s.gamma for s in self.sequences)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepOutcome":
        d = dict(d)
        d["sequences"] = [SequenceOutcome(**s) for s in d["sequences"]]
        return cls(**d)
