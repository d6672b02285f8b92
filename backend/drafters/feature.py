"""A feature drafter (EAGLE-style; built by build_engines/distill_drafter.py --kind feature).

It reads the target's features — the final-normed hidden state the target's head
reads — besides the tokens: at position t its decoder layers take
embed(x_t) + fc (s f_{t-1}) and its output o_t stands in for f_t (see
build_engines/feature_student.py). The engine loop hands it the features of every
position the target caches (`observe_features`, after each prefill and verify), so
the drafter's state per sequence is:
  * `FeatureLog`: the target's features by position (the loop rewrites it from a
    position on after a preemption's recompute);
  * a cache slot whose first `fed` positions were computed from *true* features.
Each proposal catches up on committed positions past that prefix (after a step
drafted by another drafter, or the drafts this drafter proposed and the target
accepted: those were computed from its own guesses o, so they are recomputed with
the true f), takes the first draft token's logits from the catch-up's last row,
and drafts further tokens feeding its own o as the feature. Drafted positions are
never kept as true: the next proposal overwrites them.

Everything else (residency, parking, reload, draft vocabulary, q) is ModelDrafter's.
Parking keeps the feature logs: they come from the target, and the drafter needs
them to catch up after a reload.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors import safe_open

from ..engines.torch_llama import DTYPES
from ..engines.ragged import prefill_groups
from .base import ContinueFn, Draft, DraftRequest
from .model import ModelDrafter

FEATURE_FORMAT = "feature-drafter-1"


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def is_feature_drafter(path: Path) -> bool:
    """Whether the artifact at `path` is a feature drafter (else a token drafter, ModelDrafter)."""
    return _config(path).get("drafter_format") == FEATURE_FORMAT


def load_model_drafter(name: str, path: Path, **kwargs) -> ModelDrafter:
    """The drafter a built artifact holds: a FeatureDrafter or a (token) ModelDrafter."""
    return (FeatureDrafter if is_feature_drafter(path) else ModelDrafter)(name, path, **kwargs)


class FeatureLog:
    """The target's features of one sequence by position, in a buffer that grows by doubling."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        self.buf = torch.empty(64, hidden, dtype=dtype)
        self.length = 0

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Features of positions start.. (anything after them is forgotten)."""
        if start > self.length:
            raise ValueError(f"feature log has {self.length} positions; cannot write at {start}")
        end = start + rows.shape[0]
        if end > self.buf.shape[0]:
            grown = torch.empty(max(end, 2 * self.buf.shape[0]), self.buf.shape[1], dtype=self.buf.dtype)
            grown[: self.length] = self.buf[: self.length]
            self.buf = grown
        self.buf[start:end] = rows
        self.length = end

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """Features of positions lo..hi-1; position -1 reads as zeros (nothing precedes the first token)."""
        if hi > self.length:
            raise RuntimeError(f"features known for {self.length} positions, {hi} needed")
        rows = self.buf[max(lo, 0):hi]
        return torch.cat([rows.new_zeros(1, rows.shape[1]), rows]) if lo < 0 else rows


class FeatureDrafter(ModelDrafter):
    wants_features = True

    def __init__(self, name: str, checkpoint: str | Path, **kwargs):
        self.logs: Dict[int, FeatureLog] = {}
        super().__init__(name, checkpoint, **kwargs)
        # Its own KV cache plus the feature log, per token of context.
        self.kv_bytes_per_token += self._engine.shape.hidden * self._engine.embed.element_size()

    def _load(self) -> None:
        cfg = _config(self.checkpoint)
        if cfg.get("drafter_format") != FEATURE_FORMAT:
            raise ValueError(f"{self.checkpoint} is not a feature drafter ({FEATURE_FORMAT})")
        with safe_open(str(self.checkpoint / "model.safetensors"), "pt") as f:
            fc = f.get_tensor("model.fc.weight")
        self.fc = (fc.float().t() * cfg["feature_scale"]).to(DTYPES[self._args["dtype"]]).contiguous()  # f @ self.fc = fc (s f)
        super()._load()  # last: it signals residency

    def _resident_weight_bytes(self) -> int:
        return super()._resident_weight_bytes() + self.fc.numel() * self.fc.element_size()

    def park(self) -> None:
        super().park()
        self.fc = None

    # -- features from the engine loop --------------------------------------------------------
    def observe_features(self, seq_id: int, start: int, rows: torch.Tensor) -> None:
        log = self.logs.get(seq_id)
        if log is None:
            log = self.logs[seq_id] = FeatureLog(rows.shape[1], rows.dtype)
        log.write(start, rows)

    def release(self, seq_id: int) -> None:
        super().release(seq_id)
        self.logs.pop(seq_id, None)

    # -- drafting ----------------------------------------------------------------------------
    def _inputs(self, tokens: List[int], feats: torch.Tensor) -> torch.Tensor:
        """z_p = embed(x_p) + fc (s f_{p-1}), one row per token."""
        e = self._engine.embed[torch.tensor(tokens, dtype=torch.long)]
        return e + feats.to(e.dtype) @ self.fc

    def propose_batch(self, requests: List[DraftRequest], keep_going: Optional[ContinueFn] = None) -> List[Draft]:
        eng = self._resident_engine()
        missing = [r.seq_id for r in requests if r.seq_id not in self.logs]
        if missing:
            raise RuntimeError(f"drafter {self.name}: no target features for sequences {missing} "
                               "(a feature drafter runs inside the engine loop)")
        slots, starts, catch = self._catch_up_plan(requests)
        logits: List[Optional[torch.Tensor]] = [None] * len(requests)
        outs: List[Optional[torch.Tensor]] = [None] * len(requests)
        for group in prefill_groups([len(c) for c in catch]):
            # Position p reads x_p and f_{p-1}: the features of starts-1 .. end-2.
            embeds = [self._inputs(catch[i], self.logs[requests[i].seq_id].read(starts[i] - 1,
                                                                                 starts[i] + len(catch[i]) - 1))
                      for i in group]
            lg, o = eng.forward([slots[i] for i in group], [starts[i] for i in group], [catch[i] for i in group],
                                logit_rows=[[len(catch[i]) - 1] for i in group], return_hidden=True, embeds=embeds)
            row = 0
            for k, i in enumerate(group):
                self.fed[requests[i].seq_id].extend(catch[i])
                row += len(catch[i])
                logits[i], outs[i] = lg[k], o[row - 1]
        drafts = self._draft_loop(requests, slots, logits, outs, keep_going)
        for r in requests:  # drafted positions came from guessed features: never a true prefix
            del self.fed[r.seq_id][len(r.tokens):]
        return drafts

    def _next(self, slots: List[int], starts: List[int], tokens: List[int], carry: list):
        """Feed each drafted token with the drafter's own output o of the position before."""
        z = self._inputs(tokens, torch.stack(carry))
        lg, o = self._engine.forward(slots, starts, [[t] for t in tokens], return_hidden=True,
                                     embeds=[z[i: i + 1] for i in range(len(tokens))])
        return lg, list(o)
