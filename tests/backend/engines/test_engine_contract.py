"""The engine contract (backend/engines/contract.py), checked on every engine in ENGINES.

Each test is one thing the draft-verify loop relies on: ragged batching, logits on
chosen rows, chunked prefill, truncation of rejected drafts, slot moves, limits and
cost metadata. A new engine joins by adding one EngineCase to ENGINES: how to build it
from the default model's directory, how to measure its KV cache's real size, and the
logit tolerance of its batch invariance (0.0 for a bit-identical engine).

Tolerance: the torch engine in bf16 (the served dtype) is bit-identical, atol 0.0: it
runs batch-invariant by default (TorchLlama(batch_invariant=True): linear layers never see
fewer than 8 rows, attention sees whole tiles of query rows and keys, so every kernel sums a
row in the same order whatever shares the forward). Without that, bf16 logits of one token
moved by 0.1-0.5 between batch shapes. The fp32 engine is not bit-identical across batch
shapes (MKL's sgemm blocks differently for B*S rows than for n rows), but it is close: the
largest |logit difference| these tests see is 5.0e-5 (1 or 2 threads; logits reach ~31,
about 13 float32 ulps there), so it declares 1e-4. Every comparison also asserts greedy
(argmax) equality.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

import pytest
import torch

from backend.engines import Engine, ModelShape
from backend.engines.torch_llama import TorchLlama

SLOTS, CTX = 4, 64  # small: every slot is allocated up front by some engines


@dataclass(frozen=True)
class EngineCase:
    id: str
    build: Callable[[Path, int, int], Engine]  # (model directory, max_slots, max_context) -> engine
    kv_bytes: Callable[[Engine], int]  # bytes the KV cache really occupies, read from the engine's storage
    atol: float  # largest |logit difference| batch invariance may show (0.0: bit-identical)


def _torch_fp32(model_dir: Path, max_slots: int, max_context: int) -> TorchLlama:
    return TorchLlama(model_dir, dtype="fp32", max_slots=max_slots, max_context=max_context)


def _torch_bf16(model_dir: Path, max_slots: int, max_context: int) -> TorchLlama:
    return TorchLlama(model_dir, dtype="bf16", max_slots=max_slots, max_context=max_context)


def _torch_kv_bytes(engine: TorchLlama) -> int:
    return sum(t.numel() * t.element_size() for t in engine.k_cache + engine.v_cache)


def _llama_cpp(model_dir: Path, max_slots: int, max_context: int):
    from backend.engines.llama_cpp import LlamaCpp, served_gguf
    return LlamaCpp(served_gguf(model_dir), max_slots=max_slots, max_context=max_context)


def _llama_cpp_kv_bytes(engine) -> int:
    return engine.kv_reported_bytes  # llama.cpp's own report of the cache it allocated


ENGINES: List[EngineCase] = [
    EngineCase("torch-fp32", _torch_fp32, _torch_kv_bytes, atol=1e-4),  # measured max 5.0e-5
    EngineCase("torch-bf16", _torch_bf16, _torch_kv_bytes, atol=0.0),  # batch-invariant: bit-identical
    EngineCase("llama.cpp", _llama_cpp, _llama_cpp_kv_bytes, atol=0.0),  # the served GGUF, Q8_0 KV: bit-identical
]


@pytest.fixture(scope="module", params=ENGINES, ids=lambda c: c.id)
def case(request, checkpoint):
    """(EngineCase, engine): one engine per case for the whole module; each test fills the
    slots it uses from position 0, so tests do not depend on each other's cache contents."""
    return request.param, request.param.build(checkpoint, SLOTS, CTX)


@pytest.fixture(scope="module")
def texts(tokenizer):
    """Three short real prompts (11-12 tokens each)."""
    return [tokenizer(t).input_ids for t in ("The capital of France is Paris. The capital of Germany is",
                                             "Speculative decoding drafts tokens cheaply and verifies them.",
                                             "def add(a, b):\n    return a + b")]


def assert_close(case: EngineCase, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    assert diff <= case.atol, f"max |logit difference| {diff:.2e} > {case.atol:.0e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1)), "greedy choice differs"


def test_engine_declares_the_contract(case):
    c, eng = case
    assert isinstance(eng, Engine) and isinstance(eng.shape, ModelShape)
    assert eng.max_slots == SLOTS and eng.max_context == CTX
    assert 0 <= eng.shape.eos_token_id < eng.shape.vocab
    assert isinstance(eng.name, str) and eng.name
    assert isinstance(eng.supports_hidden, bool)


@pytest.mark.parametrize("slots", [[0, 1, 2], [3, 0, 2]], ids=["contiguous", "scattered"])
def test_ragged_forward_equals_each_sequence_alone(case, texts, slots):
    """Three sequences at different starts appending 4, 1 and 6 tokens (a verification,
    a decode and a prefill chunk) in one forward give each one's logits alone, in batch
    order, every new position when logit_rows is None. Prefill (start 0) too."""
    c, eng = case
    cut = [8, 10, 6]
    alone_prefill, alone_step = [], []
    for slot, ids, k in zip(slots, texts, cut):
        alone_prefill.append(eng.forward([slot], [0], [ids[:k]]))
        alone_step.append(eng.forward([slot], [k], [ids[k:k + 6]]))
    assert [len(r) for r in alone_step] == [len(ids[k:k + 6]) for ids, k in zip(texts, cut)] == [4, 1, 6]
    assert_close(c, eng.forward(slots, [0, 0, 0], [ids[:k] for ids, k in zip(texts, cut)]), torch.cat(alone_prefill))
    got = eng.forward(slots, cut, [ids[k:k + 6] for ids, k in zip(texts, cut)])
    assert got.dtype == torch.float32 and got.shape == (11, eng.shape.vocab)
    assert_close(c, got, torch.cat(alone_step))


def test_a_token_alone_equals_it_inside_batches_of_every_size(case, texts):
    """A token decoded alone gives the logits it gets as the first of 1..5 drafts under
    verification inside forwards of 1 to 40 rows: other sequences append prefill chunks of
    mixed lengths beside it, before or after it in batch order, in scattered slots."""
    c, eng = case
    ids, k = texts[0], 8
    eng.forward([2], [0], [ids[:k]])
    want = eng.forward([2], [k], [ids[k:k + 1]])
    pool = texts[1] + texts[2] + texts[0]
    for total in [*range(1, 13), 16, 21, 27, 33, 40]:
        mine = min(total, 1 + total % 5)
        drafts = (ids[k:] + pool)[:mine]
        rest, others = total - mine, []
        for j in range(3):  # split the other rows over slots 3, 0, 1 in uneven chunks
            n = rest if j == 2 else rest * (j + 1) // 6
            if n:
                others.append(pool[j: j + n])
            rest -= n
        slots, starts, tokens = [3, 0, 1][:len(others)], [0] * len(others), others
        at = total % (len(others) + 1)  # where the sequence sits in batch order
        slots, starts, tokens = slots[:at] + [2] + slots[at:], starts[:at] + [k] + starts[at:], tokens[:at] + [drafts] + tokens[at:]
        assert sum(map(len, tokens)) == total
        got = eng.forward(slots, starts, tokens, logit_rows=[[0] if s == 2 else [] for s in slots])
        assert_close(c, got, want)


def test_logit_rows_select_exactly_those_rows_in_order(case, texts):
    """logit_rows[b] picks rows of sequence b in the given order; an empty list gives none;
    rows are laid out sequence by sequence."""
    c, eng = case
    a, b = texts[0], texts[1]
    full = eng.forward([0, 1], [0, 0], [a, b])
    assert full.shape == (len(a) + len(b), eng.shape.vocab)
    for rows in ([[0, 3, len(a) - 1], [2]], [[], [0, len(b) - 1]], [[len(a) - 1], []]):
        got = eng.forward([0, 1], [0, 0], [a, b], logit_rows=rows)
        want = full[[r for r in rows[0]] + [len(a) + r for r in rows[1]]]
        assert_close(c, got, want)


def test_prefill_then_decode_equals_one_longer_prefill(case, texts):
    """Chunked prefill, single-token decode steps and a multi-token step give the logits of
    one prefill of the whole sequence (what verifying drafts against plain decoding needs)."""
    c, eng = case
    ids = texts[0]
    one = eng.forward([1], [0], [ids])
    parts = [eng.forward([2], [0], [ids[:5]]), eng.forward([2], [5], [ids[5:6]]), eng.forward([2], [6], [ids[6:7]]),
             eng.forward([2], [7], [ids[7:]])]
    assert_close(c, torch.cat(parts), one)


@pytest.mark.parametrize("accepted", [0, 2])
def test_truncate_then_forward_equals_never_having_seen_rejected_tokens(case, texts, accepted):
    """Verify 4 wrong drafts, accept `accepted` of them, truncate to the accepted length and
    continue: the continuation equals a slot that only ever saw the accepted tokens."""
    c, eng = case
    ids, n = texts[1], 5
    kept = ids[n:n + accepted]
    clean = eng.forward([0], [0], [ids[:n] + kept + ids[n + 4:]])  # the sequence without the rejected tokens
    eng.forward([3], [0], [ids[:n]])
    drafts = kept + [17, 18, 19, 20][accepted:]
    verify = eng.forward([3], [n], [drafts])
    assert_close(c, verify[:accepted], clean[n: n + accepted])  # the accepted drafts' rows
    eng.truncate(3, n + accepted)
    cont = eng.forward([3], [n + accepted], [ids[n + 4:]])
    assert_close(c, cont, clean[n + accepted:])


def test_a_forward_at_an_earlier_start_overwrites_without_truncate(case, texts):
    """The contract's implicit truncate: a forward at start s forgets the slot's positions >= s."""
    c, eng = case
    ids, n = texts[2], 6
    eng.forward([2], [0], [ids[:n] + [99] * 5])  # 5 tokens that will be forgotten
    cont = eng.forward([2], [n], [ids[n:]])
    assert_close(c, cont, eng.forward([0], [0], [ids])[n:])


def test_truncate_to_zero_empties_the_slot(case, texts):
    c, eng = case
    eng.forward([1], [0], [texts[0]])
    eng.truncate(1, 0)
    assert_close(c, eng.forward([1], [0], [texts[1]]), eng.forward([2], [0], [texts[1]]))


def test_move_slot_preserves_a_sequences_continuation(case, texts):
    """Move a sequence into a slot that held a longer one: its continuation is what it
    would have been in place; the source slot is empty and takes a new sequence."""
    c, eng = case
    ids, k = texts[2], 8
    want = eng.forward([0], [0], [ids])[k:]
    eng.forward([1], [0], [texts[0] + texts[1]])  # dst holds something longer first
    eng.forward([3], [0], [ids[:k]])
    eng.move_slot(3, 1, k)
    assert_close(c, eng.forward([1], [k], [ids[k:]]), want)
    assert_close(c, eng.forward([3], [0], [texts[0]]), eng.forward([2], [0], [texts[0]]))


def test_slot_out_of_range_is_a_clear_error(case):
    c, eng = case
    for bad in (-1, SLOTS):
        with pytest.raises(ValueError, match="slot"):
            eng.forward([bad], [0], [[1, 2]])
        with pytest.raises(ValueError, match="slot"):
            eng.truncate(bad, 0)
        with pytest.raises(ValueError, match="slot"):
            eng.move_slot(bad, 0, 1)
        with pytest.raises(ValueError, match="slot"):
            eng.move_slot(0, bad, 1)
    with pytest.raises(ValueError, match="slot"):
        eng.forward([1, 1], [0, 0], [[1], [2]])  # the same slot twice in one batch


def test_context_window_is_enforced(case, texts):
    """start + len(tokens) may reach max_context exactly, not pass it."""
    c, eng = case
    full = (texts[0] * CTX)[:CTX]
    assert eng.forward([0], [0], [full], logit_rows=[[CTX - 1]]).shape == (1, eng.shape.vocab)
    with pytest.raises(ValueError, match="context window"):
        eng.forward([0], [CTX], [[1]])
    with pytest.raises(ValueError, match="context window"):
        eng.forward([0], [CTX - 2], [[1, 2, 3]])
    with pytest.raises(ValueError):
        eng.truncate(0, CTX + 1)


def test_a_refused_batch_changes_nothing(case, texts):
    """Malformed batches raise ValueError before anything is written: a valid sequence in the
    same batch (here: rewriting a prefix of slot 0) does not touch the cache."""
    c, eng = case
    ids, k = texts[0], 8
    eng.forward([0], [0], [ids[:k]])
    want = eng.forward([1], [0], [ids])[k:]
    junk = [5, 6, 7]
    for slots, starts, tokens, rows in (
            ([0, 1], [2, 0], [junk, []], None),  # a sequence without tokens
            ([0, 1], [2, 0], [junk, [eng.shape.vocab]], None),  # a token outside the vocabulary
            ([0, 1], [2, -1], [junk, [1]], None),  # a negative start
            ([0, 1], [2, CTX], [junk, [1]], None),  # past the context window
            ([0, 1], [2, 0], [junk, [1, 2]], [[0], [2]]),  # a logit row outside the new tokens
            ([0, 1], [2, 0], [junk, [1, 2]], [[0], [1, 0]]),  # logit rows out of order
            ([0, 1], [2, 0], [junk, [1, 2]], [[0]]),  # logit_rows for one sequence of two
            ([0, 1], [2], [junk, [1]], None),  # fewer starts than sequences
    ):
        with pytest.raises(ValueError):
            eng.forward(slots, starts, tokens, logit_rows=rows)
    assert_close(c, eng.forward([0], [k], [ids[k:]]), want)


def test_cost_metadata_is_positive_and_matches_the_cache(case):
    """kv_bytes_per_token * kv_capacity_tokens is what the KV cache really occupies (an
    engine may keep up to 5% more as scratch/padding), and the capacity holds at least one
    full-length sequence (llama.cpp rounds each sequence's stream up to 256 cells, so its
    capacity exceeds SLOTS * CTX at this small CTX)."""
    c, eng = case
    bpt, cap = eng.kv_bytes_per_token, eng.kv_capacity_tokens
    assert isinstance(bpt, int) and bpt > 0
    assert isinstance(cap, int) and CTX <= cap
    real = c.kv_bytes(eng)
    assert bpt * cap <= real <= 1.05 * bpt * cap, (real, bpt, cap)


def test_hidden_states_when_supported(case, texts):
    """return_hidden gives every new position's hidden state in batch order (whatever
    logit_rows says) and leaves the logits unchanged; an engine without it says so."""
    c, eng = case
    a, b = texts[0], texts[1][:5]
    if not eng.supports_hidden:
        with pytest.raises(NotImplementedError):
            eng.forward([0], [0], [a], return_hidden=True)
        return
    rows = [[len(a) - 1], [0, 4]]
    logits, hidden = eng.forward([0, 1], [0, 0], [a, b], logit_rows=rows, return_hidden=True)
    assert_close(c, logits, eng.forward([0, 1], [0, 0], [a, b], logit_rows=rows))
    assert hidden.dim() == 2 and hidden.shape[0] == len(a) + len(b)
    _, ha = eng.forward([2], [0], [a], return_hidden=True)
    _, hb = eng.forward([3], [0], [b], return_hidden=True)
    diff = (hidden.float() - torch.cat([ha, hb]).float()).abs().max().item()
    assert diff <= c.atol, f"hidden states depend on the batch: max |diff| {diff:.2e}"
