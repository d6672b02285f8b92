"""A small Llama drafter (built by build_engines/distill_drafter.py) with its own KV cache.

State per sequence: a cache slot and `fed`, the tokens whose keys/values sit in the
drafter's cache. Each proposal
  1. rolls back: `fed` is cut to its common prefix with the committed tokens
     (rejected drafts disappear; truncation is just the length, as in the target);
  2. catches up: feeds the committed tokens it has not seen (after a step drafted by
     another drafter, or after admission: the switching cost Nightjar prices) in
     one ragged forward per padding-bounded group;
  3. drafts: one batched forward per sub-step for all sequences still drafting; a
     sequence stops at its γ or when `keep_going` (the policy's AdaSpec-style
     "continue drafting?") says so.
Drafts are the argmax for greedy requests and samples from q = softmax(logits / T)
for sampling requests; q is returned in both cases (rewards use it; rejection
sampling needs it to be the distribution the draft came from, which it is).

Memory (Nightjar §6): `park()` frees the weights and the cache — the artifact on
disk is the parked copy, read back memory-mapped — and `start_reload()` rebuilds
them on a background thread; `resident` turns true only when that finishes (the
explicit completion signal), so the loop never drafts with a half-loaded model.
The embedding is the target's (distillation freezes it), so when the target engine
is given and its embedding is identical it is shared, and the drafter's resident
weights are its decoder layers and its head. A head over a draft vocabulary
(`draft_vocab` in the artifact) proposes only those tokens; q is scattered back to
the full vocabulary with zeros elsewhere.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from ..engines.torch_llama import TorchLlama
from ..engines.ragged import prefill_groups
from .base import ContinueFn, Draft, DraftRequest, Drafter

log = logging.getLogger("specserve.drafter")


class ModelDrafter(Drafter):
    is_model = True

    def __init__(self, name: str, checkpoint: str | Path, *, dtype: str = "bf16", max_slots: int = 8,
                 max_context: int = 2048, target: Optional[TorchLlama] = None):
        self.name = name
        self.checkpoint = Path(checkpoint)
        mf = self.checkpoint / "manifest.json"
        self.manifest = json.loads(mf.read_text()) if mf.exists() else {}
        # A drafter's numerics need not be batch-invariant (the target verifies every draft), so it
        # runs the faster kernels.
        self._args = dict(dtype=dtype, max_slots=max_slots, max_context=max_context, batch_invariant=False)
        self._target = target
        self._engine: Optional[TorchLlama] = None
        self._ready = threading.Event()
        self._loader: Optional[threading.Thread] = None
        self.load_error: Optional[BaseException] = None
        self.slots: Dict[int, int] = {}
        self.fed: Dict[int, List[int]] = {}
        self.verified: Dict[int, int] = {}  # prefix of fed known to equal the committed tokens
        self._load()
        self.weight_bytes = self._resident_weight_bytes()
        self.kv_bytes_per_token = self._engine.kv_bytes_per_token

    # -- residency -------------------------------------------------------------------------
    @property
    def resident(self) -> bool:
        return self._ready.is_set() and self._engine is not None

    @property
    def reloading(self) -> bool:
        return self._loader is not None and self._loader.is_alive()

    def _load(self) -> None:
        eng = TorchLlama(self.checkpoint, **self._args)
        t = self._target
        if (t is not None and t.embed.shape == eng.embed.shape and t.embed.dtype == eng.embed.dtype
                and torch.equal(t.embed, eng.embed)):
            eng.embed = t.embed  # one copy of the frozen embedding
            if eng.shape.tie_embeddings and eng.draft_vocab is None:
                eng.lm_head = t.lm_head
        self.vocab = eng.shape.vocab
        self.draft_vocab = eng.draft_vocab
        self._engine = eng
        self._ready.set()

    def _resident_weight_bytes(self) -> int:
        eng, t = self._engine, self._target

        def size(w: torch.Tensor) -> int:
            return w.numel() * w.element_size()
        total = sum(size(L.attn_norm) + size(L.mlp_norm) + L.wqkv.nbytes + L.wo.nbytes + L.w_gate_up.nbytes
                    + L.w_down.nbytes for L in eng.layers)
        total += 0 if t is not None and eng.embed is t.embed else size(eng.embed)
        total += 0 if t is not None and eng.lm_head is t.lm_head else eng.lm_head.nbytes
        return total

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of head columns (the draft vocabulary's, or the identity)."""
        return columns if self.draft_vocab is None else self.draft_vocab[columns]

    def park(self) -> None:
        """Free the weights and the cache; every sequence will catch up after a reload."""
        if self.reloading:
            raise RuntimeError(f"drafter {self.name}: cannot park while reloading")
        self._ready.clear()
        self._engine = None
        self.slots, self.fed, self.verified = {}, {}, {}

    def start_reload(self) -> threading.Event:
        """Load the weights back on a background thread; the returned event is set when usable."""
        if self.resident or self.reloading:
            return self._ready

        def load() -> None:
            try:
                self._load()
            except BaseException as e:  # reported through load_error; the drafter stays parked
                self.load_error = e
                log.exception("reloading drafter %s failed", self.name)

        self.load_error = None
        self._loader = threading.Thread(target=load, name=f"reload-{self.name}", daemon=True)
        self._loader.start()
        return self._ready

    # -- drafting ----------------------------------------------------------------------------
    def lag(self, seq_id: int, committed: Sequence[int]) -> int:
        """Committed tokens this drafter would have to catch up on before drafting."""
        return len(committed) - self.verified.get(seq_id, 0)

    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        return self.propose_batch([DraftRequest(seq_id, tokens, gamma)])[0]

    def propose_batch(self, requests: List[DraftRequest], keep_going: Optional[ContinueFn] = None) -> List[Draft]:
        eng = self._resident_engine()
        slots, starts, catch = self._catch_up_plan(requests)
        logits: List[Optional[torch.Tensor]] = [None] * len(requests)
        for group in prefill_groups([len(c) for c in catch]):
            out = eng.forward([slots[i] for i in group], [starts[i] for i in group], [catch[i] for i in group],
                              logit_rows=[[len(catch[i]) - 1] for i in group])
            for row, i in enumerate(group):
                self.fed[requests[i].seq_id].extend(catch[i])
                logits[i] = out[row]
        return self._draft_loop(requests, slots, logits, [None] * len(requests), keep_going)

    def _resident_engine(self) -> TorchLlama:
        if self._engine is None or not self._ready.is_set():
            raise RuntimeError(f"drafter {self.name} is not resident (parked or reloading)")
        return self._engine

    def _catch_up_plan(self, requests: List[DraftRequest]):
        """Per request: its cache slot, the position catch-up starts at, the tokens to feed."""
        slots, starts, catch = [], [], []
        for r in requests:
            slots.append(self._slot(r.seq_id))
            starts.append(self._keep(r.seq_id, r.tokens))
            catch.append(list(r.tokens[starts[-1]:]))
        return slots, starts, catch

    def _slot(self, seq_id: int) -> int:
        """The sequence's cache slot (a free one for a new sequence)."""
        if seq_id not in self.slots:
            used = set(self.slots.values())
            free = next((s for s in range(self._engine.max_slots) if s not in used), None)
            if free is None:
                raise RuntimeError(f"drafter {self.name}: all {self._engine.max_slots} cache slots are in use")
            self.slots[seq_id], self.fed[seq_id], self.verified[seq_id] = free, [], 0
        return self.slots[seq_id]

    def _keep(self, seq_id: int, committed: Sequence[int]) -> int:
        """Roll back to the cached prefix of the committed tokens, leaving at least the last
        token to feed (its logits draft the first token); returns that prefix's length."""
        fed = self._rollback(seq_id, committed)
        keep = min(len(fed), len(committed) - 1)
        del fed[keep:]
        self.verified[seq_id] = min(self.verified[seq_id], keep)
        return keep

    def _draft_loop(self, requests: List[DraftRequest], slots: List[int], logits: list, carry: list,
                    keep_going: Optional[ContinueFn]) -> List[Draft]:
        """Draft from each request's first logits: pick a token (argmax, or a sample from q at the
        request's temperature), then one batched `_next` per sub-step for the sequences still
        drafting. `carry` is what `_next` threads from one sub-step to the next (per request)."""
        drafts = [Draft(tokens=[]) for _ in requests]
        qs: List[list] = [[] for _ in requests]
        live = [i for i, r in enumerate(requests) if r.gamma > 0]
        while live:
            for i in live:
                r = requests[i]
                if r.temperature > 0:
                    q = torch.softmax(logits[i] / r.temperature, dim=-1)
                    col = int(torch.multinomial(q, 1, generator=r.generator))
                else:
                    q = torch.softmax(logits[i], dim=-1)
                    col = int(logits[i].argmax())
                drafts[i].tokens.append(col if self.draft_vocab is None else int(self.draft_vocab[col]))
                drafts[i].confidences.append(float(q[col]))
                qs[i].append(q)
            live = [i for i in live if len(drafts[i]) < requests[i].gamma
                    and (keep_going is None or keep_going(requests[i].seq_id, drafts[i].confidences))]
            if not live:
                break
            out, nxt = self._next([slots[i] for i in live], [len(self.fed[requests[i].seq_id]) for i in live],
                                  [drafts[i].tokens[-1] for i in live], [carry[i] for i in live])
            for row, i in enumerate(live):
                self.fed[requests[i].seq_id].append(drafts[i].tokens[-1])
                logits[i], carry[i] = out[row], nxt[row]
        for d, q in zip(drafts, qs):
            if q:
                d.q = self._full_vocab(torch.stack(q))
        return drafts

    def _next(self, slots: List[int], starts: List[int], tokens: List[int], carry: list):
        """Feed one drafted token per sequence; (logits rows, carry for the next sub-step)."""
        return self._engine.forward(slots, starts, [[t] for t in tokens]), carry

    def _full_vocab(self, q: torch.Tensor) -> torch.Tensor:
        if self.draft_vocab is None:
            return q
        full = q.new_zeros(q.shape[0], self.vocab)
        full[:, self.draft_vocab] = q
        return full

    def _rollback(self, seq_id: int, committed: Sequence[int]) -> List[int]:
        fed, i = self.fed[seq_id], self.verified[seq_id]
        n = min(len(fed), len(committed))
        while i < n and fed[i] == committed[i]:
            i += 1
        del fed[i:]
        self.verified[seq_id] = i
        return fed

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None:
        if seq_id in self.fed:
            self._rollback(seq_id, tokens)

    def release(self, seq_id: int) -> None:
        self.slots.pop(seq_id, None)
        self.fed.pop(seq_id, None)
        self.verified.pop(seq_id, None)
