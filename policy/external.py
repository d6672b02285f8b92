"""Speculation for an engine that owns its loop (scheduler, KV cache, verification).

Such an engine (TensorRT-LLM's PyTorch backend: a `Drafter` whose
`prepare_draft_tokens` runs once per iteration) can only tell us, each iteration,
which requests are generating and the tokens each has committed so far. That is
enough: the tokens committed since the previous iteration say what the target
made of the previous drafts. A draft token is accepted exactly when it equals
the committed token at its position (greedy: the argmax; sampling: a rejected
draft token has no mass in the recovered distribution max(0, p - q)), so the
accepted count is the length of the common prefix, and the committed count is
the accepted drafts plus the recovered or bonus token.

    drafter = IterationDrafter(Speculator(policy, drafters, lookahead=True), max_draft_len=8)
    each iteration:  drafts = drafter.step(requests, kv_free_blocks=..., kv_total_blocks=...)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

from .base import Clock
from .speculator import Active, Proposal, Speculator, Verified
from .types import StepOutcome


@dataclass(frozen=True)
class Generating:
    """A request in its generation phase, as the engine reports it each iteration."""

    request_id: int
    tokens: Sequence[int]  # prompt + every token committed so far
    prompt_len: int
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


def accepted_prefix(draft: Sequence[int], committed: Sequence[int]) -> int:
    """How many draft tokens the target accepted, from the tokens it committed after them.

    >>> accepted_prefix([5, 6, 7], [5, 6, 9])   # two accepted, 9 recovered
    2
    >>> accepted_prefix([5, 6], [5, 6, 8])       # all accepted, 8 is the bonus token
    2
    >>> accepted_prefix([5, 6], [])              # nothing committed yet
    0
    """
    n = 0
    for d, c in zip(draft, committed):
        if d != c:
            break
        n += 1
    return n


class IterationDrafter:
    """Per iteration: close the previous step from the committed tokens, then propose."""

    def __init__(self, speculator: Speculator, max_draft_len: int, clock: Clock = time.perf_counter):
        self.spec, self.max_draft_len, self.clock = speculator, max_draft_len, clock
        self.iteration = 0
        self._pending: Optional[Proposal] = None  # the previous iteration's drafts, not yet verified
        self._known: Dict[int, int] = {}  # request_id -> tokens committed when last seen

    def step(self, requests: Sequence[Generating], *, finished: Sequence[Generating] = (), kv_free_blocks: int = 0,
             kv_total_blocks: int = 0, queue_len: int = 0, tpot_slo_s: Optional[float] = None) -> Dict[int, List[int]]:
        """-> draft tokens per request id (an empty list: no speculation this iteration).
        `finished`: requests that completed since the last call, with their final tokens, where
        the engine can tell (their last step is then learned from too)."""
        self._close({r.request_id: r for r in list(finished) + list(requests)})
        self._forget_all_but({r.request_id for r in requests})
        for r in requests:
            if r.request_id not in self._known:
                self.spec.join(r.request_id)
            self._known[r.request_id] = len(r.tokens)

        active = [Active(seq_id=r.request_id, tokens=r.tokens, context_len=len(r.tokens) - 1,
                         generated=r.generated, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                         room=min(self.max_draft_len, r.max_new_tokens - r.generated - 1))
                  for r in requests]
        ctx = self.spec.context(self.iteration, active, queue_len=queue_len, kv_free_blocks=kv_free_blocks,
                                kv_total_blocks=kv_total_blocks, tpot_slo_s=tpot_slo_s)
        self.iteration += 1
        self._pending = self.spec.propose(ctx, active)
        return {a.seq_id: list(d.tokens) for a, d in zip(self._pending.batch, self._pending.drafts)}

    @property
    def pending(self) -> bool:
        """Whether the previous iteration's drafts still wait for their verdict."""
        return self._pending is not None

    def close(self, generating: Sequence[Generating], finished: Sequence[Generating] = ()) -> Optional[StepOutcome]:
        """Close the previous iteration as soon as its tokens are committed, before the next one
        runs: an engine that may run that one without the hook (speculation off) commits plain
        tokens the drafts had no part in. `finished` requests leave the speculator."""
        outcome = self._close({r.request_id: r for r in list(finished) + list(generating)})
        for r in finished:
            if r.request_id in self._known:
                self.spec.leave(r.request_id)
                del self._known[r.request_id]
        return outcome

    def finish(self, finished: Sequence[Generating] = ()) -> Optional[StepOutcome]:
        """Close the last iteration (at shutdown, or when the engine goes idle)."""
        outcome = self._close({r.request_id: r for r in finished})
        self._forget_all_but(set())
        return outcome

    def _forget_all_but(self, generating: set) -> None:
        """Requests no longer generating (finished, cancelled) leave the speculator."""
        for rid in [rid for rid in self._known if rid not in generating]:
            self.spec.leave(rid)
            del self._known[rid]

    def _close(self, now: Dict[int, Generating]) -> Optional[StepOutcome]:
        """Commit the previous iteration's proposal from the tokens committed since. A
        request that is gone (finished or cancelled) left no record of its last step
        and is dropped from it."""
        p, self._pending = self._pending, None
        if p is None:
            return None
        keep = [i for i, a in enumerate(p.batch) if a.seq_id in now]
        p = replace(p, batch=[p.batch[i] for i in keep], drafts=[p.drafts[i] for i in keep],
                    drafters=[p.drafters[i] for i in keep], requested=[p.requested[i] for i in keep],
                    confidences=[p.confidences[i] for i in keep])
        verdicts, tokens = [], []
        for a, d in zip(p.batch, p.drafts):
            r = now[a.seq_id]
            new = list(r.tokens[len(a.tokens):])
            verdicts.append(Verified(accepted=min(accepted_prefix(d.tokens, new), max(len(new) - 1, 0)),
                                     emitted=len(new)))
            tokens.append(r.tokens)
        total = self.clock() - p.started_s  # one iteration of the engine: drafting, then its verification
        return self.spec.commit(p, verdicts, tokens, verify_time_s=max(total - p.draft_time_s, 0.0),
                                total_time_s=total)
