"""`adaspec`: AdaSpec (paper 001; follows github cerebellumking/AdaSpec with fixes).

Reward / model: no bandit; a goodput model G = E / T with E from draft
confidences (q of the drafter's own tokens) and T from an offline step-time
profile (`profiles.StepTimeProfile`; CPU-shaped default when `profile_path` is
empty). Three decisions:
1. skip SD for the step if G(1) with the running mean confidence c̄ <= G(0);
2. predict-execute-correct (`continue_drafting`): before another draft sub-step
   predict G with C·c̄ and stop if it would drop; after a sub-step recompute G
   with the real confidences and stop if it fell;
3. confidence-prior elimination (`verify_lengths`): per-request lengths k_i by
   removing the lowest-cumulative-confidence tail token while G does not drop.
TPOT SLO: any arm whose predicted step time exceeds ctx.tpot_slo_s has G = -1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from .base import Policy, is_model_drafter, register, resident_names
from .goodput import (adaspec_step_time, cumulative_confidence, eliminate, expected_emitted,
                      expected_emitted_uniform, slo_goodput)
from .params import in_range
from .profiles import StepTimeProfile
from .types import Arm, Decision, StepContext, StepOutcome


@dataclass(frozen=True)
class AdaSpecConfig:
    drafter: str = "ngram"  # the server's always-available drafter
    gamma_max: int = 8
    initial_confidence: float = 0.6
    profile_path: Optional[str] = None
    eliminate: bool = True

    def check(self, policy: str) -> None:
        in_range(policy, "gamma_max", self.gamma_max, 1, 64)
        in_range(policy, "initial_confidence", self.initial_confidence, 0.0, 1.0)


@register
class AdaSpec(Policy):
    name = "adaspec"
    Config = AdaSpecConfig

    def __init__(self, config=None, *, profile: Optional[StepTimeProfile] = None, **kw):
        super().__init__(config, **kw)
        self.profile = profile or StepTimeProfile.load(self.cfg.profile_path)
        self.c_bar = self.cfg.initial_confidence
        self._n_conf = 0
        self._drafts: Dict[int, List[float]] = {}  # seq_id -> confidences drafted this step
        self._arm = Arm(self.cfg.drafter, self.cfg.gamma_max)

    # -- the goodput model --------------------------------------------------
    def _goodput(self, ctx: StepContext, cum: Mapping[int, List[float]], lengths: Mapping[int, int],
                 draft_steps: int) -> float:
        b = ctx.batch_size
        s = sum(v.context_len for v in ctx.sequences)
        n = sum(lengths.get(v.seq_id, 0) + 1 for v in ctx.sequences)
        k = max(lengths.values(), default=0)
        if not is_model_drafter(ctx, self.cfg.drafter):  # model-free drafting costs no draft steps
            draft_steps = 0
        t = adaspec_step_time(self.profile, k, b, s, draft_steps=draft_steps, n_tokens=n)
        e = expected_emitted([cum.get(v.seq_id, []) for v in ctx.sequences],
                             [lengths.get(v.seq_id, 0) for v in ctx.sequences])
        return slo_goodput(e, t, ctx.tpot_slo_s)

    def _uniform(self, b: int, s: int, k: int, tpot_slo_s: Optional[float], model: bool) -> float:
        """G with every one of the b sequences drafting k tokens at confidence c̄
        (`_goodput` with identical per-sequence inputs, computed once)."""
        t = adaspec_step_time(self.profile, k, b, s, draft_steps=k if model else 0, n_tokens=(k + 1) * b)
        e = expected_emitted_uniform(cumulative_confidence([self.c_bar] * k), k, b)
        return slo_goodput(e, t, tpot_slo_s)

    # -- Policy ---------------------------------------------------------------
    def decide(self, ctx: StepContext) -> Decision:
        self._drafts = {}
        if self.cfg.drafter not in resident_names(ctx) or not ctx.sequences:
            return Decision(arms={})
        b, s = ctx.batch_size, sum(v.context_len for v in ctx.sequences)
        model = is_model_drafter(ctx, self.cfg.drafter)
        if self._uniform(b, s, 1, ctx.tpot_slo_s, model) <= self._uniform(b, s, 0, ctx.tpot_slo_s, model):
            return Decision(arms={})
        arm = self._arm
        return Decision(arms={v.seq_id: arm for v in ctx.sequences})

    def _batch_cum(self, ctx: StepContext, depth: int, extra: int = 0) -> Dict[int, List[float]]:
        """Real confidences where drafted, c̄-extrapolated elsewhere, to depth+extra."""
        out = {}
        for v in ctx.sequences:
            p = list(self._drafts.get(v.seq_id, []))[:depth]
            p += [self.c_bar] * (depth + extra - len(p))
            out[v.seq_id] = cumulative_confidence(p)
        return out

    def continue_drafting(self, ctx: StepContext, seq_id: int, confidences: list) -> bool:
        s = len(confidences)
        self._drafts[seq_id] = list(confidences)
        if s >= self.cfg.gamma_max:
            return False
        cum = self._batch_cum(ctx, s)
        g_now = self._goodput(ctx, cum, {i: s for i in cum}, s)
        if s > 1:  # correct: did the last real sub-step lower G?
            g_prev = self._goodput(ctx, cum, {i: s - 1 for i in cum}, s - 1)
            if g_now < g_prev:
                return False
        pred = self._batch_cum(ctx, s, extra=1)  # predict: would one more step raise G?
        return self._goodput(ctx, pred, {i: s + 1 for i in pred}, s + 1) > g_now

    def verify_lengths(self, ctx: StepContext, drafts: Mapping[int, list]) -> Mapping[int, int]:
        if not self.cfg.eliminate:
            return {i: len(p) for i, p in drafts.items()}
        cum = {i: cumulative_confidence(p) for i, p in drafts.items()}
        steps = max((len(p) for p in drafts.values()), default=0)
        return eliminate(cum, lambda ks: self._goodput(ctx, cum, ks, steps))

    def observe(self, outcome: StepOutcome) -> None:
        for s in outcome.sequences:  # c̄: running mean of raw draft confidences
            for q in s.q_draft:
                self._n_conf += 1
                self.c_bar += (q - self.c_bar) / self._n_conf
