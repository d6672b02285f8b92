"""The vocabulary shared by the speculation component and every policy (README.md,
"The step protocol"; docs/algorithms.md).

A *step* is one draft -> verify -> accept round for the running batch. Before a
step the speculator (policy/speculator.py) asks `Policy.decide()` for a `Decision`:
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
    # per model-free drafter the policy asked to look ahead (`Policy.lookahead`): the draft
    # tokens it has ready for this step (0: no continuation); None when nobody looked ahead
    available: Optional[Mapping[str, int]] = None


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

    @classmethod
    def from_dict(cls, d: dict) -> "StepContext":
        d = dict(d)
        d["sequences"] = [SequenceView(**v) for v in d["sequences"]]
        d["drafters"] = [DrafterInfo(**i) for i in d["drafters"]]
        return cls(**d)


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
    """What one sequence did in one step: the arm the policy planned and what happened.

    planned_drafter / planned_gamma: the policy's arm for this sequence (`Decision`);
              None when the record predates them (then: as played).
    drafter / gamma: what was played: the drafter that drafted and the number of draft
              tokens the target verified (0..planned; fewer when the drafter stopped early,
              had no continuation, was not resident, failed, or the policy eliminated some).
    requested: the gamma asked of the drafter: the plan capped by the sequence's room (max
              tokens, context) and the KV pool; 0 when its drafter was not resident.
    drafted:  tokens the drafter produced (<= requested, >= gamma; the policy may verify fewer).
    accepted: draft tokens the target agreed with (0..gamma).
    emitted:  tokens appended to the output this step (accepted + 1, fewer only
              when the sequence stopped mid-step on EOS/stop word/max_tokens).
    confidences: the drafter's q of every drafted token (len drafted; 1.0 for model-free).
    p_draft:  target probability of each verified draft token.
    kl / tv:  KL(p||q) and TV(p, q) per verified draft position, when the drafter
              has a full q distribution (model drafters); empty otherwise.
    context_len: tokens in the target's KV cache when the step began.
    catch_up: tokens the (model) drafter had to catch up before drafting this step.
    shadow:   [(drafter, successes, trials)] for the drafts looked ahead but not played,
              checked against the tokens the step committed (free evidence of alpha: a
              one-hot draft token equals the target's token exactly as often as
              verification would accept it).
    """

    seq_id: int
    drafter: Optional[str]
    gamma: int
    accepted: int
    emitted: int
    p_draft: list = field(default_factory=list)
    confidences: list = field(default_factory=list)
    kl: list = field(default_factory=list)
    tv: list = field(default_factory=list)
    planned_drafter: Optional[str] = None
    planned_gamma: Optional[int] = None
    requested: Optional[int] = None
    drafted: Optional[int] = None
    context_len: int = 0
    catch_up: int = 0
    shadow: list = field(default_factory=list)

    @property
    def q_draft(self) -> list:
        """q of each verified draft token."""
        return self.confidences[: self.gamma]

    @property
    def planned(self) -> Arm:
        """The arm the policy chose for this sequence (as played, for records without one)."""
        if self.planned_gamma is None:
            return Arm(self.drafter, self.gamma)
        return Arm(self.planned_drafter, self.planned_gamma)

    @property
    def n_drafted(self) -> int:
        return self.gamma if self.drafted is None else self.drafted


@dataclass
class StepOutcome:
    """The single record of what a step did; rewards, metrics and traces derive from it.

    Self-sufficient: with `context` (what the policy was shown), the planned arms and
    memory actions, and `joined` / `left` (sequences the policy was told about before /
    after the step), a recorded trace replays a policy's decisions exactly
    (`policy.replay`)."""

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
    context: Optional[StepContext] = None
    memory_actions: tuple = ()  # the policy's MemoryActions this step
    joined: tuple = ()  # seq_ids the policy was told started (on_request_start) before deciding
    left: tuple = ()  # seq_ids the policy was told ended (on_request_end) after observing

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
        seqs = []
        for s in d["sequences"]:
            s = dict(s)
            if "q_draft" in s:  # traces written before `confidences`
                s["confidences"] = s.pop("q_draft")
            seqs.append(SequenceOutcome(**s))
        d["sequences"] = seqs
        if d.get("context") is not None:
            d["context"] = StepContext.from_dict(d["context"])
        d["memory_actions"] = tuple(MemoryAction(**a) for a in d.get("memory_actions", ()))
        d["joined"], d["left"] = tuple(d.get("joined", ())), tuple(d.get("left", ()))
        return cls(**d)
