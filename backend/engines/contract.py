"""The engine contract: what the draft-verify loop needs from a target engine.

An engine holds one model and a KV cache divided into `max_slots` *slots*; a slot
holds one sequence's cached positions 0..n-1 (n is the slot's *cached length*). The
loop (backend/loop/engine_loop.py) owns the bookkeeping: which sequence sits in which
slot and how long each one is; the engine only stores and computes. Every engine
behind the loop implements `Engine` below and passes the one contract test suite,
tests/backend/test_engine_contract.py (add the engine's factory to its list).

    engine.forward(slots, starts, tokens, logit_rows)  one ragged step
    engine.truncate(slot, length)                      forget rejected drafts
    engine.move_slot(src, dst, length)                 keep the running slots dense
    engine.max_slots, engine.max_context               limits
    engine.kv_bytes_per_token, kv_capacity_tokens      memory budget
    engine.name, engine.shape.vocab / eos_token_id     identity

How the known engines map onto it:
  * torch (backend/engines/torch_llama.py): a preallocated cache per slot; a forward
    at start s simply overwrites positions >= s, so `truncate` only checks its
    arguments, and `move_slot` copies tensors.
  * llama.cpp (backend/engines/llama_cpp.py): one context with `n_seq_max = max_slots`,
    sequence id = slot, one KV stream per sequence; `forward` is one `llama_decode` whose
    batch flags `logits` on the requested rows only (read back with
    `llama_get_logits_ith`); `truncate` is `llama_memory_seq_rm(mem, slot, length, -1)`;
    `move_slot` cuts src to length, copies its stream over dst and empties src.
  * TensorRT-LLM owns its own loop, scheduler and KV cache and does not implement
    this contract; the speculation component runs inside its Drafter hook instead.

Batch invariance is what makes speculation lossless: verifying k drafts in one
forward must give, for every position, the logits plain decoding would have given
one token at a time, whatever else shares the batch and whichever slot holds the
sequence. The contract suite measures it (ragged == alone, chunked == one prefill,
moved == unmoved, truncated == never seen) within the tolerance each engine declares
there; greedy verification needs the argmax to agree, so an engine must be exact or
so close that argmax ties do not flip (the fp32 torch engine is within 1e-4; llama.cpp
with a Q8_0 KV cache is bit-identical, see llama_cpp.py for why).

Threading: an engine is driven by one thread (the loop's). Errors: a request outside
the declared limits or a malformed batch raises ValueError before anything is written,
so the cache is unchanged and the engine stays usable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

if TYPE_CHECKING:  # the contract itself needs no torch at run time
    import torch


@runtime_checkable
class ModelShape(Protocol):
    """The two facts about the model that the loop reads (engines may expose more)."""

    vocab: int  # logits have this many columns; column j is token id j
    eos_token_id: int  # the model's end-of-sequence token (the default stop token)


@runtime_checkable
class Engine(Protocol):
    """A target engine: ragged forward over a slotted KV cache. See the module docstring.

    Positions and lengths: a slot's cached length n starts at 0 and changes only by
    `forward` (to start + len(tokens)), `truncate` (to min(n, length)) and `move_slot`
    (dst to `length`, src to 0). Limits: 0 <= slot < max_slots and
    start + len(tokens) <= max_context; violating either raises ValueError.
    """

    shape: ModelShape
    max_slots: int  # slots 0..max_slots-1; the loop's max_batch must not exceed it
    max_context: int  # positions per slot: every start + len(tokens) <= max_context

    @property
    def name(self) -> str:
        """Engine kind and numerics, e.g. "torch/fp32", "torch/bf16", "llama.cpp/Q4_0".
        Cost profiles and manifests record it: two engines with the same name on the same
        model and machine have the same step-time curve and the same logits."""
        ...

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached position of one sequence takes (K and V, all layers); > 0.
        The loop's KV block ledger (backend/loop/memory.py) budgets in these units."""
        ...

    @property
    def kv_capacity_tokens(self) -> int:
        """Cached positions the engine holds in all slots together; >= max_context.
        The cache really occupies about kv_capacity_tokens * kv_bytes_per_token bytes
        (an engine may add a little scratch), so a KV budget larger than that cannot be
        used: the loop's block ledger must not promise more. The torch engine preallocates every slot
        (max_slots * max_context); llama.cpp preallocates one stream per slot, each rounded up
        to a multiple of 256 cells."""
        ...

    @property
    def supports_hidden(self) -> bool:
        """Whether forward(..., return_hidden=True) works (feature drafters need it).
        An engine without it raises NotImplementedError when asked."""
        ...

    def forward(self, slots: Sequence[int], starts: Sequence[int], tokens: Sequence[Sequence[int]],
                logit_rows: Optional[Sequence[Sequence[int]]] = None,
                return_hidden: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """One ragged step: sequence b appends tokens[b] to slot slots[b] at positions
        starts[b] .. starts[b] + len(tokens[b]) - 1, attending to the slot's positions
        0 .. starts[b] - 1 and causally to its own new tokens.

        Inputs (all of length B = len(slots)):
          slots[b]   distinct slot ids in [0, max_slots), any order;
          starts[b]  0 <= starts[b] <= the slot's cached length (no holes). Positions
                     >= starts[b] the slot held before are forgotten first: a forward
                     implies truncate(slot, start), so rejected drafts need not be
                     truncated for correctness (truncate to free their memory early);
          tokens[b]  >= 1 token ids in [0, shape.vocab); starts[b] + len <= max_context;
          logit_rows[b]  indices into tokens[b] (0-based, each in [0, len(tokens[b])),
                     strictly increasing, possibly empty) whose logits are wanted;
                     None means every new position. Verification asks for all k+1
                     rows of a sequence with k drafts, prefill for the last row only:
                     an engine computes the LM head only for these rows.

        Returns logits  # float32 [rows, shape.vocab], on the CPU
          rows in batch order, and within sequence b in the order of logit_rows[b]:
          logit_rows None -> rows = sum_b len(tokens[b]); row of (b, i) is
                             sum_{c<b} len(tokens[c]) + i;
          logit_rows given -> rows = sum_b len(logit_rows[b]); row of (b, logit_rows[b][j])
                             is sum_{c<b} len(logit_rows[c]) + j.
        Row (b, i) is the next-token distribution (unnormalised) after tokens[b][: i+1].
        With return_hidden (only when supports_hidden): (logits, hidden) where
          hidden  # [sum_b len(tokens[b]), hidden_size], the engine's compute dtype
          is the final-normed hidden state the LM head reads, for every new position in
          batch order (independent of logit_rows); logits are the same as without it.

        Batch invariance (the suite's tolerance): row (b, i) does not depend on the other
        sequences in the batch, on how many tokens sequence b appends at once, nor on which
        slot holds it.
        """
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Forget the slot's positions >= length (its cached length becomes
        min(n, length)); length 0 empties the slot (there is no separate `release`: a slot
        the loop vacates is truncated to 0, and preempted sequences are recomputed from 0).
        0 <= length <= max_context. Call it after rejection with the accepted length:
        llama.cpp frees the cells (`llama_memory_seq_rm`); the torch engine needs nothing
        (a later forward at start s overwrites positions >= s) and only checks arguments."""
        ...

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Move the first `length` cached positions of slot src to slot dst (src != dst,
        length <= src's cached length): afterwards dst holds exactly them, whatever it held
        before is forgotten, and src is empty. The continuation of the sequence in dst is
        what it would have been in src. The loop uses it to keep running slots dense."""
        ...


def check_slot(engine: Engine, slot: int, what: str = "slot") -> None:
    if not 0 <= slot < engine.max_slots:
        raise ValueError(f"{what} {slot} is out of range: this engine has slots 0..{engine.max_slots - 1}")


def check_forward_args(engine: Engine, slots: Sequence[int], starts: Sequence[int],
                       tokens: Optional[Sequence[Sequence[int]]], logit_rows: Optional[Sequence[Sequence[int]]],
                       lens: Optional[Sequence[int]] = None) -> None:
    """The contract's limits on one forward, checked before anything is written (ValueError,
    cache untouched). `lens` replaces `tokens` when the caller passes embeddings instead of ids.
    Python-level only: microseconds against a step of milliseconds."""
    lens = [len(t) for t in tokens] if lens is None else list(lens)
    if not (len(slots) == len(starts) == len(lens)) or not lens:
        raise ValueError(f"slots, starts and tokens must be non-empty and of equal length "
                         f"({len(slots)}, {len(starts)}, {len(lens)})")
    if len(set(slots)) != len(slots):
        raise ValueError(f"a slot appears twice in one forward: {list(slots)}")
    for slot in slots:
        check_slot(engine, slot)
    if min(lens) <= 0:
        raise ValueError("every sequence must append at least one token")
    for st, n in zip(starts, lens):
        if st < 0:
            raise ValueError(f"negative start position {st}")
        if st + n > engine.max_context:
            raise ValueError(f"sequence would exceed the context window ({st}+{n} > {engine.max_context})")
    if tokens is not None:
        lo, hi, vocab = min(min(t) for t in tokens), max(max(t) for t in tokens), engine.shape.vocab
        if lo < 0 or hi >= vocab:
            raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab})")
    if logit_rows is not None:
        if len(logit_rows) != len(lens):
            raise ValueError(f"logit_rows has {len(logit_rows)} entries for {len(lens)} sequences")
        for rows, n in zip(logit_rows, lens):
            if any(not 0 <= r < n for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
                raise ValueError(f"logit_rows {list(rows)} must be strictly increasing indices in [0, {n})")
