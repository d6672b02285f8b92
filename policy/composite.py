"""`composite`: our policy — one decision over the joint arm (drafter, gamma) per
sequence, with batch size, KV headroom, SLO and drafter residency as context.

Reward: measured goodput, emitted tokens / step wall time (`rewards.tokens_per_second`),
decomposed into the two things that generalise across arms:
* acceptance alpha per drafter (geometric model, successes/trials from
  `rewards.acceptance_trials`): a slowly discounted global estimate per drafter
  plus a fast-discounted estimate per sequence shrunk towards it, so one
  sequence's evidence serves every gamma, and drift inside a request is
  followed within a few steps;
* step time T(B, kind, gamma): the offline profile (AdaSpec's tables, CPU-shaped
  default) corrected online by a discounted ratio observed/profiled per
  (batch-size bucket, drafter kind, gamma) — nearest observed gamma for unseen ones.
Each step, per sequence, the drafter with the best optimistic alpha (hysteresis
margin against flapping); where that is a model drafter, the plan below is also
made with the best model-free drafters instead, and the plan worth more is played
(the model one at its optimistic goodput, so it gets tried; its draft steps and
the catch-up C_switch, amortised over `switch_amortise_steps`, priced). Plan:
gamma = argmax over 0..gamma_max of
  G(gamma) = sum_i E(alpha_i, gamma) / T(gamma) * (1 + c / sqrt(1 + n_{bucket,gamma}))
(optimism decaying with counts; gamma = 0 when no arm beats plain decoding),
subject to the TPOT SLO as in AdaSpec: predicted step time <= tpot_slo_s (a step may
emit one token per sequence), plain decoding when nothing meets it; then sequences whose expected
gain does not pay for their verify tokens drop to gamma = 0 (AdaSpec-style
elimination with the geometric model). Drafting depth (AdaSpec's predict-execute-
correct, with our model — `continue_drafting`): between a model drafter's sub-steps the
tokens drafted so far survive with probability C_s = prod q (the drafter's own
confidences) and one more token adds C_s * alpha_d (the drafter's global alpha)
expected tokens; drafting continues while that raises E/T. A lone sequence (B = 1)
with a model drafter plans gamma_max and lets this rule stop it (`dynamic_depth`),
since a longer plan costs nothing when it stops early; the time ratio is then learned
for the depth actually played. KV headroom: while the queue waits and
free blocks are under tau_low, speculation is off; model drafters are parked
and reloaded with Nightjar's hysteresis trigger (`elastic.ElasticMemory`);
model-free drafters stay available while a model drafter is parked.
Why it should dominate: Nightjar/BanditSpec learn one number per (B, gamma)
arm from scratch; SmartSpec/AdaSpec trust a model; MetaSD/DSDE ignore cost.
Sharing alpha across gammas and T across drafters needs far fewer samples,
per-sequence drafters win on mixed workloads, the profile-seeded time
model knows batch-size regimes before visiting them, and the real confidences
let a single sequence stop drafting as soon as the next token is not worth it.
Per-step work is shared where the answer is the same for many sequences (one
global alpha per drafter, one drafter pick for all sequences without evidence of
their own, one E(alpha, gamma) row per distinct alpha, memoised time corrections).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np

from .base import Policy, bucket_of, register
from .elastic import ElasticMemory, tau_low_blocks
from .goodput import expected_tokens
from .params import in_range, require
from .profiles import StepTimeProfile, SwitchCostTable
from .rewards import acceptance_trials
from .types import Arm, Decision, StepContext, StepOutcome


class _DraftState(NamedTuple):
    """This step's plan, as `continue_drafting` and `observe` read it."""
    batch: int
    ctx_len: float
    n_model: int
    amortised: float  # catch-up cost per step, when a model drafter drafts
    gamma: int
    expected: float  # expected emitted tokens of the whole batch
    n_tokens: int  # tokens the target verifies
    alphas: Dict[int, float]  # drafting sequences -> alpha


class _Plan(NamedTuple):
    """A candidate plan for the batch (`Composite._plan_for`); `Composite._play` turns the
    chosen one into arms."""
    gamma: int  # 0: plain decoding
    keep: set  # the sequences that draft
    drafters: list  # per sequence of the batch
    alphas: list
    expected: float  # expected emitted tokens of the whole batch
    n_tokens: int
    n_model: int
    catch_up: float
    amortised: float
    index: float  # its goodput (optimistic for a model plan), to choose between plans


def shrunk_rate(s: float, n: float, prior: float, strength: float) -> float:
    """(s + m * prior) / (n + m): a rate estimate shrunk towards `prior`.

    >>> shrunk_rate(3, 4, 0.5, 4)
    0.625
    """
    return (s + strength * prior) / (n + strength)


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

    def check(self, policy: str) -> None:
        require(len(self.drafters) >= 1, policy, "drafters must be a non-empty list")
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
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


@register
class Composite(Policy):
    name = "composite"
    Config = CompositeConfig

    def __init__(self, config=None, *, profile: Optional[StepTimeProfile] = None,
                 switch_cost: Optional[SwitchCostTable] = None, **kw):
        super().__init__(config, **kw)
        c = self.cfg
        self.profile = profile or StepTimeProfile.load(c.profile_path)
        self.c_switch = switch_cost or SwitchCostTable.load(c.switch_cost_path)
        self.glob: Dict[str, list] = {d: [0.0, 0.0] for d in c.drafters}  # drafter -> [succ, trials]
        self.seq: Dict[int, Dict[str, list]] = {}
        self.ratio: Dict[tuple, list] = {}  # (bucket, kind, gamma) -> [observed/profiled, n]
        self.pulls: Dict[tuple, int] = {}  # (bucket, gamma) -> steps played
        self.memory = ElasticMemory(c.tau_low_frac, c.t_persist)
        self._prior_cache: Dict[tuple, float] = {}
        self._pending: Optional[tuple] = None  # (bucket, kind, gamma, profiled time, catch-up, B, ctx, n_model)
        self._plan: Optional[_DraftState] = None  # this step's plan, for continue_drafting
        self._plan_drafter: Dict[int, str] = {}
        self._is_model: Dict[str, bool] = {}
        self._fresh: Dict[tuple, Tuple[str, float, float]] = {}  # per step: pick of sequences without own evidence
        self._rows: Dict[tuple, list] = {}  # per step: `_time_row`s
        self._arms: Dict[tuple, Arm] = {}
        self._nearest: Dict[tuple, Dict[int, tuple]] = {}  # (bucket, kind) -> {gamma: `_nearest_seen`}
        self._by_kind: Dict[tuple, Dict[int, list]] = {}  # (bucket, kind) -> {gamma: self.ratio entry}
        self._bucket_pulls: Dict[int, int] = {}
        self._log_last = (-1, 0.0)

    # -- acceptance -----------------------------------------------------------
    def _glob_alpha(self, drafter: str) -> float:
        g = self.glob[drafter]
        return shrunk_rate(g[0], g[1], self.cfg.prior_alpha, self.cfg.shrink)

    def alpha(self, seq_id: int, drafter: str) -> float:
        a_glob = self._glob_alpha(drafter)
        s = self.seq.get(seq_id, {}).get(drafter)
        return a_glob if s is None else shrunk_rate(s[0], s[1], a_glob, self.cfg.shrink)

    def _drafter_for(self, v, usable, a_glob: Dict[str, float]) -> Tuple[str, float, float]:
        """Per-sequence drafter -> (drafter, alpha, optimistic alpha): the best optimistic
        alpha + explore / sqrt(1 + n_i,d), with a hysteresis margin before leaving the
        drafter the sequence used last. `a_glob`: this step's global alpha per drafter
        (computed once per step)."""
        per = self.seq.get(v.seq_id)
        if not per:  # no evidence of its own yet: the same answer as every such sequence
            return self._fresh_pick(v.last_drafter, usable, a_glob)
        m, explore = self.cfg.shrink, self.cfg.explore
        alpha, opt = {}, {}
        for d in usable:
            st = per.get(d)
            if st is None:
                alpha[d] = a_glob[d]
                opt[d] = a_glob[d] + explore / math.sqrt(1.0)
            else:
                alpha[d] = shrunk_rate(st[0], st[1], a_glob[d], m)
                opt[d] = alpha[d] + explore / math.sqrt(1.0 + st[1])
        if len(usable) == 1:
            return usable[0], alpha[usable[0]], opt[usable[0]]
        best = max(usable, key=opt.__getitem__)
        if v.last_drafter in usable and v.last_drafter != best:
            if opt[best] - opt[v.last_drafter] < self.cfg.switch_margin:
                best = v.last_drafter
        return best, alpha[best], opt[best]

    def _fresh_pick(self, last: Optional[str], usable, a_glob) -> Tuple[str, float, float]:
        """`_drafter_for` of a sequence without per-sequence evidence, memoised per step."""
        key = (last, tuple(usable))
        hit = self._fresh.get(key)
        if hit is None:
            explore = self.cfg.explore
            opt = {d: a_glob[d] + explore / math.sqrt(1.0) for d in usable}
            best = usable[0] if len(usable) == 1 else max(usable, key=opt.__getitem__)
            if len(usable) > 1 and last in usable and last != best and opt[best] - opt[last] < self.cfg.switch_margin:
                best = last
            hit = self._fresh[key] = (best, a_glob[best], opt[best])
        return hit

    # -- step time --------------------------------------------------------------
    def _profiled(self, batch: int, ctx_len: float, n_tokens: int, gamma: int, n_model: int) -> float:
        """Profile time of one step: target over n_tokens (+ the model drafter's gamma
        sub-steps over n_model sequences). Memoised: the tables never change."""
        key = (int(ctx_len) // 128, n_tokens, gamma, n_model)
        t = self._prior_cache.get(key)
        if t is None:
            t = self.profile.target(ctx_len + gamma / 2, n_tokens)
            if n_model and gamma:
                t += gamma * self.profile.draft(ctx_len, n_model) + self.profile.draft_overhead(n_model)
            if len(self._prior_cache) > 50_000:
                self._prior_cache.clear()
            self._prior_cache[key] = t
        return t

    def _correction(self, bucket: int, kind: str, gamma: int) -> float:
        """observed/profiled time ratio; unseen gammas borrow the nearest seen one of
        the same kind, and thin evidence is shrunk towards 1 (the profile)."""
        per = self._nearest.setdefault((bucket, kind), {})
        near = per.get(gamma)
        if near is None:
            near = per[gamma] = self._nearest_seen(bucket, kind, gamma)
        if not near:
            return 1.0
        ratio, n = near[0][1] if len(near) == 1 else min((v[0], v[1], g) for g, v in near)[:2]
        return (ratio * n + 1.0) / (n + 1.0)

    def _nearest_seen(self, bucket: int, kind: str, gamma: int) -> tuple:
        """The seen gammas of this kind nearest to `gamma`, with their (live) ratio entries:
        ((g, [ratio, n]), ...); two when equally near (the lower ratio is read, as min() of
        (distance, ratio, n, g) did). Changes only when a new gamma is seen."""
        seen = self._by_kind.get((bucket, kind), {})
        if not seen:
            return ()
        d = min(abs(g - gamma) for g in seen)
        return tuple((g, v) for g, v in seen.items() if abs(g - gamma) == d)

    def step_time(self, batch: int, ctx_len: float, n_tokens: int, gamma: int, n_model: int) -> float:
        kind = "none" if gamma == 0 else ("model" if n_model else "free")
        return (self._profiled(batch, ctx_len, n_tokens, gamma, n_model)
                * self._correction(bucket_of(batch), kind, gamma))

    def _time_row(self, batch: int, ctx_len: float, k: int, n_model: int) -> list:
        """[step_time with k of the batch's sequences drafting g tokens, for g in 0..gamma_max],
        memoised for the step: the model plan and its optimistic goodput read the same row."""
        key = (k, n_model)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = [self.step_time(batch, ctx_len, batch + k * g, g, n_model)
                                     for g in range(self.cfg.gamma_max + 1)]
        return row

    # -- decision ---------------------------------------------------------------
    def decide(self, ctx: StepContext) -> Decision:
        c, b = self.cfg, ctx.batch_size
        self._pending = None
        self._plan = None
        if b == 0:
            return Decision(arms={})
        info = {d.name: d for d in ctx.drafters}
        usable = [d for d in c.drafters if d in info and info[d].resident]
        tau = tau_low_blocks(ctx, c.tau_low_frac)
        pressure = ctx.queue_len > 0 and ctx.kv_free_blocks < tau
        ctx_len = sum([v.context_len for v in ctx.sequences]) / b
        arms, n_model, catch_up = {}, 0, 0.0
        if usable and not pressure:
            arms, n_model, catch_up = self._choose(ctx, ctx_len, usable, info)
        gamma = max((a.gamma for a in arms.values()), default=0)
        actions = self.memory.update(ctx, sd_enabled=gamma > 0) if c.elastic else []
        n_tok = b + sum(a.gamma for a in arms.values())
        kind = "none" if gamma == 0 else ("model" if n_model else "free")
        self._pending = (bucket_of(b), kind, gamma, self._profiled(b, ctx_len, n_tok, gamma, n_model), catch_up,
                         b, ctx_len, n_model)
        return Decision(arms=arms, memory_actions=tuple(actions))

    def _choose(self, ctx: StepContext, ctx_len: float, usable, info):
        """The joint (drafter, gamma) pick, cost-aware. Each sequence's drafter goes by
        optimistic alpha; when that picks a model drafter for some sequence and model-free
        drafters exist, the same picks with each model drafter replaced by the sequence's
        best model-free one are planned too, and the plan worth more is played: the
        model-free plan at its expected goodput against the model plan at its optimistic
        goodput (draft steps and catch-up priced). Comparing expected goodputs alone would
        never try a model drafter (at equal alphas the model-free plan costs less); the
        optimism, which shrinks as the sequence plays the drafter, is what explores it."""
        self._fresh, self._rows = {}, {}
        is_model = self._is_model = {d: info[d].is_model for d in usable}
        free = [d for d in usable if not is_model[d]]
        picks = self._picks(ctx, usable)
        if not free or not any(is_model[d] for d in picks[3]):
            plan = self._plan_for(ctx, ctx_len, *picks, explore_model=False)
        else:
            plan = self._plan_for(ctx, ctx_len, *picks, explore_model=True)
            alt = self._plan_for(ctx, ctx_len, *self._model_free(ctx, picks, free), explore_model=False)
            if alt.index > plan.index:
                plan = alt
        return self._play(ctx, ctx_len, plan)

    def _play(self, ctx: StepContext, ctx_len: float, plan: _Plan):
        """-> (arms, n_model, catch-up) of the chosen plan; keeps its state for
        continue_drafting and observe."""
        if plan.gamma == 0:
            self._plan, self._plan_drafter = None, {}
            return {}, 0, 0.0
        seqs, keep, arm = ctx.sequences, plan.keep, self._arm
        arms = {v.seq_id: arm(d, plan.gamma) for v, d in zip(seqs, plan.drafters) if v.seq_id in keep}
        self._plan = _DraftState(ctx.batch_size, ctx_len, plan.n_model, plan.amortised * (plan.n_model > 0),
                                 plan.gamma, plan.expected, plan.n_tokens,
                                 {v.seq_id: a for v, a in zip(seqs, plan.alphas) if v.seq_id in keep})
        self._plan_drafter = {v.seq_id: d for v, d in zip(seqs, plan.drafters) if v.seq_id in keep}
        return arms, plan.n_model, plan.catch_up if plan.n_model else 0.0

    def _picks(self, ctx: StepContext, usable):
        """Per sequence (drafter, alpha, optimistic alpha) -> (drafters, alphas, optimistic
        alphas, distinct drafters)."""
        b, seqs, stats = ctx.batch_size, ctx.sequences, self.seq
        a_glob = {d: self._glob_alpha(d) for d in usable}
        if stats and any(v.seq_id in stats for v in seqs):
            picks = [self._drafter_for(v, usable, a_glob) for v in seqs]
        else:  # no sequence has evidence of its own: one answer per last-used drafter
            fresh = {last: self._fresh_pick(last, usable, a_glob) for last in {v.last_drafter for v in seqs}}
            picks = [fresh[v.last_drafter] for v in seqs] if len(fresh) > 1 else None
        if picks is None:  # one pick for the whole batch: no per-sequence lists to build
            ((d, a, o),) = fresh.values()
            return [d] * b, [a] * b, [o] * b, (d,)
        drafters = [p[0] for p in picks]
        return drafters, [p[1] for p in picks], [p[2] for p in picks], set(drafters)

    def _model_free(self, ctx: StepContext, picks, free):
        """`picks` with each model-drafter pick replaced by the sequence's best model-free
        drafter: the same as picking among the model-free drafters only (a model-free pick
        already is the best of them, hysteresis included), without redoing those."""
        drafters, alphas, opts, _ = picks
        is_model = self._is_model
        a_glob = {d: self._glob_alpha(d) for d in free}
        out = [self._drafter_for(v, free, a_glob) if is_model[d] else (d, a, o)
               for v, d, a, o in zip(ctx.sequences, drafters, alphas, opts)]
        new = [p[0] for p in out]
        return new, [p[1] for p in out], [p[2] for p in out], set(new)

    def _plan_for(self, ctx: StepContext, ctx_len: float, drafters, alphas, opts, names,
                  explore_model: bool) -> _Plan:
        """gamma (by goodput with optimism on gamma) and the sequences that draft, for
        these drafter picks; `_Plan.index` is the plan's expected goodput, or with
        `explore_model` its optimistic one (`_optimistic_goodput`)."""
        c, b, seqs = self.cfg, ctx.batch_size, ctx.sequences
        bucket = bucket_of(b)
        is_model = self._is_model
        if len(names) == 1:  # one drafter for the whole batch (the usual case)
            (d,) = names
            model = [is_model[d]] * b
            n_model = b if is_model[d] else 0
            l_max = max([v.uncaught_tokens.get(d, 0) for v in seqs]) if n_model else 0
        else:
            model = [is_model[d] for d in drafters]
            n_model = sum(model)
            l_max = max([v.uncaught_tokens.get(d, 0) for v, d, m in zip(seqs, drafters, model) if m], default=0)
        catch_up = self.c_switch(l_max, b) if n_model else 0.0
        amortised = catch_up / c.switch_amortise_steps
        total_pulls = self._bucket_pulls.get(bucket, 0) + 1  # sum of self.pulls over this bucket, + 1
        t0 = self.step_time(b, ctx_len, b, 0, 0)
        best = (0, b / t0 * (1.0 + self._bonus(bucket, 0, total_pulls)), t0, float(b))
        fallback = (0, t0, t0, float(b))
        slo = ctx.tpot_slo_s
        if slo is not None and t0 > slo:
            best = (0, -1.0, t0, float(b))
        e_sum = self._expected_sums(alphas, c.gamma_max)  # [g] sum_i E(alpha_i, g)
        times = self._time_row(b, ctx_len, b, n_model)
        for g in range(1, c.gamma_max + 1):
            t = times[g] + amortised
            e = e_sum[g]
            if slo is not None and t > slo:
                continue
            val = e / t * (1.0 + self._bonus(bucket, g, total_pulls))
            if val > best[1]:
                best = (g, val, t, e)
        g, val, t_full, e_tot = best if best[1] >= 0 else fallback
        if g == 0:
            return _Plan(0, set(), drafters, alphas, float(b), b, 0, 0.0, 0.0, b / t0)
        # per-sequence elimination: drop low-alpha sequences while goodput rises
        keep = {v.seq_id for v in seqs}
        n_tok = b * (g + 1)
        for v, a, m in sorted(zip(seqs, alphas, model), key=lambda p: p[1]):
            e_new = e_tot - (expected_tokens(a, g) - 1.0)
            n_m = n_model - m
            t_new = self.step_time(b, ctx_len, n_tok - g, g if len(keep) > 1 else 0, n_m) + amortised * (n_m > 0)
            if e_new / t_new <= e_tot / t_full:
                break
            keep.discard(v.seq_id)
            e_tot, t_full, n_tok, n_model = e_new, t_new, n_tok - g, n_m
            if not keep:
                break
        index = e_tot / t_full
        if explore_model and n_model:
            index = self._optimistic_goodput(ctx, ctx_len, drafters, alphas, opts, keep, n_model, amortised)
        if b == 1 and n_model and c.dynamic_depth:
            # a lone model-drafted sequence: draft up to gamma_max and let continue_drafting
            # stop on the real confidences (a longer plan costs nothing if it stops early)
            a1 = alphas[0]
            t_max = self.step_time(1, ctx_len, 1 + c.gamma_max, c.gamma_max, 1) + amortised
            if slo is None or t_max <= slo:
                g, e_tot, n_tok = c.gamma_max, expected_tokens(a1, c.gamma_max), 1 + c.gamma_max
        return _Plan(g, keep, drafters, alphas, e_tot, n_tok, n_model, catch_up, amortised, index)

    def _optimistic_goodput(self, ctx, ctx_len, drafters, alphas, opts, keep, n_model, amortised) -> float:
        """Best goodput over gamma of a plan's drafting sequences with its model-drafted ones
        at their optimistic alphas: the index a plan with a model drafter competes with
        (a model drafter costs draft steps and a catch-up; at its expected alpha it would
        never be tried where a model-free drafter pays at the prior)."""
        b, is_model = ctx.batch_size, self._is_model
        kept = [min(o, 0.99) if is_model[d] else a
                for v, d, a, o in zip(ctx.sequences, drafters, alphas, opts) if v.seq_id in keep]
        k, slo = len(kept), ctx.tpot_slo_s
        e_sum = self._expected_sums(kept, self.cfg.gamma_max)
        best, times = 0.0, self._time_row(b, ctx_len, k, n_model)
        for g in range(1, self.cfg.gamma_max + 1):
            t = times[g] + amortised
            if slo is None or t <= slo:
                best = max(best, (e_sum[g] + b - k) / t)
        return best

    def continue_drafting(self, ctx: StepContext, seq_id: int, confidences: list) -> bool:
        """Between a model drafter's sub-steps (AdaSpec's predict-execute-correct with our
        model): the s tokens drafted so far survive with probability C_s = prod q (the
        drafter's own confidences), so E_i(s) = 1 + sum_{j<=s} C_j; one more token adds
        C_s * alpha_d (the drafter's global alpha: one draft position tells little about
        the next) and costs one more sub-step. Continue while that raises the step's
        goodput, E(s+1)/T(s+1) > E(s)/T(s), up to the planned gamma."""
        plan = self._plan
        s = len(confidences)
        if plan is None or seq_id not in plan.alphas:
            return True
        b, ctx_len, n_model, amortised, g, e_tot, n_tok, alphas = plan
        if s >= g:
            return False
        a = alphas[seq_id]
        a_next = self._glob_alpha(self._plan_drafter[seq_id])
        c, e_i = 1.0, 1.0
        for q in confidences:
            c *= q
            e_i += c
        e_rest = e_tot - expected_tokens(a, g)  # the other sequences, at their plan

        def t(k: int) -> float:  # at B > 1 the other sequences keep the batch drafting to g
            return self.step_time(b, ctx_len, n_tok - g + k, k if b == 1 else g, n_model) + amortised

        return (e_rest + e_i + c * a_next) / t(s + 1) > (e_rest + e_i) / t(s)

    @staticmethod
    def _expected_sums(alphas, gamma_max: int) -> list:
        """[sum_i E(alpha_i, g) for g in 0..gamma_max], summed in sequence order as before;
        E is computed once per distinct alpha (many sequences share the global one)."""
        table = {a: [expected_tokens(a, g) for g in range(gamma_max + 1)] for a in set(alphas)}
        if len(table) == 1:
            (row,) = table.values()
            return [sum([x] * len(alphas)) for x in row]
        rows = np.array([table[a] for a in alphas])  # [B, G+1]; axis-0 sums add row after row
        return rows.sum(axis=0).tolist()

    def _arm(self, drafter: str, gamma: int) -> Arm:
        a = self._arms.get((drafter, gamma))
        if a is None:
            a = self._arms[(drafter, gamma)] = Arm(drafter, gamma)
        return a

    def _bonus(self, bucket: int, gamma: int, total: int) -> float:
        """Optimism for rarely played gammas in this bucket, decaying with counts:
        optimism * sqrt(ln(total + 1) / (1 + n_{bucket,gamma}))."""
        n = self.pulls.get((bucket, gamma), 0)
        if self._log_last[0] != total:  # one ln per step, not one per gamma
            self._log_last = (total, math.log(total + 1))
        log_t = self._log_last[1]
        return self.cfg.optimism * math.sqrt(log_t / (1 + n))

    # -- learning -------------------------------------------------------------
    def observe(self, outcome: StepOutcome) -> None:
        c = self.cfg
        planned = self._planned_gammas()
        for s in outcome.sequences:
            if s.drafter not in self.glob:
                continue
            succ, trials = acceptance_trials(s, planned.get(s.seq_id, s.gamma))
            if trials == 0:
                continue
            g = self.glob[s.drafter]
            g[0], g[1] = g[0] * c.global_discount + succ, g[1] * c.global_discount + trials
            per = self.seq.setdefault(s.seq_id, {})
            for d, st in per.items():  # the sequence moved on: discount all its drafters
                st[0] *= c.seq_discount
                st[1] *= c.seq_discount
            st = per.setdefault(s.drafter, [0.0, 0.0])
            st[0] += succ
            st[1] += trials
        if self._pending is None or outcome.total_time_s <= 0:
            return
        bucket, kind, gamma, profiled, catch_up, b, ctx_len, n_model = self._pending
        self._pending = None
        played = max([s.gamma for s in outcome.sequences], default=0)
        if played != gamma:
            if played == 0:
                kind, gamma, profiled = "none", 0, None
            else:  # drafting stopped early (continue_drafting): the profile of what was played
                gamma = played
                profiled = self._profiled(b, ctx_len, b + sum(s.gamma for s in outcome.sequences), played, n_model)
        if profiled:  # learn the ratio without the one-off catch-up (priced separately)
            obs = max(outcome.total_time_s - catch_up, 0.0) / profiled
            new = (bucket, kind, gamma) not in self.ratio
            r = self.ratio.setdefault((bucket, kind, gamma), [obs, 0])
            self._by_kind.setdefault((bucket, kind), {})[gamma] = r
            r[0] += c.time_ema * (obs - r[0])
            r[1] += 1
            if new:  # it may be the nearest seen gamma for any other
                self._nearest.pop((bucket, kind), None)
        self.pulls[(bucket, gamma)] = self.pulls.get((bucket, gamma), 0) + 1
        self._bucket_pulls[bucket] = self._bucket_pulls.get(bucket, 0) + 1

    def _planned_gammas(self) -> Dict[int, int]:
        """The gamma this step planned for each sequence a model-free drafter drafted. Such a
        drafter proposes fewer tokens, or none, when its store has no continuation: the tokens
        it did not propose count as a failed trial, or alpha (and with it the value of
        speculating) would be that of the sequences that happened to match. A model drafter's
        short draft is its own confidence stop (continue_drafting), not a failure."""
        if self._plan is None:
            return {}
        g = self._plan.gamma
        return {sid: g for sid, d in self._plan_drafter.items() if not self._is_model.get(d, False)}

    def on_request_end(self, seq_id: int) -> None:
        self.seq.pop(seq_id, None)
