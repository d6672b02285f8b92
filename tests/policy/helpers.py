"""Tiny fixtures: contexts and outcomes built by hand, traces recorded in the simulator."""
import json

from policy.simulator import simulate
from policy.types import DrafterInfo, SequenceOutcome, SequenceView, StepContext, StepOutcome

DRAFT = DrafterInfo("draft", True, True, size_blocks=100)
NGRAM = DrafterInfo("ngram", False, True)


def ctx(batch=1, step=0, drafters=(DRAFT, NGRAM), kv_free=1000, kv_total=1000, queue=0, slo=None, ctx_len=128):
    seqs = [SequenceView(i, ctx_len, 0, 128, 0.0) for i in range(batch)]
    return StepContext(step, seqs, list(drafters), queue_len=queue, kv_free_blocks=kv_free,
                       kv_total_blocks=kv_total, tpot_slo_s=slo)


def outcome(seqs, total=0.05, step=0):
    return StepOutcome(step, len(seqs), seqs, total_time_s=total)


def seq(i=0, drafter="draft", gamma=4, accepted=2, **kw):
    return SequenceOutcome(i, drafter, gamma, accepted, accepted + 1, **kw)


def record_trace(policy, env, steps, seed=0):
    """The simulator's StepOutcomes for `policy`, through a JSON round trip (as a trace file)."""
    trace = []
    simulate(policy, env, steps=steps, seed=seed,
             record=lambda o: trace.append(StepOutcome.from_dict(json.loads(json.dumps(o.to_dict())))))
    return trace
