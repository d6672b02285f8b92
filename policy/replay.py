"""Exact replay of a recorded trace: does this policy make the same decisions?

A trace is the server's (or the simulator's) `StepOutcome`s as JSON lines
(`SPECSERVE_TRACE_FILE`, `python -m policy.simulator --record`). Each record holds
what the policy was shown (`context`), what it planned and what happened, so the
same policy, built with the same parameters and seed, is driven through the same
speculation component with the recorded drafts and verdicts played back, and
must reproduce every decision: the arm per sequence, the memory actions, how far
each model drafter drafted (`continue_drafting`) and how many drafts were
verified (`verify_lengths`).

    python -m policy.replay trace.jsonl --policy composite --config configs/policies/composite.yaml

(For what *another* policy would have chosen on a trace, see `policy.simulator --trace`.)
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Dict, List

from .base import Policy
from .speculator import Active, Draft, Speculator, Verified
from .types import SequenceOutcome, StepOutcome


def read_trace(path: str) -> List[StepOutcome]:
    with open(path) as f:
        return [StepOutcome.from_dict(json.loads(line)) for line in f if line.strip()]


class RecordedDrafter:
    """Plays back one step's recorded drafts, drafting as the live drafter did: a
    model drafter asks `keep_going` between sub-steps over the recorded confidences."""

    def __init__(self, name: str, is_model: bool):
        self.name, self.is_model, self.resident = name, is_model, True
        self.recorded: Dict[int, SequenceOutcome] = {}
        self.overdrafts: List[int] = []  # seq_ids for which the policy wanted more than was recorded

    def propose_batch(self, requests, keep_going=None) -> List[Draft]:
        out = []
        for r in requests:
            rec = self.recorded.get(r.seq_id)
            conf = list(rec.confidences) if rec is not None and rec.drafter == self.name else []
            k = min(len(conf), r.gamma)
            if self.is_model and conf and keep_going is not None:
                k = 1
                while k < r.gamma and keep_going(r.seq_id, conf[:k]):
                    if k == len(conf):
                        self.overdrafts.append(r.seq_id)
                        break
                    k += 1
            out.append(Draft(tokens=[0] * k, confidences=conf[:k]))
        return out

    def commit(self, seq_id: int, tokens) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


@dataclass
class ReplayCheck:
    steps: int = 0
    decisions: int = 0  # per-sequence arms compared
    mismatches: List[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.mismatches


def reproduce(policy: Policy, trace: List[StepOutcome], limit: int = 20) -> ReplayCheck:
    """Drive `policy` through the recorded steps; list every decision that differs
    (at most `limit` of them)."""
    names = {d.name: d.is_model for o in trace if o.context for d in o.context.drafters}
    drafters = {n: RecordedDrafter(n, m) for n, m in names.items()}
    spec = Speculator(policy, drafters, clock=lambda: 0.0)
    check = ReplayCheck()

    def differ(step: int, what: str) -> None:
        if len(check.mismatches) < limit:
            check.mismatches.append(f"step {step}: {what}")
        else:
            check.mismatches[-1] = f"... and more (first {limit} shown)"

    for o in trace:
        if o.context is None:
            raise ValueError(f"step {o.step} has no recorded context: the trace predates exact replay")
        rec = {s.seq_id: s for s in o.sequences}
        for info in o.context.drafters:
            drafters[info.name].resident = info.resident
        for d in drafters.values():
            d.recorded, d.overdrafts = rec, []
        for seq_id in o.joined:
            spec.join(seq_id)
        # the recorded batch after the driver's limits (room, KV pool, preemption)
        asked = {s.seq_id: s.requested if s.requested is not None else s.planned.gamma for s in o.sequences}
        proposal = spec.propose(o.context, [_active(v) for v in o.context.sequences], fit=lambda g: dict(asked))
        check.steps += 1
        if tuple(proposal.decision.memory_actions) != tuple(o.memory_actions):
            differ(o.step, f"memory actions {proposal.decision.memory_actions} != recorded {o.memory_actions}")
        for d in drafters.values():
            for seq_id in d.overdrafts:
                differ(o.step, f"sequence {seq_id}: the policy kept drafting past the recorded draft")
        for s in o.sequences:
            check.decisions += 1
            arm = proposal.decision.arm_for(s.seq_id)
            if arm != s.planned:
                differ(o.step, f"sequence {s.seq_id}: arm {arm} != recorded {s.planned}")
        for seq_id in o.left:
            spec.leave(seq_id)
        verdicts = [Verified(rec[a.seq_id].accepted, rec[a.seq_id].emitted, rec[a.seq_id].p_draft,
                             rec[a.seq_id].kl, rec[a.seq_id].tv) for a in proposal.batch]
        replayed = spec.commit(proposal, verdicts, [()] * len(proposal.batch), verify_time_s=o.verify_time_s,
                               accept_time_s=o.accept_time_s, io_time_s=o.io_time_s, total_time_s=o.total_time_s,
                               draft_time_s=o.draft_time_s,
                               shadows=[rec[a.seq_id].shadow for a in proposal.batch])
        for r in replayed.sequences:
            s = rec[r.seq_id]
            if (r.n_drafted, r.gamma) != (s.n_drafted, s.gamma):
                differ(o.step, f"sequence {r.seq_id}: drafted/verified {r.n_drafted}/{r.gamma} "
                               f"!= recorded {s.n_drafted}/{s.gamma}")
    return check


def _active(view) -> Active:
    return Active(view.seq_id, (), view.context_len, view.generated, view.max_new_tokens, view.temperature)


def main(argv=None) -> int:
    from . import make_policy
    from .config import load_policy_config
    ap = argparse.ArgumentParser(prog="python -m policy.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--policy", default="composite")
    ap.add_argument("--config", help="the policy YAML the server ran (overrides --policy)")
    ap.add_argument("--seed", type=int, default=0, help="the policy's RNG seed (the server uses 0)")
    a = ap.parse_args(argv)
    name, params = load_policy_config(a.config) if a.config else (a.policy, {})
    check = reproduce(make_policy(name, rng=random.Random(a.seed), **params), read_trace(a.trace))
    print(f"{check.steps} steps, {check.decisions} decisions: "
          f"{'identical' if check.exact else f'{len(check.mismatches)} differ'}")
    for m in check.mismatches:
        print("  " + m)
    return 0 if check.exact else 1


if __name__ == "__main__":
    sys.exit(main())
