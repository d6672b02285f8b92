"""The speculation component: the step protocol, written once.

A `Speculator` owns the policy, the drafters and each sequence's drafting state
(which drafter it last used, what the drafters have seen). Whatever runs the
target drives it the same way, once per step:

    ctx      = spec.context(...)                 what the policy may know
    proposal = spec.propose(ctx, sequences)      decide -> memory actions -> draft
                                                 (continue_drafting between a model
                                                 drafter's sub-steps) -> verify_lengths
    ... the engine verifies proposal.drafts and commits tokens ...
    outcome  = spec.commit(proposal, verdicts)   drafters learn the committed tokens,
                                                 policy.observe(StepOutcome)

Drivers: the engine loop (backend/loop/engine_loop.py, llama.cpp and torch engines), the
simulator (policy/simulator.py, a simulated target; its `replay`, another policy's choices
played on a recorded trace's verdicts), an engine that owns its loop
(`policy.external.IterationDrafter`), and exact replay of a recorded trace (`policy.replay`). The policy hears of sequences joining before the step that
first shows them and of sequences leaving after the step that last saw them,
so a trace of `StepOutcome`s replays a policy's decisions exactly.

Lookahead (drivers whose committed tokens are real: `lookahead=True`): before the
decision, the model-free drafters the policy names (`Policy.lookahead`) propose for
every sequence; the policy sees how many tokens each has ready, a played arm uses
the ready draft, and the drafts not played are checked against the tokens the step
commits (`SequenceOutcome.shadow`), so the policy learns their acceptance without
paying to verify them.

Pure Python: drafts carry the drafters' tensors (q) opaquely.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence

from .base import Clock, Policy
from .types import (Decision, DrafterInfo, MemoryAction, SequenceOutcome, SequenceView, StepContext,
                    StepOutcome)

log = logging.getLogger("specserve.speculator")


@dataclass
class Draft:
    """A drafter's proposal for one sequence."""

    tokens: list  # proposed token ids, len <= the requested gamma
    q: object = None  # the drafter's distribution per drafted position ([len(tokens), V] tensor), or None: one-hot
    confidences: list = field(default_factory=list)  # q(d_j) per drafted token (1.0 for model-free)

    def __len__(self) -> int:
        return len(self.tokens)

    def keep(self, k: int) -> None:
        """Keep the first k tokens (the policy verifies fewer than drafted)."""
        self.tokens, self.confidences = self.tokens[:k], self.confidences[:k]
        self.q = None if self.q is None else self.q[:k]


@dataclass
class DraftRequest:
    seq_id: int
    tokens: Sequence[int]  # committed tokens
    gamma: int
    temperature: float = 0.0  # the request's; model drafters sample drafts from q at this temperature
    generator: object = None  # the request's torch.Generator, for model drafters' sampling


# Asked between a model drafter's sub-steps: (seq_id, confidences so far) -> keep drafting?
ContinueFn = Callable[[int, list], bool]
# (seq_id, committed tokens, draft tokens) -> how many leading draft tokens may be verified (a
# grammar's: drafts that leave it are cut before the forward, so no position is spent on them)
TrimFn = Callable[[int, Sequence[int], Sequence[int]], int]


class DrafterLike(Protocol):
    """What the speculator needs of a drafter (backend/drafters/base.py implements it)."""

    name: str
    is_model: bool
    resident: bool

    def propose_batch(self, requests: List[DraftRequest], keep_going: Optional[ContinueFn] = None) -> List[Draft]: ...

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None: ...

    def release(self, seq_id: int) -> None: ...


@dataclass(frozen=True)
class Active:
    """One running sequence as its driver hands it to `context` / `propose`."""

    seq_id: int
    tokens: Sequence[int]  # committed tokens: prompt + generated
    context_len: int  # tokens in the target's KV cache
    generated: int
    max_new_tokens: int
    temperature: float = 0.0
    generator: object = None  # the request's sampling generator (model drafters sample with it)
    room: int = 1 << 30  # most draft tokens the step may verify (max_tokens / context left, minus the bonus)


@dataclass(frozen=True)
class Verified:
    """What the target made of one sequence's draft.

    accepted: draft tokens it agreed with; emitted: tokens committed this step
    (accepted + 1 recovered or bonus token; fewer when the sequence stopped);
    p_draft / kl / tv as in `SequenceOutcome` (empty where the engine cannot tell)."""

    accepted: int
    emitted: int
    p_draft: Sequence[float] = ()
    kl: Sequence[float] = ()
    tv: Sequence[float] = ()


@dataclass
class Proposal:
    """One step's drafts, in the order of `batch`; what `commit` needs back."""

    ctx: StepContext
    decision: Decision
    batch: List[Active]  # the sequences in this step (after `fit`)
    drafts: List[Draft]  # per batch sequence; empty when it does not speculate
    drafters: List[Optional[str]]  # per batch sequence: who drafted (None: nobody)
    requested: List[int]  # per batch sequence: the gamma asked of its drafter
    confidences: List[list]  # per batch sequence: q of every drafted token (before elimination)
    joined: tuple
    started_s: float
    draft_time_s: float
    shadows: List[Dict[str, list]] = field(default_factory=list)  # per batch sequence: ready drafts not played

    def inputs(self) -> List[Sequence[int]]:
        """Per batch sequence: the draft tokens to verify."""
        return [d.tokens for d in self.drafts]


# Limits a step's gammas: {seq_id: gamma} -> {seq_id: gamma} for the sequences that stay
# in the step (the engine loop drops drafts, then preempts, when the KV pool is short).
FitFn = Callable[[Dict[int, int]], Dict[int, int]]


def _no_blocks(drafter: str) -> int:
    return 0


class Speculator:
    def __init__(self, policy: Policy, drafters: Mapping[str, DrafterLike], *,
                 clock: Clock = time.perf_counter,
                 drafter_blocks: Optional[Callable[[str], int]] = None,
                 on_outcome: Optional[Callable[[StepOutcome], None]] = None, lookahead: bool = False,
                 trim: Optional[TrimFn] = None):
        self.policy, self.drafters, self.clock, self.on_outcome = policy, dict(drafters), clock, on_outcome
        self.lookahead, self.trim = lookahead, trim
        self._ready: Dict[int, Dict[str, Draft]] = {}  # this step's lookahead: seq_id -> drafter -> draft
        self.model_drafters = {n: d for n, d in self.drafters.items() if d.is_model}
        self.drafter_blocks = drafter_blocks or _no_blocks  # a named function: the component pickles
        self.last_drafter: Dict[int, str] = {}  # seq_id -> the drafter that last drafted for it
        self.drafter_errors = 0
        self._joined: List[int] = []
        self._left: List[int] = []
        self._release_after_step: List[int] = []
        self._in_step = False

    # -- sequences ------------------------------------------------------------------
    def join(self, seq_id: int) -> None:
        """A new sequence (the policy hears of it before the next step's decision)."""
        self._joined.append(seq_id)

    def sync(self, seq_id: int, tokens: Sequence[int]) -> None:
        """The drafters learn a sequence's committed tokens (after its prefill)."""
        for d in self.drafters.values():
            d.commit(seq_id, tokens)

    def suspend(self, seq_id: int) -> None:
        """Drop the drafters' state of a sequence that will come back (preempted)."""
        if self._in_step:  # commit still hands the drafters this step's tokens
            self._release_after_step.append(seq_id)
            return
        for d in self.drafters.values():
            d.release(seq_id)

    def leave(self, seq_id: int) -> None:
        """The sequence is done (finished, cancelled, failed): drafters forget it now (or
        after the step in flight), the policy after the next step it observes."""
        self.suspend(seq_id)
        self.last_drafter.pop(seq_id, None)
        self._left.append(seq_id)

    # -- one step -----------------------------------------------------------------------
    def context(self, step: int, sequences: Sequence[Active], *, queue_len: int = 0, kv_free_blocks: int = 0,
                kv_total_blocks: int = 0, tpot_slo_s: Optional[float] = None) -> StepContext:
        lag = {n: d for n, d in self.model_drafters.items() if hasattr(d, "lag")}
        available = self._look_ahead(step, sequences) if self.lookahead else {}
        views = [SequenceView(seq_id=s.seq_id, context_len=s.context_len, generated=s.generated,
                              max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                              last_drafter=self.last_drafter.get(s.seq_id),
                              uncaught_tokens={n: d.lag(s.seq_id, s.tokens) for n, d in lag.items()},
                              available=available.get(s.seq_id))
                 for s in sequences]
        infos = [DrafterInfo(name=n, is_model=d.is_model, resident=d.resident,
                             size_blocks=self.drafter_blocks(n) if d.is_model else 0)
                 for n, d in self.drafters.items()]
        return StepContext(step=step, sequences=views, drafters=infos, queue_len=queue_len,
                           kv_free_blocks=kv_free_blocks, kv_total_blocks=kv_total_blocks, tpot_slo_s=tpot_slo_s)

    def _look_ahead(self, step: int, sequences: Sequence[Active]) -> Dict[int, Dict[str, int]]:
        """This step's ready drafts (kept for `propose`); per sequence, their lengths (none for
        a sequence whose turn it is not: `Policy.lookahead_stride`)."""
        self._ready = {}
        wanted = self.policy.lookahead()
        stride = max(1, self.policy.lookahead_stride(len(sequences))) if wanted else 1
        todo = [s for s in sequences if s.room > 0 and (s.seq_id + step) % stride == 0]
        for name, gamma in wanted.items():
            d = self.drafters.get(name)
            if d is None or d.is_model or not d.resident or gamma <= 0 or not todo:
                continue
            try:
                out = d.propose_batch([DraftRequest(s.seq_id, s.tokens, min(gamma, s.room), s.temperature,
                                                    s.generator) for s in todo])
            except Exception:
                self.drafter_errors += 1
                log.exception("drafter %s failed looking ahead", name)
                continue
            for s, draft in zip(todo, out):
                self._ready.setdefault(s.seq_id, {})[name] = self._trimmed(s.seq_id, s.tokens, draft)
        return {s.seq_id: {n: len(d) for n, d in self._ready.get(s.seq_id, {}).items()} for s in sequences}

    def propose(self, ctx: StepContext, sequences: Sequence[Active], *,
                apply_memory: Optional[Callable[[Sequence[MemoryAction]], None]] = None,
                fit: Optional[FitFn] = None) -> Proposal:
        """Decide, apply memory actions, draft, and let the policy trim the drafts.
        `sequences` are those `ctx` shows, in the same order."""
        started = self.clock()
        joined = tuple(self._joined)
        self._joined.clear()
        for seq_id in joined:
            self.policy.on_request_start(seq_id)
        decision = self.policy.decide(ctx)
        if apply_memory is not None and decision.memory_actions:
            apply_memory(decision.memory_actions)
        gammas = {s.seq_id: self._gamma(decision, s) for s in sequences}
        if fit is not None:
            gammas = fit(gammas)
        batch = [s for s in sequences if s.seq_id in gammas]
        requested = [gammas[s.seq_id] for s in batch]
        self._in_step = True

        t_draft = self.clock()
        drafts, names = self._draft(ctx, batch, decision, requested)
        ready, self._ready = self._ready, {}
        shadows = [{n: d.tokens for n, d in ready.get(s.seq_id, {}).items() if n != name and len(d)}
                   for s, name in zip(batch, names)]
        confidences = [list(d.confidences) for d in drafts]
        proposed = {s.seq_id: d.confidences for s, d in zip(batch, drafts) if len(d)}
        if proposed:  # the policy may verify fewer than drafted (AdaSpec's draft-token elimination)
            keep = self.policy.verify_lengths(ctx, proposed)
            for s, d in zip(batch, drafts):
                k = keep.get(s.seq_id, len(d))
                if k < len(d):
                    d.keep(max(k, 0))
        return Proposal(ctx, decision, batch, drafts, names, requested, confidences, joined, started,
                        self.clock() - t_draft, shadows)

    def commit(self, proposal: Proposal, verdicts: Sequence[Verified], tokens: Sequence[Sequence[int]], *,
               verify_time_s: float = 0.0, accept_time_s: float = 0.0, io_time_s: float = 0.0,
               total_time_s: Optional[float] = None, draft_time_s: Optional[float] = None,
               shadows: Optional[Sequence[list]] = None) -> StepOutcome:
        """Close the step: `verdicts` and `tokens` (each sequence's committed tokens now) in
        batch order. The drafters learn the tokens; the policy observes the StepOutcome.
        `shadows`: per sequence, recorded `SequenceOutcome.shadow` (replay) instead of
        checking the lookahead's drafts against `tokens`."""
        p = proposal
        views = {v.seq_id: v for v in p.ctx.sequences}
        if shadows is None:
            shadows = [shadow_trials(sh, toks[len(toks) - v.emitted:] if v.emitted else ())
                       for sh, toks, v in zip(p.shadows or [{}] * len(p.batch), tokens, verdicts)]
        outcomes = []
        for s, draft, name, asked, conf, v, toks, shadow in zip(p.batch, p.drafts, p.drafters, p.requested,
                                                                p.confidences, verdicts, tokens, shadows):
            for d in self.drafters.values():  # every drafter sees every committed token (suffix store)
                d.commit(s.seq_id, toks)
            if name is not None and len(draft):
                self.last_drafter[s.seq_id] = name
            arm = p.decision.arm_for(s.seq_id)
            view = views.get(s.seq_id)
            outcomes.append(SequenceOutcome(
                seq_id=s.seq_id, drafter=name, gamma=len(draft), accepted=v.accepted, emitted=v.emitted,
                p_draft=list(v.p_draft), confidences=conf, kl=list(v.kl), tv=list(v.tv),
                planned_drafter=arm.drafter, planned_gamma=arm.gamma, drafted=len(conf), requested=asked,
                context_len=s.context_len,
                catch_up=view.uncaught_tokens.get(name, 0) if view is not None and name else 0,
                shadow=list(shadow)))
        self._in_step = False
        self._release_deferred()
        left = tuple(self._left)
        self._left.clear()
        total = self.clock() - p.started_s if total_time_s is None else total_time_s
        outcome = StepOutcome(
            step=p.ctx.step, batch_size=len(p.batch), sequences=outcomes,
            draft_time_s=p.draft_time_s if draft_time_s is None else draft_time_s,
            verify_time_s=verify_time_s, accept_time_s=accept_time_s, total_time_s=total, io_time_s=io_time_s,
            kv_free_blocks=p.ctx.kv_free_blocks, queue_len=p.ctx.queue_len, context=p.ctx,
            memory_actions=tuple(p.decision.memory_actions), joined=p.joined, left=left)
        self.policy.observe(outcome)
        for seq_id in left:
            self.policy.on_request_end(seq_id)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome

    def abandon(self) -> None:
        """The step in flight failed before its commit: release what waited for it."""
        self._in_step = False
        self._release_deferred()

    # -- helpers ---------------------------------------------------------------------------
    def _release_deferred(self) -> None:
        for seq_id in self._release_after_step:
            for d in self.drafters.values():
                d.release(seq_id)
        self._release_after_step.clear()

    def _gamma(self, decision: Decision, s: Active) -> int:
        """The policy's gamma, capped by the sequence's room; 0 when its drafter is
        unknown or not resident."""
        arm = decision.arm_for(s.seq_id)
        d = self.drafters.get(arm.drafter) if arm.drafter is not None else None
        return max(0, min(arm.gamma, s.room)) if d is not None and d.resident else 0

    def _draft(self, ctx: StepContext, batch: List[Active], decision: Decision, requested: List[int]):
        """Drafts per sequence (batch order), one propose_batch per drafter; a failing
        drafter's sequences fall back to gamma = 0 for this step."""
        drafts = [Draft(tokens=[]) for _ in batch]
        names: List[Optional[str]] = [None] * len(batch)
        groups: Dict[str, List[int]] = {}
        for i, (s, g) in enumerate(zip(batch, requested)):
            if g > 0:
                groups.setdefault(decision.arm_for(s.seq_id).drafter, []).append(i)

        def keep_going(seq_id: int, confidences: list) -> bool:
            return self.policy.continue_drafting(ctx, seq_id, confidences)

        for name, idxs in groups.items():
            for i in [i for i in idxs if name in self._ready.get(batch[i].seq_id, {})]:  # looked ahead
                d = self._ready[batch[i].seq_id][name]
                d.keep(min(len(d), requested[i]))
                drafts[i], names[i] = d, name
                idxs.remove(i)
            if not idxs:
                continue
            reqs = [DraftRequest(batch[i].seq_id, batch[i].tokens, requested[i], temperature=batch[i].temperature,
                                 generator=batch[i].generator) for i in idxs]
            try:
                out = self.drafters[name].propose_batch(reqs, keep_going)
            except Exception:
                self.drafter_errors += 1
                log.exception("drafter %s failed; its %d sequences fall back to gamma 0", name, len(idxs))
                continue
            for i, d in zip(idxs, out):
                drafts[i], names[i] = self._trimmed(batch[i].seq_id, batch[i].tokens, d), name
        return drafts, names

    def _trimmed(self, seq_id: int, tokens: Sequence[int], draft: Draft) -> Draft:
        if self.trim is not None and len(draft):
            draft.keep(self.trim(seq_id, tokens, draft.tokens))
        return draft


def shadow_trials(drafts: Mapping[str, Sequence[int]], committed: Sequence[int]) -> list:
    """[(drafter, successes, trials)]: each draft against the tokens the step committed,
    under the geometric model (matches up to the first mismatch, which is one failed trial).

    >>> shadow_trials({"ngram": [5, 9, 4], "suffix": [7]}, [5, 9, 7])
    [('ngram', 2, 3), ('suffix', 0, 1)]
    >>> shadow_trials({"ngram": [5, 9, 4]}, [5])   # one token committed: one trial so far
    [('ngram', 1, 1)]
    """
    out = []
    for name, toks in drafts.items():
        n = min(len(toks), len(committed))
        k = 0
        while k < n and toks[k] == committed[k]:
            k += 1
        if n:
            out.append((name, k, k + (k < n)))
    return out
