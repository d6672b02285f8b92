"""The llama.cpp engine: the engine contract (contract.py) on llama-cpp-python's low-level API.

One llama context holds every slot: `n_seq_max = max_slots`, sequence id = slot, and
one KV *stream* per sequence (`kv_unified = False`, `n_ctx = max_slots * max_context`).
A step is one `llama_decode` over the whole ragged batch with the `logits` flag set only
on the rows the caller wants (read back with `llama_get_logits_ith`); rejected drafts
and vacated slots are forgotten with `llama_memory_seq_rm`.

Why these settings (measured and read in llama.cpp's vendored sources, 0.3.36):
batch invariance -- the logits of a position must not depend on what else shares the
call -- holds for the quantized matmuls (each row is quantized and reduced on its own),
but llama.cpp's CPU flash attention has three kernels: a vector kernel (one query row
against the keys in cell order), a *tiled* kernel for >= 64 query rows of one sequence
and a *split-KV* kernel for a single query over >= 512 cells; the last two sum in other
orders. All three apply only to an F16/F32 KV cache, so the cache is stored in Q8_0
(or BF16): then every query runs the vector kernel, whatever the batch. The vector
kernel reads a sequence's keys in cell order, so each sequence keeps its own stream:
it only ever appends and cuts its tail, so its cells stay in position order (in a
unified cache other sequences' frees would scatter them). A stream per sequence costs
one constraint: llama.cpp splits a batch into micro-batches of consecutive sequence
ids with the same number of tokens each, so a ragged verification batch (sequences
verifying different numbers of drafts) becomes several passes over the weights.
`pad_ragged` pads short sequences of a step to the longest with throw-away tokens
(their cells are removed right after), which keeps one pass per step -- when that is
cheaper: a pass costs about UBATCH_COST_TOKENS tokens' worth of compute on top of its
tokens, so a step where one sequence in 32 verifies drafts is split (one extra small
pass) rather than padded (every sequence computing the drafts' positions), and a step
where half of them do, alternating, is padded (`ubatches`, `_pad_pays`).
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..manifest import gguf_entry
from .contract import check_forward_args, check_slot
from .llama_cpp_cpu import model_params

log = logging.getLogger("specserve.llama_cpp")

KV_TYPES = {"q8_0": 8, "bf16": 30, "f16": 1}  # ggml type ids of the KV cache element types
KV_BYTES = {"q8_0": 34 / 32, "bf16": 2.0, "f16": 2.0}  # bytes per cached value (Q8_0: 32 int8 + one f16 scale)
PAD_RAGGED_MAX = 16  # pad steps whose longest sequence has at most this many tokens (verification), not prefill
# A micro-batch's fixed cost in tokens' worth of its per-token cost: 2-core AVX-512 EPYC, Q8_0,
# 256 cached tokens (2026-11-24): 8 x 1 tokens 32 ms, 32 x 1 98 ms, 8 x 3 76 ms -> ~2.75 ms a
# token plus ~10 ms a pass. Only the choice between padding and splitting reads it.
UBATCH_COST_TOKENS = 8  # a pass reads every weight (~11 ms, 2-core Xeon); a padded row costs 0.6-1.7 ms (session 36)


def ubatches(slots: Sequence[int], lens: Sequence[int]) -> int:
    """How many micro-batches llama.cpp makes of a step without padding (slots in increasing
    order, lens their token counts): each takes one run of consecutive sequence ids that
    still have tokens, the same number from each, until one of them runs out.

    >>> ubatches([0, 1, 2, 3], [1, 1, 1, 1]), ubatches([0, 1, 2, 3], [3, 1, 1, 1]), ubatches([0, 1, 2, 3], [3, 1, 3, 1])
    (1, 2, 3)
    >>> ubatches([0, 1, 2, 3], [1, 3, 3, 1]), ubatches([0, 2], [1, 1])   # slot 1 not in the step: two runs
    (2, 2)
    """
    rem, count = list(lens), 0
    while any(rem):
        i = 0
        while i < len(rem):
            if not rem[i]:
                i += 1
                continue
            j = i + 1
            while j < len(rem) and rem[j] and slots[j] == slots[j - 1] + 1:
                j += 1
            m = min(rem[i:j])
            rem[i:j] = [r - m for r in rem[i:j]]
            count += 1
            i = j
    return count


def _pad_pays(slots: Sequence[int], lens: Sequence[int]) -> bool:
    """Padding to the longest costs its throw-away tokens; splitting costs its extra passes.

    >>> _pad_pays(list(range(8)), [3] + [1] * 7), _pad_pays(list(range(8)), [3, 1] * 4)
    (False, True)
    """
    pad_tokens = max(lens) * len(lens) - sum(lens)
    return pad_tokens > 0 and (ubatches(slots, lens) - 1) * UBATCH_COST_TOKENS > pad_tokens


def served_gguf(checkpoint: Path) -> Path:
    """The GGUF the checkpoint's manifest names (FileNotFoundError with the fix if none)."""
    entry = gguf_entry(checkpoint)
    if not entry or not (checkpoint / entry["file"]).exists():
        raise FileNotFoundError(f"no GGUF prepared in {checkpoint}: run the set-up (scripts/setup.sh) or "
                                f"python -m build_engines.prepare_gguf --checkpoint {checkpoint}")
    return checkpoint / entry["file"]


def _lib():
    import llama_cpp  # imported lazily: the torch engine and the policies do not need it
    return llama_cpp


_INIT = threading.Lock()
_READY = False
_KV_SIZE_RE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB")
_kv_reports: List[float] = []  # MiB of every KV cache llama.cpp allocated (its own log line)


def _backend_init() -> None:
    """Initialise llama.cpp once per process and route its log into Python logging (it
    prints to stderr otherwise); the KV cache size it reports is kept for the tests."""
    global _READY, _log_cb
    with _INIT:
        if _READY:
            return
        ll = _lib()

        @ll.llama_log_callback
        def _log_cb(level, text, _user):  # kept referenced in a global: ctypes must not free it
            line = text.decode("utf-8", "replace").rstrip()
            m = _KV_SIZE_RE.search(line)
            if m:
                _kv_reports.append(float(m.group(1)))
            if level == 4:  # GGML_LOG_LEVEL_ERROR; DEBUG, INFO, WARN (1-3) and continuations (5) are chatter
                log.error("llama.cpp: %s", line)
            elif line:
                log.debug("llama.cpp: %s", line)

        ll.llama_log_set(_log_cb, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _READY = True


@dataclass(frozen=True)
class GgufShape:
    """What the loop reads about the model (contract.ModelShape) and what the KV size needs."""
    vocab: int
    eos_token_id: int
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int
    weight_type: str  # e.g. "Q4_0", from the model's own description


class LlamaCpp:
    """A target engine on llama.cpp (GGUF). See the module docstring and contract.py."""

    supports_hidden = False  # the contract's hidden states are not read back from llama.cpp

    def __init__(self, gguf: str | Path, *, max_slots: int = 8, max_context: int = 2048, threads: int = 0,
                 kv_type: str = "q8_0", pad_ragged: bool = True, n_batch: int = 512, prefix_stream: bool = False,
                 retain_streams: int = 0):
        """prefix_stream: one more KV stream, beside the slots, holding a prefix many prompts share
        (`set_prefix`), copied into a slot instead of prefilled again (`load_prefix`).
        retain_streams: that many more, keeping the cells of sequences that left (`retain`) for a
        later prompt that starts with the same tokens (`restore`)."""
        if retain_streams < 0:
            raise ValueError(f"retain_streams must be >= 0, got {retain_streams}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
        if kv_type == "f16":
            log.warning("kv_type f16: llama.cpp's tiled and split-KV attention kernels make logits depend "
                        "on the batch; speculation is then not guaranteed lossless")
        gguf = Path(gguf)
        if not gguf.is_file():
            raise FileNotFoundError(f"no GGUF file at {gguf}")
        _backend_init()
        ll = self._ll = _lib()
        self._model = ll.llama_model_load_from_file(str(gguf).encode(), model_params(ll))
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        vocab_p = ll.llama_model_get_vocab(self._model)
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._model, desc, 256)
        n_head = ll.llama_model_n_head(self._model)
        self.shape = GgufShape(vocab=ll.llama_vocab_n_tokens(vocab_p), eos_token_id=ll.llama_vocab_eos(vocab_p),
                               layers=ll.llama_model_n_layer(self._model), kv_heads=ll.llama_model_n_head_kv(self._model),
                               head_dim=ll.llama_model_n_embd(self._model) // n_head,
                               max_positions=ll.llama_model_n_ctx_train(self._model),
                               weight_type=desc.value.decode().split()[-1])
        if max_context > self.shape.max_positions:
            raise ValueError(f"max_context {max_context} exceeds the model's {self.shape.max_positions} positions")
        self.max_slots, self.max_context = max_slots, max_context
        self.kv_type, self.pad_ragged = kv_type, pad_ragged
        self.threads = threads if threads > 0 else (os.cpu_count() or 1)
        cp = ll.llama_context_default_params()
        streams = max_slots + retain_streams + (1 if prefix_stream else 0)
        cp.n_ctx = streams * max_context
        cp.n_batch = cp.n_ubatch = n_batch
        cp.n_seq_max = streams
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED  # a quantized V cache needs it
        cp.type_k = cp.type_v = KV_TYPES[kv_type]
        cp.kv_unified = False  # one stream per sequence: cells stay in position order
        cp.no_perf = True
        reports = len(_kv_reports)
        self._ctx = ll.llama_init_from_model(self._model, cp)
        if not self._ctx:
            ll.llama_model_free(self._model)
            raise RuntimeError(f"llama.cpp could not create a context for {max_slots} x {max_context} positions")
        # llama.cpp's own report of the cache it allocated, in MiB to two decimals: its upper bound
        self.kv_reported_bytes = int((_kv_reports[-1] + 0.005) * 2**20) if len(_kv_reports) > reports else None
        self._mem = ll.llama_get_memory(self._ctx)
        self._cells_per_slot = ll.llama_n_ctx_seq(self._ctx)
        self.n_batch = n_batch
        self._batch = ll.llama_batch_init(n_batch, 0, 1)
        self._lens = [0] * streams  # each slot's cached length, then the retained streams', then the prefix's
        self.retain_streams = retain_streams
        self._prefix_slot = max_slots + retain_streams if prefix_stream else None
        self._prefix_tokens: List[int] = []

    # -- the contract's metadata -----------------------------------------------------
    @property
    def name(self) -> str:
        return f"llama.cpp/{self.shape.weight_type}"

    @property
    def kv_bytes_per_token(self) -> int:
        s = self.shape
        return int(round(2 * s.layers * s.kv_heads * s.head_dim * KV_BYTES[self.kv_type]))

    @property
    def kv_capacity_tokens(self) -> int:
        """Every sequence has its own stream, allocated up front: max_context cells rounded up
        by llama.cpp (to a multiple of 256), of which max_context are used."""
        return self.max_slots * self._cells_per_slot

    def cached_length(self, slot: int) -> int:
        return self._lens[slot]

    # -- forward --------------------------------------------------------------------
    def forward(self, slots: Sequence[int], starts: Sequence[int], tokens: Sequence[Sequence[int]],
                logit_rows: Optional[Sequence[Sequence[int]]] = None, return_hidden: bool = False) -> torch.Tensor:
        if return_hidden:
            raise NotImplementedError(f"{self.name} does not return hidden states (feature drafters need the "
                                      f"torch engine)")
        lens = [len(t) for t in tokens]
        check_forward_args(self, slots, starts, tokens, logit_rows)
        for slot, st in zip(slots, starts):
            if st > self._lens[slot]:
                raise ValueError(f"start {st} leaves a hole in slot {slot}, which holds {self._lens[slot]} positions")
        rows = [list(r) for r in logit_rows] if logit_rows is not None else [list(range(n)) for n in lens]
        out = np.empty((sum(len(r) for r in rows), self.shape.vocab), dtype=np.float32)
        out_at = np.cumsum([0] + [len(r) for r in rows])
        for slot, st in zip(slots, starts):  # the contract's implicit truncate
            self._seq_rm(slot, st)
        # llama.cpp forms micro-batches from consecutive sequence ids: feed them in slot order.
        order = sorted(range(len(slots)), key=lambda b: slots[b])
        pad_to = 0
        if self.pad_ragged and max(lens) <= PAD_RAGGED_MAX and min(lens) < max(lens):
            in_order = [slots[b] for b in order]
            if len(set(in_order)) == len(in_order) and _pad_pays(in_order, [lens[b] for b in order]):
                pad_to = max(lens)
        cells = self._cells_per_slot
        padded = [max(n, min(pad_to, cells - st)) for n, st in zip(lens, starts)]  # padding stays in the stream
        if sum(padded) <= self.n_batch:
            self._decode([(b, 0, lens[b], padded[b]) for b in order], slots, starts, tokens, rows, out, out_at)
        else:  # long prefill: chunks of at most n_batch tokens, one sequence after another
            for b in order:
                for c0 in range(0, lens[b], self.n_batch):
                    self._decode([(b, c0, min(lens[b], c0 + self.n_batch), 0)], slots, starts, tokens, rows, out, out_at)
        for b in order:
            self._lens[slots[b]] = starts[b] + lens[b]
            if lens[b] < padded[b]:  # the padding's cells
                self._ll.llama_memory_seq_rm(self._mem, slots[b], starts[b] + lens[b], -1)
        return torch.from_numpy(out)

    def _decode(self, pieces, slots, starts, tokens, rows, out, out_at) -> None:
        """One llama_decode of pieces (b, from, to, padded length): tokens[b][from:to] of sequence
        b at positions starts[b]+from.., then padding (the last token repeated) up to the padded
        length; copies the wanted rows' logits into out."""
        ll, batch = self._ll, self._batch
        n, wanted = 0, []  # wanted: (batch index, output row)
        for b, lo, hi, padded in pieces:
            want = {r: out_at[b] + j for j, r in enumerate(rows[b]) if lo <= r < hi}
            seq, toks = slots[b], tokens[b]
            for i in range(lo, max(hi, lo + padded)):
                batch.token[n] = toks[min(i, hi - 1)]
                batch.pos[n] = starts[b] + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = i in want
                if i in want:
                    wanted.append((n, want[i]))
                n += 1
        batch.n_tokens = n
        rc = ll.llama_decode(self._ctx, batch)
        if rc != 0:
            for b, lo, _, _ in pieces:  # leave every sequence at its start: nothing half-written
                self._seq_rm(slots[b], starts[b])
                self._lens[slots[b]] = starts[b]
            raise RuntimeError(f"llama_decode failed (code {rc}) on a batch of {n} tokens")
        vocab = self.shape.vocab
        for i, row in wanted:
            out[row] = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, i), shape=(vocab,))

    def warm_up(self) -> None:
        """Commit the engine's peak memory before serving: one decode of n_batch tokens, every
        row's logits wanted (spread over empty slots), then the cells forgotten. llama.cpp grows
        its logits buffer to the most rows one decode has asked for and touches its compute
        buffer's pages as larger graphs first use them -- together ~0.38 MiB a row for a 49k
        vocabulary, ~190 MiB at n_batch = 512 (measured). Without this the RSS steps up
        mid-service, the first time a large verification step comes: it looks like a leak to
        whoever watches memory, and a memory limit is hit under load instead of at start. Call
        it on the thread that drives the engine (see set_prefix), while every slot is empty."""
        if any(self._lens):
            raise RuntimeError("warm_up needs every slot empty")
        per, slots, left = min(self.max_context, self._cells_per_slot), [], self.n_batch
        for slot in range(self.max_slots):
            if left <= 0:
                break
            slots.append((slot, min(per, left)))
            left -= slots[-1][1]
        token = self.shape.eos_token_id
        self.forward([s for s, _ in slots], [0] * len(slots), [[token] * n for _, n in slots])
        for slot, _ in slots:
            self._seq_rm(slot, 0)

    # -- cache management ---------------------------------------------------------
    def _seq_rm(self, slot: int, p0: int) -> None:
        if p0 < self._lens[slot] or p0 == 0:
            self._ll.llama_memory_seq_rm(self._mem, slot, p0, -1)
            self._lens[slot] = min(self._lens[slot], p0)

    def truncate(self, slot: int, length: int) -> None:
        check_slot(self, slot)
        if not 0 <= length <= self.max_context:
            raise ValueError(f"truncate length {length} is outside [0, {self.max_context}]")
        self._seq_rm(slot, length)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Streams are copied whole (llama.cpp copies across streams only whole buffers):
        cut src to `length`, copy it over dst, empty src."""
        check_slot(self, src, "source slot")
        check_slot(self, dst, "destination slot")
        if src == dst:
            raise ValueError(f"move_slot from slot {src} to itself")
        if not 0 <= length <= self._lens[src]:
            raise ValueError(f"move_slot length {length} is outside [0, {self._lens[src]}] (slot {src}'s length)")
        self._seq_rm(src, length)
        self._copy_stream(src, dst)
        self._seq_rm(src, 0)

    # -- a shared prompt prefix (not in the contract) -------------------------------------
    @property
    def supports_prefix(self) -> bool:
        return self._prefix_slot is not None

    def set_prefix(self, tokens: Sequence[int]) -> None:
        """The prefix many prompts share. Prefilled into the prefix stream by the first
        `load_prefix`, not here: llama.cpp's compute must stay on the one thread that drives the
        engine (a llama_decode from any other thread, such as the server's start-up thread, made
        every later step ~50% slower: OpenMP keeps a team per calling thread). Its cells are what a
        slot's prefill of the same tokens would cache, bit for bit: every kernel used computes
        each row on its own (above)."""
        if self._prefix_slot is None:
            raise ValueError("this engine was built without prefix_stream")
        if not 0 < len(tokens) <= min(self.n_batch, self.max_context):
            raise ValueError(f"a prefix of {len(tokens)} tokens: need 1..{min(self.n_batch, self.max_context)}")
        self._seq_rm(self._prefix_slot, 0)
        self._prefix_tokens = list(tokens)

    def load_prefix(self, slot: int) -> int:
        """Slot `slot` becomes a copy of the prefix stream (a whole-stream copy, ~2.6 ms for 2,048
        cells here, against ~1.6 ms a prompt token of prefill) -> the prefix length."""
        check_slot(self, slot)
        s = self._prefix_slot
        if not self._lens[s]:  # first use since set_prefix
            n = len(self._prefix_tokens)
            self._decode([(0, 0, n, n)], [s], [0], [self._prefix_tokens], [[]],
                         np.empty((0, self.shape.vocab), dtype=np.float32), [0])
            self._lens[s] = n
        self._copy_stream(s, slot)
        return self._lens[slot]

    # -- cells kept after a sequence left (not in the contract) --------------------------
    def retain(self, slot: int, stream: int, length: int) -> None:
        """Retained stream `stream` (0..retain_streams-1) keeps the first `length` cells of `slot`
        (a whole-stream copy, then cut): bit for bit what a prefill of the same tokens caches."""
        check_slot(self, slot)
        s = self._retained(stream)
        if not 0 < length <= self._lens[slot]:
            raise ValueError(f"retain length {length} is outside [1, {self._lens[slot]}] (slot {slot}'s length)")
        self._copy_stream(slot, s, length)

    def restore(self, stream: int, slot: int, length: int) -> None:
        """Slot `slot` becomes the first `length` cells of retained stream `stream`, which keeps them."""
        check_slot(self, slot)
        s = self._retained(stream)
        if not 0 < length <= self._lens[s]:
            raise ValueError(f"restore length {length} is outside [1, {self._lens[s]}] (stream {stream}'s length)")
        self._copy_stream(s, slot, length)

    def _retained(self, stream: int) -> int:
        if not 0 <= stream < self.retain_streams:
            raise ValueError(f"retained stream {stream} is outside [0, {self.retain_streams})")
        return self.max_slots + stream

    def copy_slot(self, src: int, dst: int) -> None:
        """dst becomes a copy of src (both keep it). Not in the contract: the cost profiler
        fills many slots with one prefill this way."""
        check_slot(self, src, "source slot")
        check_slot(self, dst, "destination slot")
        self._copy_stream(src, dst)

    def _copy_stream(self, src: int, dst: int, length: int = -1) -> None:
        """dst becomes a copy of stream src (llama.cpp copies across streams only whole), cut to
        `length` cells (-1: all of them); src keeps its cells."""
        self._seq_rm(dst, 0)
        self._ll.llama_memory_seq_cp(self._mem, src, dst, -1, -1)
        self._lens[dst] = self._lens[src]
        if length >= 0:
            self._seq_rm(dst, length)

    def close(self) -> None:
        """Free llama.cpp's context, batch and model (also at garbage collection)."""
        ll = getattr(self, "_ll", None)
        if ll is None:
            return
        if getattr(self, "_ctx", None):
            ll.llama_batch_free(self._batch)
            ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass
