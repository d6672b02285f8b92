"""Run any policy against a synthetic environment or replay a recorded trace.

    python -m policy.simulator --env batch --policy nightjar composite --steps 2000
    python -m policy.simulator --env mixed --record trace.jsonl --policy static
    python -m policy.simulator --trace trace.jsonl --policy composite

Synthetic runs (`simulate`) drive the policy through the same speculation
component as the server (`policy.speculator`), with continuous batching to the
phase's batch size, simulated drafters and a simulated target; memory actions are
applied (reloads complete after `reload_steps`). Metrics per run:
* regret: sum over steps of 1 - G_played / G*, where G = expected emitted tokens
  / expected step time of the arms actually played and G* the best uniform
  gamma with the best per-sequence drafter (myopic oracle, switch costs included);
* best-arm ratio: fraction of steps with G_played >= (1 - tol) G*;
* throughput: sampled tokens / sampled seconds (and the oracle's G* mean).
Replays (`replay`) drive a policy through the same component over a recorded
StepOutcome trace (counterfactual: the policy's own arms, on the recorded drafts and
verdicts): agreement with the recorded plans and the recorded mean goodput of the
arms the policy would have chosen, per batch size. (`policy.replay` checks instead
that the recording policy reproduces every decision.)
Deterministic by seed: numpy Generator for the environment, random.Random for the policy.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

import numpy as np

from . import costmodel
from .base import Policy
from .environments import ENVIRONMENTS, Environment
from .replay import RecordedDrafter, _active, read_trace
from .rewards import tokens_per_second
from .speculator import Active, Draft, Speculator, Verified
from .types import Arm, SequenceOutcome, StepOutcome

BEST_ARM_TOL = 0.02
ORACLE_GAMMA_MAX = 8


# ---------------------------------------------------------------- expected goodput (pure)
def expected_tokens_vec(alpha: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """Elementwise E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha)."""
    a = np.minimum(alpha, 1 - 1e-9)
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def expected_step_time(batch: int, ks: List[int], drafters: List[Optional[str]], depth: Dict[str, int],
                       is_model: Dict[str, bool], catch_up_s: float) -> float:
    """Deterministic step time of what was played (the simulator's cost model)."""
    t = costmodel.verify_time_s(batch, sum(ks)) + catch_up_s
    users: Dict[str, int] = {}
    for d, k in zip(drafters, ks):
        if d is not None and k > 0:
            users[d] = users.get(d, 0) + 1
    for d, n in users.items():
        t += costmodel.draft_time_s(n, depth.get(d, 0), is_model[d])
    return t


def oracle_goodput(alphas: np.ndarray, names: List[str], is_model: Dict[str, bool],
                   uncaught: np.ndarray, gamma_max: int = ORACLE_GAMMA_MAX) -> float:
    """Best myopic goodput: uniform gamma, per-sequence best drafter within each
    option (any drafter / a single drafter). alphas: [B, D]; uncaught: [B, D]."""
    b = alphas.shape[0]
    best = 1.0 / costmodel.decode_time_s(b) * b
    options = [list(range(len(names)))] + [[j] for j in range(len(names))]
    gammas = np.arange(1, gamma_max + 1)
    for opt in options:
        sub = alphas[:, opt]
        pick = np.asarray(opt)[sub.argmax(axis=1)]
        a = alphas[np.arange(b), pick]
        e = expected_tokens_vec(a[:, None], gammas[None, :]).sum(axis=0)  # [G]
        counts = {names[j]: int((pick == j).sum()) for j in set(pick.tolist())}
        catch = 0.0
        for j, n in counts.items():
            if is_model[j]:
                mask = pick == names.index(j)
                catch += costmodel.catch_up_time_s(int(uncaught[mask, names.index(j)].max()), n)
        for g, e_g in zip(gammas, e):
            t = costmodel.verify_time_s(b, b * int(g)) + catch
            t += sum(costmodel.draft_time_s(n, int(g), is_model[j]) for j, n in counts.items())
            best = max(best, e_g / t)
    return best


# ---------------------------------------------------------------- the run
@dataclass
class Request:
    seq_id: int
    rtype: object
    prompt_len: int
    max_new: int
    jitter: float
    generated: int = 0
    uncaught: Dict[str, int] = field(default_factory=dict)

    def alpha(self, drafter: str) -> float:
        return float(np.clip(self.rtype.alpha_at(drafter, self.generated) + self.jitter, 0.01, 0.98))


class SimulatedDrafter:
    """A drafter of the synthetic environment: each draft position carries a latent
    acceptance probability (the simulated target accepts it with that probability) and,
    for a model drafter, a confidence; it drafts as a model drafter does, asking
    `keep_going` between sub-steps."""

    def __init__(self, spec, env: Environment, rng: np.random.Generator, requests: Dict[int, Request]):
        self.name, self.is_model, self.size_blocks = spec.name, spec.is_model, spec.size_blocks
        self.resident = True
        self.env, self.rng, self.requests = env, rng, requests
        self.latent: Dict[int, np.ndarray] = {}  # seq_id -> acceptance probability per drafted position

    def propose_batch(self, requests, keep_going=None):
        out = []
        for r in requests:
            acc, conf = self.env.sample_position(self.rng, self.requests[r.seq_id].alpha(self.name), r.gamma)
            k = r.gamma
            if self.is_model and keep_going is not None:
                k = 1
                while k < r.gamma and keep_going(r.seq_id, [float(x) for x in conf[:k]]):
                    k += 1
            self.latent[r.seq_id] = acc[:k]
            out.append(Draft(tokens=[0] * k, confidences=[float(x) for x in conf[:k]] if self.is_model else [1.0] * k))
        return out

    def lag(self, seq_id: int, tokens) -> int:
        return self.requests[seq_id].uncaught.get(self.name, 0)

    def commit(self, seq_id: int, tokens) -> None:
        pass

    def release(self, seq_id: int) -> None:
        self.latent.pop(seq_id, None)


@dataclass
class RunResult:
    policy: str
    env: str
    steps: int
    tokens: int = 0
    time_s: float = 0.0
    regret: float = 0.0
    best_steps: int = 0
    oracle_sum: float = 0.0
    batch: List[int] = field(default_factory=list)
    gamma: List[int] = field(default_factory=list)  # max gamma played per step
    ratio: List[float] = field(default_factory=list)  # G_played / G*
    drafter: List[Optional[str]] = field(default_factory=list)  # most used drafter per step
    phase: List[int] = field(default_factory=list)  # environment phase index per step

    @property
    def throughput(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0

    @property
    def best_arm_ratio(self) -> float:
        return self.best_steps / max(self.steps, 1)

    @property
    def oracle_throughput(self) -> float:
        return self.oracle_sum / self.time_s if self.time_s > 0 else 0.0

    def steps_of_phase(self, index: int) -> range:
        idx = [i for i, p in enumerate(self.phase) if p == index]
        return range(idx[0], idx[-1] + 1) if idx else range(0)

    def best_arm_ratio_between(self, start: int, stop: int, tol: float = BEST_ARM_TOL) -> float:
        r = self.ratio[start:stop]
        return sum(1 for x in r if x >= 1 - tol) / max(len(r), 1)

    def spec_fraction_between(self, start: int, stop: int) -> float:
        g = self.gamma[start:stop]
        return sum(1 for x in g if x > 0) / max(len(g), 1)


def simulate(policy: Policy, env: Environment, steps: Optional[int] = None, seed: int = 0,
             record: Optional[Callable[[StepOutcome], None]] = None, tpot_slo_s: Optional[float] = None,
             policy_name: str = "") -> RunResult:
    """Drive `policy` through the speculation component against the environment's
    simulated drafters and target (see the module docstring)."""
    rng = np.random.default_rng(seed)  # acceptance and timing draws
    req_rng = np.random.default_rng([seed, 1])  # request stream: identical for every policy
    requests: Dict[int, Request] = {}
    drafters = {d.name: SimulatedDrafter(d, env, rng, requests) for d in env.drafters}
    names = list(drafters)
    is_model = {n: d.is_model for n, d in drafters.items()}
    spec = Speculator(policy, drafters, clock=lambda: 0.0, drafter_blocks=lambda n: drafters[n].size_blocks,
                      on_outcome=record)
    reload_at: Dict[str, int] = {}
    kv_total = env.kv_total_blocks - sum(d.size_blocks for d in env.drafters if d.is_model)
    running: List[Request] = []
    next_id = 0
    weights = np.array([t.weight for t in env.request_types], float)
    weights /= weights.sum()
    res = RunResult(policy_name or policy.name, env.name, 0)
    clock, step = 0.0, 0

    def apply_memory(actions) -> None:
        nonlocal kv_total
        for act in actions:
            d = drafters.get(act.drafter)
            if d is None or not d.is_model:
                continue
            if act.kind == "offload" and d.resident:
                d.resident = False
                kv_total += d.size_blocks
            elif act.kind == "reload" and not d.resident and d.name not in reload_at:
                reload_at[d.name] = step + env.reload_steps
                kv_total -= d.size_blocks

    while clock < env.duration_s and (steps is None or step < steps):
        pi = env.phase_index(clock)
        phase = env.phases[pi]
        for d, at in list(reload_at.items()):
            if step >= at:
                drafters[d].resident = True
                del reload_at[d]
        while len(running) < phase.batch:
            rt = env.request_types[int(req_rng.choice(len(weights), p=weights))]
            req = Request(next_id, rt, int(req_rng.integers(*env.prompt_len, endpoint=True)),
                          int(req_rng.integers(*env.new_tokens, endpoint=True)), float(req_rng.normal(0, 0.03)),
                          uncaught={d.name: 0 for d in env.drafters if d.is_model})
            running.append(req)
            requests[req.seq_id] = req
            spec.join(req.seq_id)
            next_id += 1
        used = sum(math.ceil((r.prompt_len + r.generated) / env.block_tokens) for r in running)
        # no room cap: the oracle drafts to the end of a request too (emitted tokens are capped)
        active = [Active(r.seq_id, (), r.prompt_len + r.generated, r.generated, r.max_new) for r in running]
        ctx = spec.context(step, active, queue_len=phase.queue, kv_free_blocks=max(kv_total - used, 0),
                           kv_total_blocks=kv_total, tpot_slo_s=tpot_slo_s)
        proposal = spec.propose(ctx, active, apply_memory=apply_memory)

        # what was played: drafted depth per drafter (the draft cost), verified tokens per sequence
        b = len(running)
        ds = [n if len(d) else None for n, d in zip(proposal.drafters, proposal.drafts)]
        ks = [len(d) for d in proposal.drafts]
        depth_of: Dict[str, int] = {}
        for n, conf in zip(proposal.drafters, proposal.confidences):
            if n is not None and conf:
                depth_of[n] = max(depth_of.get(n, 0), len(conf))

        # expected value of what is played vs the oracle, before state changes
        catching = [r.uncaught.get(d, 0) for r, d in zip(running, ds) if d and is_model[d]]
        catch_up = costmodel.catch_up_time_s(max(catching), len(catching)) if catching else 0.0
        e_play = sum(float(expected_tokens_vec(np.array(r.alpha(d)), np.array(k))) if d and k else 1.0
                     for r, d, k in zip(running, ds, ks))
        t_play = expected_step_time(b, ks, ds, depth_of, is_model, catch_up)
        res_names = [n for n in names if drafters[n].resident]
        if res_names:
            alphas = np.array([[r.alpha(n) for n in res_names] for r in running])
            unc = np.array([[r.uncaught.get(n, 0) for n in res_names] for r in running])
            g_star = oracle_goodput(alphas, res_names, is_model, unc)
        else:
            g_star = b / costmodel.decode_time_s(b)
        ratio = (e_play / t_play) / g_star

        # the simulated target verifies: each draft position is accepted with its latent probability
        verdicts = []
        for r, d, k in zip(running, ds, ks):
            a = [float(x) for x in drafters[d].latent[r.seq_id][:k]] if d and k else []
            accepted = 0
            if a:
                draws = rng.random(k) < np.asarray(a)
                accepted = int(np.argmin(draws)) if not draws.all() else k
            model = bool(d and is_model[d])
            verdicts.append(Verified(accepted, min(accepted + 1, r.max_new - r.generated), p_draft=a,
                                     kl=[-math.log(max(x, 1e-8)) for x in a] if model else [],
                                     tv=[1.0 - x for x in a] if model else []))
        noise = float(np.exp(rng.normal(0.0, env.time_noise)))
        t_draft = sum(costmodel.draft_time_s(sum(1 for x, k in zip(ds, ks) if x == d and k), depth_of[d], is_model[d])
                      for d in depth_of) * noise
        t_verify = costmodel.verify_time_s(b, sum(ks)) * noise
        total = t_draft + t_verify + catch_up * noise
        for r, v in zip(running, verdicts):
            r.generated += v.emitted
        for r in [r for r in running if r.generated >= r.max_new]:
            running.remove(r)
            spec.leave(r.seq_id)
        outcome = spec.commit(proposal, verdicts, [()] * b, draft_time_s=t_draft, verify_time_s=t_verify,
                              total_time_s=total)

        # book-keeping
        step += 1
        clock += total
        res.steps = step
        res.phase.append(pi)
        res.tokens += outcome.emitted
        res.time_s += total
        res.regret += 1.0 - ratio
        res.best_steps += ratio >= 1.0 - BEST_ARM_TOL
        res.oracle_sum += g_star * total  # time-weighted over the states visited
        res.batch.append(b)
        res.gamma.append(max(ks, default=0))
        res.ratio.append(ratio)
        used_d = [d for d, k in zip(ds, ks) if d and k]
        res.drafter.append(max(set(used_d), key=used_d.count) if used_d else None)
        for so in outcome.sequences:
            req = requests[so.seq_id]
            for m in req.uncaught:
                req.uncaught[m] = 0 if (so.drafter == m and so.n_drafted > 0) else req.uncaught[m] + so.emitted
            if req.generated >= req.max_new:
                del requests[so.seq_id]
    return res


# ---------------------------------------------------------------- trace replay
@dataclass
class ReplayResult:
    policy: str
    steps: int
    agreement: float  # fraction of steps where the policy's batch arm equals the recorded plan's
    recorded_goodput: float  # mean tokens/s of the trace
    policy_goodput: float  # mean recorded tokens/s of the steps that planned the arm the policy chose (where seen)
    covered: float  # fraction of steps whose chosen arm was planned in the trace at that batch size


def _signature(arms: Iterable[Arm]) -> tuple:
    """Batch arm summary: (most common drafter, max gamma), (None, 0) when off."""
    arms = [a for a in arms if a.speculates]
    if not arms:
        return (None, 0)
    names = [a.drafter for a in arms]
    return (max(set(names), key=names.count), max(a.gamma for a in arms))


def _counterfactual(rec: SequenceOutcome, draft: Draft) -> Verified:
    """The recorded verdict on a prefix of the recorded draft (`RecordedDrafter` plays
    nothing else): the target accepts the same tokens up to the prefix's end."""
    k = len(draft)
    accepted = min(rec.accepted, k)
    return Verified(accepted, min(accepted + 1, rec.emitted), rec.p_draft[:k], rec.kl[:k], rec.tv[:k])


def replay(policy: Policy, trace: List[StepOutcome], policy_name: str = "") -> ReplayResult:
    """Counterfactual replay: drive `policy` through the speculation component over the
    recorded steps (their contexts, joins and leaves, drafter residency), playing back the
    recorded drafts (`policy.replay.RecordedDrafter`). Each sequence gets the arm the
    policy chooses, bounded by what was recorded: its drafter's recorded draft, at most the
    gamma the step asked and the tokens it verified (the recorded verdict on that prefix);
    any other drafter drafts nothing. The policy observes that outcome, timed as recorded.
    Memory actions are not applied: residency follows the trace. The policy's plan is
    compared with the recorded plan per step (`_signature`)."""
    table: Dict[tuple, List[float]] = {}
    for o in trace:
        table.setdefault((o.batch_size, _signature(s.planned for s in o.sequences)), []).append(
            tokens_per_second(o))
    mean = {k: sum(v) / len(v) for k, v in table.items()}
    names = {d.name: d.is_model for o in trace if o.context for d in o.context.drafters}
    drafters = {n: RecordedDrafter(n, m) for n, m in names.items()}
    spec = Speculator(policy, drafters, clock=lambda: 0.0)
    agree = covered = 0
    chosen: List[float] = []
    for o in trace:
        if o.context is None:
            raise ValueError(f"step {o.step} has no recorded context: the trace predates replay through the "
                             "speculation component")
        rec = {s.seq_id: s for s in o.sequences}
        for info in o.context.drafters:
            drafters[info.name].resident = info.resident
        for d in drafters.values():
            d.recorded = rec
        for seq_id in o.joined:
            spec.join(seq_id)
        # the recorded batch, each gamma capped by what the step asked of its drafter
        asked = {s.seq_id: s.requested if s.requested is not None else s.planned.gamma for s in o.sequences}
        proposal = spec.propose(o.context, [_active(v) for v in o.context.sequences],
                                fit=lambda g: {i: min(k, asked[i]) for i, k in g.items() if i in asked})
        for a, d in zip(proposal.batch, proposal.drafts):
            d.keep(min(len(d), rec[a.seq_id].gamma))  # no verdict was recorded past the verified tokens
        sig = _signature(proposal.decision.arm_for(s.seq_id) for s in o.sequences)
        agree += sig == _signature(s.planned for s in o.sequences)
        if (o.batch_size, sig) in mean:
            covered += 1
            chosen.append(mean[(o.batch_size, sig)])
        for seq_id in o.left:
            spec.leave(seq_id)
        spec.commit(proposal, [_counterfactual(rec[a.seq_id], d) for a, d in zip(proposal.batch, proposal.drafts)],
                    [()] * len(proposal.batch), verify_time_s=o.verify_time_s, accept_time_s=o.accept_time_s,
                    io_time_s=o.io_time_s, total_time_s=o.total_time_s, draft_time_s=o.draft_time_s,
                    shadows=[rec[a.seq_id].shadow for a in proposal.batch])
    n = max(len(trace), 1)
    rec_g = sum(tokens_per_second(o) for o in trace) / n
    return ReplayResult(policy_name or policy.name, len(trace), agree / n, rec_g,
                        sum(chosen) / len(chosen) if chosen else 0.0, covered / n)


# ---------------------------------------------------------------- CLI
DEFAULT_PARAMS = {
    # the synthetic environments' drafters are "draft" (model) and "ngram" (model-free)
    "static": {"drafter": "draft", "gamma": 4},
    "vllm_disable_by_batch_size": {"drafter": "draft", "gamma": 4, "disable_batch_size": 16},
    "hf_heuristic": {"drafter": "draft"},
    "smartspec": {"drafter": "draft"},
    "nightjar": {"drafter": "draft"},
    "adaspec": {"drafter": "draft"},
    "dsde": {"drafter": "draft"},
    "metasd": {"drafters": ["draft", "ngram"], "gamma": 4},
    "banditspec": {"drafters": ["draft"], "gammas": [0, 1, 2, 3, 4]},
    "composite": {"drafters": ["draft", "ngram"]},
}


def build(name: str, env: Optional[Environment], seed: int, config: Optional[str] = None) -> Policy:
    from . import make_policy
    from .config import load_policy_config
    if config:
        name, params = load_policy_config(config)
    else:
        params = dict(DEFAULT_PARAMS.get(name, {}))
        if env is not None and "drafters" in params:
            params["drafters"] = [d for d in params["drafters"] if any(e.name == d for e in env.drafters)]
    return make_policy(name, rng=random.Random(seed), **params)


def format_table(rows: List[RunResult]) -> str:
    out = [f"{'env':<11}{'policy':<28}{'regret':>9}{'best-arm':>9}{'tok/s':>9}{'oracle':>9}"]
    for r in rows:
        out.append(f"{r.env:<11}{r.policy:<28}{r.regret:>9.1f}{r.best_arm_ratio:>9.2f}"
                   f"{r.throughput:>9.1f}{r.oracle_throughput:>9.1f}")
    return "\n".join(out)


def main(argv=None) -> int:
    from . import POLICIES
    from .params import PolicyConfigError
    ap = argparse.ArgumentParser(prog="python -m policy.simulator", description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", choices=sorted(ENVIRONMENTS), default="mixed")
    ap.add_argument("--policy", nargs="+", default=sorted(DEFAULT_PARAMS), help="registered policy names")
    ap.add_argument("--config", help="a policy YAML (overrides --policy)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tpot-slo", type=float, default=None, help="seconds")
    ap.add_argument("--trace", help="replay this JSONL trace of StepOutcome.to_dict() instead")
    ap.add_argument("--record", help="write the (single) run's steps as a JSONL trace")
    a = ap.parse_args(argv)
    try:
        names = [None] if a.config else a.policy
        for n in names:
            if n is not None and n not in POLICIES:
                raise PolicyConfigError(f"unknown policy {n!r}; known: {', '.join(sorted(POLICIES))}")
        if a.trace:
            trace = read_trace(a.trace)
            missing = next((o.step for o in trace if o.context is None), None)
            if missing is not None:
                print(f"error: {a.trace}: step {missing} has no recorded context (an older trace)", file=sys.stderr)
                return 2
            print(f"{'policy':<28}{'agree':>7}{'covered':>9}{'recorded tok/s':>16}{'policy tok/s':>14}")
            for n in names:
                r = replay(build(n, None, a.seed, a.config), trace, n or "")
                print(f"{r.policy:<28}{r.agreement:>7.2f}{r.covered:>9.2f}{r.recorded_goodput:>16.1f}"
                      f"{r.policy_goodput:>14.1f}")
            return 0
        env = ENVIRONMENTS[a.env]()
        rows = []
        for n in names:
            sink = open(a.record, "w") if a.record else None
            rec = (lambda o: sink.write(json.dumps(o.to_dict()) + "\n")) if sink else None
            pol = build(n, env, a.seed, a.config)
            rows.append(simulate(pol, env, a.steps, a.seed, rec, a.tpot_slo, n or pol.name))
            if sink:
                sink.close()
        print(format_table(rows))
        return 0
    except PolicyConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
