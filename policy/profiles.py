"""Offline-profiled cost tables the policies read (built by build_engines/'s
profiler; JSON on disk). When no file is given, defaults are generated from the
CPU-shaped model in `costmodel` so the shapes are sane.

Switch-cost JSON (Nightjar Table III):
    {"l_max": [16, 64, 256], "batch": [1, 2, 4], "seconds": [[...per batch...], ...per l_max]}
Step-time JSON (AdaSpec):
    {"ctx_buckets": [256, 1024], "token_batch": [1, 2, 4, ...],
     "target_s": [[...per token_batch...], ...per bucket], "draft_s": [[...]],
     "target_overhead_s": [...per token_batch], "draft_overhead_s": [...]}
A profile may add the target's time by shape, B sequences each verifying t = 1 + gamma tokens.
An engine that runs each sequence's own tokens (llama.cpp; build_engines/shape_table.py):
    {"verify": "ragged", "batch": [1, 2, ...], "tokens_per_seq": [1, 2, ...],
     "shape_target_s": [[[...per t...] ...per batch] ...per bucket], ...}
and the policy reads an iteration of n tokens over B sequences at (B, n / B) (`target_step`).
An engine that pads every draft of an iteration to one length (TensorRT-LLM 1.2):
    {"verify": "padded", "batch": [...], "tokens_per_seq": [...], "padded_target_s": [[[...]]], ...}
where token_batch / target_s may be left out (then: token_batch = batch, and target_s read
from the padded table at B = max(1, n // 4) sequences of n / B tokens, profile_costs' shape).
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from . import costmodel
from .params import PolicyConfigError


def interp1(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear in the grid, linear extrapolation from the end segments.

    >>> interp1([1, 2, 4], [10, 20, 30], 3), interp1([1, 2, 4], [10, 20, 30], 8)
    (25.0, 50.0)
    """
    if len(xs) == 1:
        return float(ys[0])
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise PolicyConfigError(f"cannot read profile {path!r}: {e}") from None


@dataclass(frozen=True)
class SwitchCostTable:
    """C_switch(L_max, B) in seconds (Nightjar §4.3)."""

    l_max: Tuple[int, ...]
    batch: Tuple[int, ...]
    seconds: Tuple[Tuple[float, ...], ...]  # [l_max index][batch index]

    def __call__(self, l_max: int, batch: int) -> float:
        if l_max <= 0:
            return 0.0
        rows = [interp1(self.batch, row, batch) for row in self.seconds]
        return max(0.0, interp1(self.l_max, rows, l_max))

    @classmethod
    def default(cls) -> "SwitchCostTable":
        ls, bs = (16, 64, 256, 1024), (1, 2, 4, 8, 16, 32, 64)
        return cls(ls, bs, tuple(tuple(costmodel.catch_up_time_s(l, b) for b in bs) for l in ls))

    @classmethod
    def load(cls, path: Optional[str]) -> "SwitchCostTable":
        if not path:
            return cls.default()
        d = _read_json(path)
        try:
            t = cls(tuple(d["l_max"]), tuple(d["batch"]), tuple(tuple(map(float, r)) for r in d["seconds"]))
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyConfigError(f"switch-cost profile {path!r} malformed: {e}") from None
        if len(t.seconds) != len(t.l_max) or any(len(r) != len(t.batch) for r in t.seconds):
            raise PolicyConfigError(f"switch-cost profile {path!r}: seconds must be len(l_max) x len(batch)")
        return t


@dataclass(frozen=True)
class StepTimeProfile:
    """AdaSpec's tables: per context bucket, forward time by token-batch size, a
    per-bucket linear fit for extrapolation beyond the grid, and fixed overheads.

    Optionally the cost by shape (`shape_target_s`): the target's time of an iteration of
    `batch` sequences each verifying t tokens. `verify` says how the engine runs an iteration
    whose sequences drafted different lengths: "padded" (`padded`: every sequence verifies the
    longest, TensorRT-LLM 1.2) or "ragged" (each its own; llama.cpp).

    >>> p = StepTimeProfile((512,), (1, 2), ((0.01, 0.01),), ((0.001, 0.001),), (0.0, 0.0), (0.0, 0.0),
    ...                     shape_batch=(1, 8), shape_tokens=(1, 2),
    ...                     shape_target_s=(((0.010, 0.011), (0.012, 0.020)),), verify="padded")
    >>> p.padded, round(p.target_shape(100, 8, 2), 4), round(p.target_shape(100, 4.5, 2), 4)
    (True, 0.02, 0.0155)
    >>> round(p.target_shape(100, 15, 3), 4)   # beyond the grid: B=15 gives .014, .029, so t=3 .044
    0.044
    """

    ctx_buckets: Tuple[int, ...]
    token_batch: Tuple[int, ...]
    target_s: Tuple[Tuple[float, ...], ...]
    draft_s: Tuple[Tuple[float, ...], ...]
    target_overhead_s: Tuple[float, ...]
    draft_overhead_s: Tuple[float, ...]
    shape_batch: Tuple[int, ...] = ()
    shape_tokens: Tuple[int, ...] = ()  # tokens verified per sequence, t = 1 + gamma
    shape_target_s: Tuple[Tuple[Tuple[float, ...], ...], ...] = ()  # [bucket][batch][t]
    verify: str = "ragged"  # "padded": the engine verifies the longest draft on every sequence
    pad_to: Optional[int] = None  # the engine pads every draft to this static length (TensorRT-LLM 1.2)

    def verified_per_seq(self, gamma: int) -> int:
        """Tokens each sequence verifies in an iteration whose largest gamma is `gamma`: 1 + gamma,
        or 1 + pad_to in any iteration that speculates when the engine pads to a static length.

        >>> import dataclasses
        >>> p = StepTimeProfile.default()
        >>> p.verified_per_seq(0), p.verified_per_seq(3), dataclasses.replace(p, pad_to=8).verified_per_seq(3)
        (1, 4, 9)
        """
        return 1 if gamma <= 0 else 1 + (self.pad_to if self.pad_to else gamma)

    @property
    def padded(self) -> bool:
        """Whether the engine pads drafts: an iteration then verifies every sequence at its
        longest draft (`target_shape` at 1 + that gamma)."""
        return bool(self.shape_target_s) and self.verify == "padded"

    def bucket(self, ctx_len: float) -> int:
        """Index of the smallest bucket >= ctx_len (last bucket beyond the grid)."""
        return min(bisect.bisect_left(self.ctx_buckets, ctx_len), len(self.ctx_buckets) - 1)

    def _lookup(self, table, bucket: int, n: float) -> float:
        return _extended(self.token_batch, table[bucket], n)

    def target(self, ctx_len: float, n_tokens: float) -> float:
        b = self.bucket(ctx_len)
        return self._lookup(self.target_s, b, n_tokens) + interp1(self.token_batch, self.target_overhead_s, n_tokens)

    def target_shape(self, ctx_len: float, batch: float, tokens_per_seq: float) -> float:
        """Target time of an iteration of `batch` sequences each verifying `tokens_per_seq`
        tokens (padded, or all alike), from the table by shape: piecewise-linear in both inside
        the grid, linear beyond it (as `target`), plus the fixed overhead at its token count."""
        rows = self.shape_target_s[self.bucket(ctx_len)]
        by_t = tuple(_extended(self.shape_batch, col, batch) for col in zip(*rows))
        return (_extended(self.shape_tokens, by_t, tokens_per_seq)
                + interp1(self.token_batch, self.target_overhead_s, batch * tokens_per_seq))

    def target_step(self, ctx_len: float, n_tokens: float, batch: Optional[float] = None,
                    gamma: Optional[float] = None) -> float:
        """Target time of a step of n_tokens over `batch` sequences, the longest verifying
        1 + gamma. With the table by shape of an engine that does not pad, and the batch: every
        sequence verifying alike (n_tokens = batch (1 + gamma)) is one pass, T(batch, 1 + gamma).
        A ragged step, k = (n_tokens - batch) / gamma sequences verifying 1 + gamma and the rest
        1, is what llama.cpp runs (backend/engines/llama_cpp.py: a micro-batch takes as many
        tokens from each of its sequences, consecutive sequence ids only): the cheaper of one pass
        padded to the longest, T(batch, 1 + gamma), and a pass of every sequence's first token
        then the k's drafts, T(batch, 1) + k T(1, gamma): k drafting sequences scattered among the
        slots are k more passes over the weights, each a whole read of them now that rows cost
        little (2-core Xeon, session 36: a pass ~11 ms, a row 0.6-1.7 ms; pricing them as one
        pass, T(k, gamma), had the composite draft for 12% of 29 sequences at 0.53 acceptance,
        89 ms steps against 65). (Measured before, 32 sequences, 16 verifying 4: 358 and 445 ms by
        slot layout; the mean tokens per sequence T(32, 2.5) 313; docs/results.md.)
        Without gamma, T(batch, n_tokens / batch). Otherwise the table by token count.

        >>> p = StepTimeProfile((512,), (1, 64), ((0.01, 0.2),), ((0.0, 0.0),), (0.0, 0.0), (0.0, 0.0),
        ...                     shape_batch=(1, 32), shape_tokens=(1, 2),
        ...                     shape_target_s=(((0.010, 0.014), (0.1, 0.25)),))
        >>> p.target_step(100, 32, 32), p.target_step(100, 64, 32, 1), round(p.target_step(100, 32), 4)
        (0.1, 0.25, 0.1035)
        >>> round(p.target_step(100, 33, 32, 1), 4)   # one of 32 verifying 2: 0.1 + T(1, 1)
        0.11
        """
        if batch is None or self.padded or not self.shape_target_s:
            return self.target(ctx_len, n_tokens)
        if not gamma or n_tokens <= batch:
            return self.target_shape(ctx_len, batch, n_tokens / batch)
        one_pass = self.target_shape(ctx_len, batch, 1 + gamma)
        drafting = (n_tokens - batch) / gamma
        if drafting >= batch - 1e-9:
            return one_pass
        return min(one_pass, self.target_shape(ctx_len, batch, 1) + drafting * self.target_shape(ctx_len, 1, gamma))

    def draft(self, ctx_len: float, batch: float) -> float:
        b = self.bucket(ctx_len)
        return self._lookup(self.draft_s, b, batch)

    def draft_overhead(self, batch: float) -> float:
        return interp1(self.token_batch, self.draft_overhead_s, batch)

    @classmethod
    def default(cls) -> "StepTimeProfile":
        """Profiled like the paper's offline tool: decode-shaped forwards of n tokens."""
        grid = (1, 2, 4, 8, 16, 32, 64)
        buckets = (256, 1024, 4096)
        tgt = tuple(float(costmodel.target_time_s(n, 0)) for n in grid)
        drf = tuple(float(costmodel.draft_time_s(n, 1, True)) for n in grid)
        zeros = tuple(0.0 for _ in grid)
        return cls(buckets, grid, (tgt,) * 3, (drf,) * 3, zeros, zeros)

    @classmethod
    def load(cls, path: Optional[str]) -> "StepTimeProfile":
        if not path:
            return cls.default()
        d = _read_json(path)
        try:
            shapes = _shape_fields(d)
            padded = shapes.get("verify") == "padded"
            token_batch = tuple(d["token_batch"] if "token_batch" in d or not padded else d["batch"])
            zeros = [0.0] * len(token_batch)
            p = cls(tuple(d["ctx_buckets"]), token_batch,
                    tuple(tuple(map(float, r)) for r in d["target_s"]) if "target_s" in d or not padded else (),
                    tuple(tuple(map(float, r)) for r in d["draft_s"]),
                    tuple(map(float, d.get("target_overhead_s", zeros))),
                    tuple(map(float, d.get("draft_overhead_s", zeros))), **shapes)
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyConfigError(f"step-time profile {path!r} malformed: {e}") from None
        if p.padded and not p.target_s:
            p = dataclasses.replace(p, target_s=token_batch_table(p))
        return p


def _shape_fields(d: dict) -> dict:
    """The table-by-shape fields of a profile's JSON: padded_target_s for an engine that pads,
    shape_target_s for one that does not (none in a profile without one)."""
    verify = d.get("verify", "ragged")
    if verify not in ("padded", "ragged"):
        raise ValueError(f"verify must be 'padded' or 'ragged', not {verify!r}")
    key = "padded_target_s" if verify == "padded" else "shape_target_s"
    if key not in d and verify == "ragged":
        return {}
    ctx, batch, tokens = d["ctx_buckets"], tuple(d["batch"]), tuple(d["tokens_per_seq"])
    table = tuple(tuple(tuple(map(float, row)) for row in rows) for rows in d[key])
    if len(table) != len(ctx) or any(len(rows) != len(batch) or any(len(r) != len(tokens) for r in rows)
                                     for rows in table):
        raise ValueError(f"{key} must be len(ctx_buckets) x len(batch) x len(tokens_per_seq)")
    pad_to = d.get("pad_to")
    return {"shape_batch": batch, "shape_tokens": tokens, "shape_target_s": table, "verify": verify,
            "pad_to": int(pad_to) if pad_to else None}


def token_batch_table(p: StepTimeProfile) -> Tuple[Tuple[float, ...], ...]:
    """A padded profile's target time by token batch n, for the policies that read it so
    (AdaSpec, SmartSpec): n tokens as B = max(1, n // 4) sequences of n / B tokens each, the
    shape build_engines/profile_costs.py measures token batches in."""
    def shape(n: int) -> Tuple[int, float]:
        b = max(1, n // 4)
        return b, n / b

    return tuple(tuple(p.target_shape(ctx, *shape(n)) - interp1(p.token_batch, p.target_overhead_s, n)
                       for n in p.token_batch) for ctx in p.ctx_buckets)


def _extended(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear inside the grid; beyond its last point, the least-squares line through
    all of it (a cost grows about linearly there; the last segment alone is noisy)."""
    if x <= xs[-1]:
        return interp1(xs, ys, x)
    slope, icpt = _linear_fit(tuple(xs), tuple(ys))
    return slope * x + icpt


@functools.lru_cache(maxsize=64)
def _linear_fit(xs, ys) -> Tuple[float, float]:
    slope, icpt = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(icpt)
