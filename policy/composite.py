"""`composite`: our policy — one decision over the joint arm (drafter, gamma) per sequence,
with batch size, KV headroom, SLO and drafter residency as context (docs/algorithms.md,
`## composite`).

Reward: goodput, emitted tokens / step time, decomposed into what generalises across
arms: the acceptance rate per drafter (`acceptance`) and the step time per batch-size
bucket, kind and gamma (`steptime`); `planner` turns them into each step's plan. This
module wires them together: drafter picks, the choice between a model and a model-free
plan, drafting depth, KV pressure, and learning from each StepOutcome alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

from .acceptance import AcceptanceEstimator, Pick, pick_drafter
from .base import Policy, bucket_of, register
from .elastic import ElasticMemory, kv_pressure
from .goodput import expected_tokens
from .params import in_range, require
from .planner import Plan, optimism_bonus, optimistic_goodput, plan_step, speculation_pays
from .profiles import StepTimeProfile, SwitchCostTable
from .rewards import acceptance_trials
from .steptime import StepTimeModel, kind_of
from .types import Arm, Decision, StepContext, StepOutcome

__all__ = ["Composite", "CompositeConfig"]


@dataclass(frozen=True)
class CompositeConfig:
    drafters: Tuple[str, ...] = ("ngram", "suffix")
    gamma_max: int = 8
    prior_alpha: float = 0.5
    global_discount: float = 0.995
    seq_discount: float = 0.95
    shrink: float = 4.0
    explore: float = 0.3
    optimism: float = 0.03
    switch_margin: float = 0.05
    switch_amortise_steps: int = 4
    time_ema: float = 0.2
    profile_path: Optional[str] = None
    switch_cost_path: Optional[str] = None
    elastic: bool = True
    tau_low_frac: float = 0.1
    t_persist: int = 8
    dynamic_depth: bool = True  # B=1 with a model drafter: plan gamma_max, stop on confidences
    # ask the model-free drafters before deciding: plan only where a draft is ready, and learn
    # their acceptance from the drafts not played too (`Policy.lookahead`)
    lookahead: bool = True
    # speculates_at: after this many iterations of a batch-size bucket answered "no", one "yes"
    # (a probe: `decide` explores and the step is learned from); an engine that skips the hook
    # in iterations without speculation shows the policy nothing, and a "no" would never end.
    # 0: never probe
    probe_every: int = 64
    # at REST_MIN_BATCH sequences or more, a plan that drafts for nobody is followed by steps
    # that decode plainly without planning: 1, then 2, 4, ... up to rest_max
    # while the plans between them keep declining (`_Rest`); 0: plan every step
    rest_max: int = 8
    # a resting step looks ahead for about this many sequences, in turn (`lookahead_stride`):
    # enough drafts checked against the committed tokens to keep learning, without Python's
    # cost of all of them (32 sequences: ~1 ms a step). 2, not 8: served chat at 8 streams,
    # where nothing drafts, composite / off 0.96 -> 0.99, at 32 0.97 -> 0.98, copy-heavy at 8 (which
    # must keep learning at rest) 1.07 -> 1.08 (AMX Xeon, session 40); 0: all
    rest_lookahead: int = 2

    def check(self, policy: str) -> None:
        require(len(self.drafters) >= 1, policy, "drafters must be a non-empty list")
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
        in_range(policy, "probe_every", self.probe_every, 0, 1_000_000)
        in_range(policy, "rest_max", self.rest_max, 0, 1_000)
        in_range(policy, "rest_lookahead", self.rest_lookahead, 0, 1_000_000)
        in_range(policy, "prior_alpha", self.prior_alpha, 0.0, 0.99)
        in_range(policy, "global_discount", self.global_discount, 0.5, 1.0)
        in_range(policy, "seq_discount", self.seq_discount, 0.1, 1.0)
        in_range(policy, "shrink", self.shrink, 0.0, 1000.0)
        in_range(policy, "optimism", self.optimism, 0.0, 10.0)
        in_range(policy, "explore", self.explore, 0.0, 10.0)
        in_range(policy, "switch_margin", self.switch_margin, 0.0, 1.0)
        in_range(policy, "switch_amortise_steps", self.switch_amortise_steps, 1, 10_000)
        in_range(policy, "time_ema", self.time_ema, 0.001, 1.0)
        in_range(policy, "tau_low_frac", self.tau_low_frac, 0.0, 0.9)
        in_range(policy, "t_persist", self.t_persist, 1, 10_000)


class Picks(NamedTuple):
    """One drafter pick per sequence of the batch (batch order)."""
    drafters: List[str]
    alphas: List[float]
    optimistic: List[float]


class _Batch(NamedTuple):
    """What every plan of one step shares."""
    ctx: StepContext
    bucket: int
    ctx_len: float  # mean context length
    bonus: List[float]  # optimism per gamma (`planner.optimism_bonus`)
    is_model: Dict[str, bool]  # usable drafter -> is a model drafter
    rows: Dict[tuple, List[float]]  # (k, n_model) -> time row: the plans of a step often share one


# Planning costs ~0.05 ms a sequence (Python: each sequence's pick, the plan's rows): 0.3-0.5 ms
# of a 20 ms step at 8 sequences (2-core Xeon, session 37), 1.5-2.5% of the throughput of a
# batch that decodes plainly; at 1-3 sequences well under 1%, and there a step planned late
# costs a draft that often pays.
REST_MIN_BATCH = 4


@dataclass
class _Rest:
    """Steps left to decode plainly without planning, and the next rest's
    length: it doubles, up to rest_max, while each plan between rests still drafts for
    nobody, and starts again from 1 after a plan that drafts or when the batch-size bucket
    changes. A workload where speculation does not pay plans 1 step in 1 + rest_max; one
    where it starts to pay waits rest_max steps at most."""
    left: int = 0
    next: int = 1
    bucket: int = -1

    def resting(self, bucket: int) -> bool:
        """Whether this step rests (called once a step, by `decide`)."""
        if not self.left:
            return False
        self.left -= 1
        if bucket != self.bucket:  # the batch changed: plan the next step
            self.left, self.next = 0, 1
        return True

    def planned(self, bucket: int, drafts: bool, rest_max: int) -> None:
        if drafts or bucket != self.bucket:
            self.next, self.bucket = 1, bucket
        if not drafts and rest_max:
            self.left, self.next = min(self.next, rest_max), min(2 * self.next, rest_max)


class _Seen(NamedTuple):
    """What `speculates_at` plans with from the latest step decided: the batch's mean context,
    the SLO, and the drafters usable then."""
    ctx_len: float
    slo: Optional[float]
    usable: Tuple[str, ...]


class _Candidate(NamedTuple):
    picks: Picks
    plan: Plan
    amortised: float  # the model drafter's catch-up per step it serves; 0 without one


@dataclass
class _Drafting:
    """The played plan, as `continue_drafting` reads it between a model drafter's sub-steps.
    Only drafting reads it: `observe` learns from the StepOutcome alone."""
    batch: int
    bucket: int
    ctx_len: float
    n_model: int
    amortised: float
    gamma: int
    expected: float  # expected emitted tokens of the whole batch
    n_tokens: int
    alphas: Dict[int, float]  # drafting sequence -> alpha of its drafter
    drafters: Dict[int, str]


def _draft_ready(view, drafter: str, is_model: bool) -> bool:
    """Whether `drafter` may draft for this sequence now: a model drafter always; a model-free one
    unless the look-ahead found it nothing (one not looked ahead for this sequence might have one)."""
    n = view.available.get(drafter) if view.available is not None else None
    return is_model or n is None or n > 0


def _nothing_ready(view, drafters: List[str]) -> bool:
    """No model-free drafter of `drafters` may draft for this sequence now (`_draft_ready`)."""
    return not any(_draft_ready(view, d, False) for d in drafters)


def _planned(s) -> Tuple[Optional[str], int]:
    """`SequenceOutcome.planned` as (drafter, gamma), without building an Arm per sequence."""
    return (s.drafter, s.gamma) if s.planned_gamma is None else (s.planned_drafter, s.planned_gamma)


@register
class Composite(Policy):
    name = "composite"
    Config = CompositeConfig

    def __init__(self, config=None, *, profile: Optional[StepTimeProfile] = None,
                 switch_cost: Optional[SwitchCostTable] = None, **kw):
        super().__init__(config, **kw)
        c = self.cfg
        self.acceptance = AcceptanceEstimator(c.drafters, c.prior_alpha, c.global_discount, c.seq_discount, c.shrink)
        self.times = StepTimeModel(profile or StepTimeProfile.load(c.profile_path), c.time_ema)
        self.c_switch = switch_cost or SwitchCostTable.load(c.switch_cost_path)
        self.pulls: Dict[int, List[int]] = {}  # bucket -> steps played per gamma 0..gamma_max
        self.memory = ElasticMemory(c.tau_low_frac, c.t_persist)
        self.model_drafters: Dict[str, bool] = {}  # a static fact, from every context seen
        self._drafting: Optional[_Drafting] = None
        self._seen = _Seen(0.0, None, tuple(c.drafters))
        self._declined: Dict[int, int] = {}  # batch-size bucket -> speculates_at "no"s since its last "yes"
        self._rest = _Rest()

    def alpha(self, seq_id: int, drafter: str) -> float:
        return self.acceptance.alpha(seq_id, drafter)

    def lookahead(self) -> Dict[str, int]:
        # resting steps look ahead too: their drafts, checked against what the step commits,
        # keep the acceptance rates learning (without them copy-heavy requests at 8 sequences
        # were still at the prior when plans resumed, and never drafted: session 37)
        return {d: self.cfg.gamma_max for d in self.cfg.drafters} if self.cfg.lookahead else {}

    def lookahead_stride(self, batch_size: int) -> int:
        # a step that will rest (asked before `decide`) looks ahead for ~rest_lookahead
        # sequences in turn; a planning step for all (its plan needs every ready draft)
        n = self.cfg.rest_lookahead
        if not (self._rest.left and n and batch_size >= REST_MIN_BATCH):
            return 1
        return -(-batch_size // n)

    # -- decision ---------------------------------------------------------------
    def decide(self, ctx: StepContext) -> Decision:
        c, b = self.cfg, ctx.batch_size
        self._drafting = None
        if b == 0:
            return Decision(arms={})
        info = {d.name: d for d in ctx.drafters}
        usable = [d for d in c.drafters if d in info and info[d].resident]
        self._seen = _Seen(sum([v.context_len for v in ctx.sequences]) / b, ctx.tpot_slo_s, tuple(usable))
        # KV headroom: while requests wait and free blocks are short, drafts would preempt them
        pressure = kv_pressure(ctx.queue_len, ctx.kv_free_blocks, ctx.kv_total_blocks, c.tau_low_frac)
        bucket = bucket_of(b)
        if self._rest.resting(bucket):
            arms = {}
        else:
            arms = self._choose(ctx, usable, info) if usable and not pressure else {}
            if b >= REST_MIN_BATCH:
                self._rest.planned(bucket, bool(arms), c.rest_max)
        actions = self.memory.update(ctx, sd_enabled=bool(arms)) if c.elastic else []
        return Decision(arms=arms, memory_actions=tuple(actions))

    def _choose(self, ctx: StepContext, usable: List[str], info) -> Dict[int, Arm]:
        """The joint (drafter, gamma) pick, cost-aware. Each sequence's drafter goes by
        optimistic alpha; when that picks a model drafter for some sequence and model-free
        drafters exist, the same picks with each model drafter replaced by the sequence's
        best model-free one are planned too, and the plan worth more is played: the
        model-free plan at its expected goodput against the model plan at its optimistic
        goodput (draft steps and catch-up priced). Comparing expected goodputs alone would
        never try a model drafter (at equal alphas the model-free plan costs less); the
        optimism, which shrinks as the sequence plays the drafter, is what explores it."""
        b = ctx.batch_size
        is_model = {d: info[d].is_model for d in usable}
        self.model_drafters.update(is_model)
        if not any(is_model.values()) and all(_nothing_ready(v, usable) for v in ctx.sequences):
            return {}  # what the plan comes to when no sequence has a draft (_ready: all None), unplanned
        bucket = bucket_of(b)
        counts = self.pulls.get(bucket) or [0] * (self.cfg.gamma_max + 1)
        step = _Batch(ctx, bucket, self._seen.ctx_len,
                      optimism_bonus(counts[:self.cfg.gamma_max + 1], sum(counts) + 1, self.cfg.optimism), is_model, {})
        free = [d for d in usable if not is_model[d]]
        picks = self._ready(ctx, self._picks(ctx, usable), usable, is_model)
        if not free or not any(is_model[d] for d in set(picks.drafters) if d is not None):
            best = self._plan(step, picks, explore_model=False)
        else:
            best = self._plan(step, picks, explore_model=True)
            alt = self._plan(step, self._ready(ctx, self._model_free(ctx, picks, free), free, is_model),
                             explore_model=False)
            if alt.plan.index > best.plan.index:
                best = alt
        return self._play(step, best)

    def _ready(self, ctx: StepContext, picks: Picks, usable: List[str], is_model: Dict[str, bool]) -> Picks:
        """With lookahead, a sequence whose pick has no draft ready picks again among the
        drafters that have one (or a model drafter); a sequence with none gets no drafter
        (None) and decodes plainly."""
        seqs = ctx.sequences
        if all(v.available is None for v in seqs):
            return picks

        def ready(v, d: str) -> bool:
            return _draft_ready(v, d, is_model[d])

        if all(ready(v, d) for v, d in zip(seqs, picks.drafters)):
            return picks
        c, acc = self.cfg, self.acceptance
        drafters, alphas, optimistic = list(picks.drafters), list(picks.alphas), list(picks.optimistic)
        for i, v in enumerate(seqs):
            if ready(v, drafters[i]):
                continue
            alts = [d for d in usable if ready(v, d)]
            if not alts:
                drafters[i] = None
                continue
            drafters[i], alphas[i], optimistic[i] = pick_drafter(
                acc.seq.get(v.seq_id), alts, {d: acc.global_alpha(d) for d in alts}, v.last_drafter, c.shrink,
                c.explore, c.switch_margin)
        return Picks(drafters, alphas, optimistic)

    def _picks(self, ctx: StepContext, usable: List[str], keep: Optional[Picks] = None) -> Picks:
        """Per sequence, `acceptance.pick_drafter` among `usable`; with `keep`, a sequence whose
        pick there is among `usable` keeps it and only the others are picked again."""
        c, acc, seqs = self.cfg, self.acceptance, ctx.sequences
        a_glob = {d: acc.global_alpha(d) for d in usable}
        stats = acc.seq
        fresh: Dict[Optional[str], Pick] = {}  # sequences without evidence of their own share one answer

        def pick(v) -> Pick:
            st = stats.get(v.seq_id)
            if st:
                return pick_drafter(st, usable, a_glob, v.last_drafter, c.shrink, c.explore, c.switch_margin)
            p = fresh.get(v.last_drafter)
            if p is None:
                p = fresh[v.last_drafter] = pick_drafter(None, usable, a_glob, v.last_drafter, c.shrink,
                                                         c.explore, c.switch_margin)
            return p

        if keep is None and not any(v.seq_id in stats for v in seqs) and len({v.last_drafter for v in seqs}) == 1:
            d, a, o = pick(seqs[0])  # the whole batch shares one answer (no evidence of its own yet)
            return Picks([d] * len(seqs), [a] * len(seqs), [o] * len(seqs))
        if keep is None:
            out = [pick(v) for v in seqs]
        else:
            out = [(d, a, o) if d in a_glob else pick(v)
                   for v, d, a, o in zip(seqs, keep.drafters, keep.alphas, keep.optimistic)]
        return Picks([p[0] for p in out], [p[1] for p in out], [p[2] for p in out])

    def _model_free(self, ctx: StepContext, picks: Picks, free: List[str]) -> Picks:
        """`picks` with each model-drafter pick replaced by the sequence's best model-free
        drafter: the same as picking among the model-free drafters only, since a
        model-free pick already is the best of them, hysteresis included."""
        return self._picks(ctx, free, keep=picks)

    def _plan(self, step: _Batch, picks: Picks, explore_model: bool) -> _Candidate:
        """`planner.plan_step` for these picks; with `explore_model`, the plan's index is its
        optimistic goodput (`planner.optimistic_goodput`) when a model drafter drafts."""
        ctx, c, times, is_model = step.ctx, self.cfg, self.times, step.is_model
        b, bucket, ctx_len, seqs = ctx.batch_size, step.bucket, step.ctx_len, ctx.sequences
        names = set(picks.drafters)
        cand = None  # positions that can draft, when the drafts were looked ahead
        if None in names:
            cand = [i for i, d in enumerate(picks.drafters) if d is not None]
            names.discard(None)
        elif seqs and seqs[0].available is not None:
            cand = list(range(b))
        model = ([is_model[next(iter(names))]] * b if len(names) == 1 and cand is None else
                 [d is not None and is_model[d] for d in picks.drafters])
        n_model = sum(model)
        # the model drafter catches every sequence it drafts for up first: C_switch(L_max, B),
        # spread over the steps it then serves
        l_max = 0 if not n_model else max(
            [v.uncaught_tokens.get(d, 0) for v, d, m in zip(seqs, picks.drafters, model) if m])
        amortised = self.c_switch(l_max, b) / c.switch_amortise_steps if n_model else 0.0

        def step_time(n_tokens: int, gamma: int, n_m: int) -> float:
            return times.step_time(bucket, ctx_len, n_tokens, gamma, n_m, b)

        if cand is None:
            plan = plan_step(picks.alphas, model, self._row(step, b, n_model), step_time, step.bonus,
                             ctx.tpot_slo_s, amortised, dynamic_depth=c.dynamic_depth)
        else:
            plan = plan_step([picks.alphas[i] for i in cand], [model[i] for i in cand],
                             self._row(step, len(cand), n_model), step_time, step.bonus, ctx.tpot_slo_s, amortised,
                             dynamic_depth=c.dynamic_depth, batch=b, caps=[self._ready_len(seqs[i], picks.drafters[i],
                                                                                            is_model) for i in cand])
            plan = plan._replace(keep=frozenset(cand[j] for j in plan.keep))
        if explore_model and plan.n_model:
            kept = [min(o, 0.99) if m else a
                    for i, (a, o, m) in enumerate(zip(picks.alphas, picks.optimistic, model)) if i in plan.keep]
            row_k = self._row(step, len(kept), plan.n_model)
            plan = plan._replace(index=optimistic_goodput(kept, b, row_k, ctx.tpot_slo_s, amortised))
        return _Candidate(picks, plan, amortised if plan.n_model else 0.0)

    def _ready_len(self, view, drafter: str, is_model: Dict[str, bool]) -> int:
        """The most tokens `drafter` can draft for this sequence now: its looked-ahead draft's
        length (a model drafter, or a drafter nobody looked ahead for: gamma_max)."""
        n = view.available.get(drafter) if view.available is not None and not is_model[drafter] else None
        return self.cfg.gamma_max if n is None else n

    def _row(self, step: _Batch, k: int, n_model: int) -> List[float]:
        row = step.rows.get((k, n_model))
        if row is None:
            b = step.ctx.batch_size
            row = step.rows[(k, n_model)] = self.times.row(step.bucket, b, step.ctx_len, k, n_model, self.cfg.gamma_max)
        return row

    def _play(self, step: _Batch, cand: _Candidate) -> Dict[int, Arm]:
        plan, picks, seqs = cand.plan, cand.picks, step.ctx.sequences
        if plan.gamma == 0 or not plan.keep:
            return {}
        kept = [(v.seq_id, i) for i, v in enumerate(seqs) if i in plan.keep]
        self._drafting = _Drafting(len(seqs), step.bucket, step.ctx_len, plan.n_model, cand.amortised, plan.gamma,
                                   plan.expected, plan.n_tokens, {s: picks.alphas[i] for s, i in kept},
                                   {s: picks.drafters[i] for s, i in kept})
        arms = {d: Arm(d, plan.gamma) for d in {picks.drafters[i] for _, i in kept}}  # immutable: shared
        return {s: arms[picks.drafters[i]] for s, i in kept}

    def speculates_at(self, batch_size: int, *, queue_len: int = 0, kv_free_blocks: int = 0,
                      kv_total_blocks: int = 0) -> bool:
        """Whether an iteration of `batch_size` sequences should speculate at all (asked before an
        engine that pads drafts schedules it, `Policy.speculates_at`): some gamma >= 1 beats plain
        decoding in expected goodput, the whole batch drafting with one usable drafter at its
        global alpha, at the mean context and SLO of the latest step decided, with the step times
        as corrected so far (a padded profile: T(batch, 1 + gamma)). No optimism: exploring is
        `decide`'s, which a probe lets run after `probe_every` "no"s in a row for this batch-size
        bucket. It learns nothing (no RNG; the probe count is its only state); a few look-ups."""
        c = self.cfg
        if batch_size < 1:
            return False
        if kv_pressure(queue_len, kv_free_blocks, kv_total_blocks, c.tau_low_frac):
            return False  # `decide` would draft for no sequence
        bucket = bucket_of(batch_size)
        if self._pays(batch_size, bucket):
            self._declined[bucket] = 0
            return True
        declined = self._declined[bucket] = self._declined.get(bucket, 0) + 1
        if c.probe_every and declined >= c.probe_every:
            self._declined[bucket] = 0
            self._rest.left = 0  # a probe is for planning: the "no"s before it were the rest
            return True
        return False

    def _pays(self, batch_size: int, bucket: int) -> bool:
        c, seen = self.cfg, self._seen
        for d in seen.usable:
            n_model = batch_size if self.model_drafters.get(d, False) else 0
            row = self.times.row(bucket, batch_size, seen.ctx_len, batch_size, n_model, c.gamma_max)
            if speculation_pays(self.acceptance.global_alpha(d), row, seen.slo):
                return True
        return False

    def continue_drafting(self, ctx: StepContext, seq_id: int, confidences: list) -> bool:
        """Drafting depth (AdaSpec's predict-execute-correct, with our model): the s tokens
        drafted so far survive with probability C_s = prod q (the drafter's own
        confidences), so E_i(s) = 1 + sum_{j<=s} C_j; one more token adds C_s * alpha_d (the
        drafter's global alpha: one draft position tells little about the next) and costs
        one more sub-step. Continue while that raises the step's goodput,
        E(s+1)/T(s+1) > E(s)/T(s), up to the planned gamma."""
        st = self._drafting
        s = len(confidences)
        if st is None or seq_id not in st.alphas:
            return True
        if s >= st.gamma:
            return False
        a_next = self.acceptance.global_alpha(st.drafters[seq_id])
        c, e_i = 1.0, 1.0
        for q in confidences:
            c *= q
            e_i += c
        e_rest = st.expected - expected_tokens(st.alphas[seq_id], st.gamma)  # the others, at their plan

        def t(k: int) -> float:  # at B > 1 the other sequences keep the batch drafting to gamma
            return self.times.step_time(st.bucket, st.ctx_len, st.n_tokens - st.gamma + k,
                                        k if st.batch == 1 else st.gamma, st.n_model, st.batch) + st.amortised

        return (e_rest + e_i + c * a_next) / t(s + 1) > (e_rest + e_i) / t(s)

    # -- learning -------------------------------------------------------------
    def observe(self, outcome: StepOutcome) -> None:
        """Learns from the outcome alone: the planned arms, what was drafted and the step's
        context are all in it (a replayed trace teaches exactly what the live step did)."""
        ctx = outcome.context
        if ctx is not None:
            self.model_drafters.update((d.name, d.is_model) for d in ctx.drafters)
        is_model = self.model_drafters
        acc = self.acceptance
        looked = {v.seq_id for v in ctx.sequences if v.available is not None} if ctx is not None else ()
        for s in outcome.sequences:
            evidence = [e for e in s.shadow if acc.knows(e[0])]
            if acc.knows(s.drafter):
                d, g = _planned(s)
                # Without lookahead a model-free drafter proposes fewer tokens, or none, when it
                # has no continuation: those count as a failed trial, or alpha (and with it the
                # value of speculating) would be that of the sequences that happened to match.
                # With lookahead the plan only drafts where a draft is ready, so alpha is the
                # rate given a draft. A model drafter's short draft is its own confidence stop
                # (continue_drafting), not a failure.
                free_cut = d is not None and g > 0 and not is_model.get(d, False) and s.seq_id not in looked
                succ, trials = acceptance_trials(s, g if free_cut else s.gamma)
                if trials:
                    evidence.append((s.drafter, succ, trials))
            if evidence:
                acc.observe_step(s.seq_id, evidence)
        self._learn_time(outcome, is_model)

    def _learn_time(self, outcome: StepOutcome, is_model: Dict[str, bool]) -> None:
        """The observed/profiled ratio of the step as it was planned, or, when drafting
        stopped early, as it was played; without the catch-up (priced separately)."""
        ctx, seqs = outcome.context, outcome.sequences
        b = ctx.batch_size if ctx is not None else outcome.batch_size
        if b == 0 or outcome.total_time_s <= 0:
            return
        views = ctx.sequences if ctx is not None else seqs
        ctx_len = sum([v.context_len for v in views]) / b
        gamma = n_model = n_tok = l_max = played = played_tok = 0
        for s in seqs:
            d, g = _planned(s)
            if g > gamma:
                gamma = g
            n_tok += g
            if s.gamma > played:
                played = s.gamma
            played_tok += s.gamma
            if d is not None and g > 0 and is_model.get(d, False):
                n_model += 1
                l_max = max(l_max, s.catch_up)
        kind = kind_of(gamma, n_model)
        bucket = bucket_of(b)
        if played == gamma:
            profiled: Optional[float] = self.times.profiled(ctx_len, b + n_tok, gamma, n_model, b)
        elif played == 0:
            kind, gamma, profiled = "none", 0, None
        else:  # drafting stopped early (continue_drafting): the profile of what was played
            gamma, profiled = played, self.times.profiled(ctx_len, b + played_tok, played, n_model, b)
        if profiled:
            # the catch-up the step paid: its model-drafted sequences' (the plan priced those it
            # picked for the model drafter before elimination, which the outcome does not list)
            catch_up = self.c_switch(l_max, b) if n_model else 0.0
            self.times.learn(bucket, kind, gamma, max(outcome.total_time_s - catch_up, 0.0) / profiled)
        counts = self.pulls.setdefault(bucket, [0] * (self.cfg.gamma_max + 1))
        if gamma >= len(counts):  # a trace recorded with a longer gamma_max
            counts.extend([0] * (gamma + 1 - len(counts)))
        counts[gamma] += 1

    def on_request_end(self, seq_id: int) -> None:
        self.acceptance.forget(seq_id)
