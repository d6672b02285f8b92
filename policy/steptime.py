"""Step time T(B, kind, gamma) as the composite policy predicts it (docs/algorithms.md,
`## composite`): the offline profile, corrected online by what steps really took."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .profiles import StepTimeProfile


def kind_of(gamma: int, n_model: int) -> str:
    """Steps whose time the profile gets wrong in the same way share a correction:
    plain decoding, drafting with model-free drafters only, or with a model drafter.

    >>> kind_of(0, 3), kind_of(4, 0), kind_of(4, 1)
    ('none', 'free', 'model')
    """
    return "none" if gamma == 0 else ("model" if n_model else "free")


class StepTimeModel:
    """profile(ctx, tokens, gamma, model sequences) x ratio(bucket, kind, gamma).

    Plain steps: the ratio is a moving average (weight `ema`) of observed / profiled step
    time per batch-size bucket, shrunk towards the profile with thin evidence: (ratio n +
    1) / (n + 1). That is the error every kind shares (a slower host, the driver's own
    per-step work), so a drafting kind's correction is the plain one times its own
    relative ratio, a moving average of observed / (profiled x the plain correction when
    it was observed), per (bucket, kind, gamma), shrunk towards 1 alike. Two independent
    averages would let the host's drift and a few slow plain steps (this 2-core host moves
    10-30% within a minute) make drafting look cheaper exactly when plain decoding's
    estimate is high, and the policy would draft on that noise (chat at 8 sequences,
    session 37: drafting planned at 33 ms against a plain step estimated at 25.9 ms that
    took 20.2). A gamma not yet seen borrows the relative ratio of the nearest seen gamma
    of the same bucket and kind (the lower when two are equally near): drafting one token
    more or less changes the error less than a new regime does; a kind not seen yet takes
    the plain correction.

    >>> m = StepTimeModel(StepTimeProfile.default(), ema=0.5)
    >>> m.correction(1, "free", 4)
    1.0
    >>> m.learn(1, "free", 2, 1.5); m.learn(1, "free", 2, 1.5)   # 1.5 the plain correction (1) seen twice
    >>> m.correction(1, "free", 4), m.correction(1, "model", 2)   # (1.5 * 2 + 1) / 3
    (1.3333333333333333, 1.0)
    >>> m.learn(1, "none", 0, 2.0); m.correction(1, "none", 0), m.correction(1, "model", 2)   # (2 + 1) / 2
    (1.5, 1.5)
    >>> m.correction(1, "free", 2)   # the host's share moves drafting too: 1.5 x 4 / 3
    2.0
    """

    def __init__(self, profile: StepTimeProfile, ema: float):
        self.profile, self.ema = profile, ema
        self.ratio: Dict[tuple, List[float]] = {}  # (bucket, kind, gamma) -> [observed/profiled, n]
        self._by_kind: Dict[tuple, Dict[int, List[float]]] = {}  # (bucket, kind) -> {gamma: ratio entry}
        # (bucket, kind) -> {gamma: its nearest seen gammas' (live) ratio entries}; the set of
        # seen gammas changes rarely, the ratios every step, so the entries are read live
        self._nearest: Dict[tuple, Dict[int, tuple]] = {}
        self._profiled: Dict[tuple, object] = {}  # memo of the profile's answers

    def profiled(self, ctx_len: float, n_tokens: int, gamma: int, n_model: int, batch: Optional[int] = None) -> float:
        """Profile time of one step: the target over n_tokens at the mean context (+ gamma/2,
        the drafts' own positions), plus, when n_model sequences draft with a model
        drafter, its gamma sub-steps and its fixed overhead. With a padded profile and the
        batch size, the target part is T(batch, 1 + gamma) whatever n_tokens says: the engine
        verifies the iteration's gamma on every sequence (gamma 0: a plain step), or
        T(batch, 1 + pad_to) when it pads to a static length (TensorRT-LLM 1.2). An engine that
        does not pad, with a profile by shape: T(batch, 1 + gamma) when every sequence drafts,
        else the cheaper of that and T(batch, 1) + T(drafting ones, gamma) (`target_step`)."""
        p = self.profile
        drafts = bool(n_model and gamma)
        padded = p.padded and batch is not None
        size = ("batch", batch) if padded else (n_tokens, batch)  # what the target's tables read
        key = (p.bucket(ctx_len + gamma / 2), p.bucket(ctx_len) if drafts else -1, size, gamma, n_model)
        t = self._profiled.get(key)  # memoised by what the tables read: the context's buckets
        if t is None:
            ctx = ctx_len + gamma / 2
            t = (p.target_shape(ctx, batch, p.verified_per_seq(gamma)) if padded
                 else p.target_step(ctx, n_tokens, batch, gamma))
            if drafts:
                t += gamma * p.draft(ctx_len, n_model) + p.draft_overhead(n_model)
            self._remember(key, t)
        return t

    def profiled_row(self, ctx_len: float, batch: int, k: int, n_model: int, gamma_max: int) -> List[float]:
        """[`profiled` with k of the batch's sequences drafting g tokens, g = 0..gamma_max],
        memoised whole where the row reads one context bucket (the usual case)."""
        p = self.profile
        lo = p.bucket(ctx_len)
        if p.bucket(ctx_len + gamma_max / 2) != lo:
            return [self.profiled(ctx_len, batch + k * g, g, n_model, batch) for g in range(gamma_max + 1)]
        key = ("row", lo, batch, k, n_model, gamma_max)
        row = self._profiled.get(key)
        if row is None:
            row = [self.profiled(ctx_len, batch + k * g, g, n_model, batch) for g in range(gamma_max + 1)]
            self._remember(key, row)
        return row

    def _remember(self, key: tuple, value) -> None:
        if len(self._profiled) > 50_000:  # bounded; the profile itself never changes
            self._profiled.clear()
        self._profiled[key] = value

    def correction(self, bucket: int, kind: str, gamma: int) -> float:
        per = self._nearest.get((bucket, kind))
        if per is None:
            per = self._nearest[(bucket, kind)] = {}
        near = per.get(gamma)
        if near is None:
            near = per[gamma] = self._nearest_seen(bucket, kind, gamma)
        # the profile's error shared by every kind is what plain steps show; a drafting kind's
        # own ratio is relative to it (`learn`), so both move with the host alike
        base = 1.0 if kind == "none" else self.correction(bucket, "none", 0)
        if not near:
            return base
        ratio, n = near[0][1] if len(near) == 1 else min((v[0], v[1], g) for g, v in near)[:2]
        return base * (ratio * n + 1.0) / (n + 1.0)

    def _nearest_seen(self, bucket: int, kind: str, gamma: int) -> Tuple[tuple, ...]:
        seen = self._by_kind.get((bucket, kind), {})
        if not seen:
            return ()
        d = min(abs(g - gamma) for g in seen)
        return tuple((g, v) for g, v in seen.items() if abs(g - gamma) == d)

    def step_time(self, bucket: int, ctx_len: float, n_tokens: int, gamma: int, n_model: int,
                  batch: Optional[int] = None) -> float:
        """`profiled` (batch: see there) x the correction learned for its bucket, kind and gamma."""
        profiled = self.profiled(ctx_len, n_tokens, gamma, n_model, batch)
        return profiled * self.correction(bucket, kind_of(gamma, n_model), gamma)

    def row(self, bucket: int, batch: int, ctx_len: float, k: int, n_model: int, gamma_max: int) -> List[float]:
        """[step time with k of the batch's sequences drafting g tokens, for g in 0..gamma_max]
        (a padded profile: every sequence of the batch verifies g, `profiled`)."""
        kind, corr = kind_of(1, n_model), self.correction
        prof = self.profiled_row(ctx_len, batch, k, n_model, gamma_max)
        return [prof[0] * corr(bucket, "none", 0)] + [prof[g] * corr(bucket, kind, g) for g in range(1, gamma_max + 1)]

    def learn(self, bucket: int, kind: str, gamma: int, observed_ratio: float) -> None:
        """A step of this bucket, kind and gamma took observed_ratio x its profiled time."""
        if kind != "none":  # relative to the plain steps' correction now (the class's doc)
            observed_ratio /= self.correction(bucket, "none", 0)
        key = (bucket, kind, gamma)
        new = key not in self.ratio
        r = self.ratio.setdefault(key, [observed_ratio, 0])
        r[0] += self.ema * (observed_ratio - r[0])
        r[1] += 1
        if new:  # it may now be the nearest seen gamma of any other
            self._by_kind.setdefault((bucket, kind), {})[gamma] = r
            self._nearest.pop((bucket, kind), None)
