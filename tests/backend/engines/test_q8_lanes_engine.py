"""The rows-in-lanes arithmetic inside llama.cpp (native/llama_cpp/q8_lanes.h), on the served model:
on AVX-512 VNNI CPUs every Q8_0 weight matrix of the model goes through it at every number of rows,
so a position's logits are the same bits whether it is decoded alone, verified among t = 2..32
tokens or batched beside other sequences; they are not llama.cpp's stock bits, but as close to the
unquantized model as those; and the repacked copies live and die with the model."""
from pathlib import Path

import numpy as np
import pytest

from backend.engines import q8_kernel
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from backend.engines.torch_llama import TorchLlama
# the helpers, and the verification-against-decoding test run here again with this module's
# engine, in the lanes order (there it runs in llama.cpp's order)
from tests.backend.engines.test_q8_kernel_engine import (  # noqa: F401
    bits, prompt, step, test_a_position_is_the_same_verified_in_one_step_or_decoded_one_by_one)

ROOT = Path(__file__).resolve().parents[3]
CTX = 96  # cached tokens before the measured steps

pytestmark = pytest.mark.skipif(not q8_kernel.lanes_enabled(),
                                reason="the lanes arithmetic serves AVX-512 VNNI CPUs only (q8_lanes.h)")


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=4, max_context=CTX + 80)
    yield eng
    q8_kernel.set_enabled(True)
    q8_kernel.set_lanes_enabled(True)
    eng.close()


@pytest.mark.parametrize("t", [1, 8])
def test_every_matmul_of_a_step_takes_the_lanes_path(engine, t):
    step(engine, [0], [prompt(0, CTX)], [0])
    before = q8_kernel.calls()
    step(engine, [0], [prompt(1, t)], [CTX])
    after = q8_kernel.calls()
    assert after["lanes"] - before["lanes"] == 30 * 7 + 1  # 7 matrices a layer and the output
    assert after["matmul"] == before["matmul"]  # none left to the stock order
    # K and V take Q's layout of the normed rows, up takes gate's: laid out 4 times a layer, not 7
    assert after["lanes_reused"] - before["lanes_reused"] == 30 * 3
    # the model's weights, repacked once (138 MB of Q8_0 for this model)
    assert 130e6 < q8_kernel.lanes_bytes() < 160e6


def test_a_warm_step_finds_every_copy_without_the_registry_lock(engine):
    """Each thread remembers the copies it was given (lanes_weights.cpp): under the registry's mutex
    the two threads met several times a step and slept on it (decoding 9.7 -> 5.8 ms without)."""
    for t in (1, 8):  # every thread asks for every matrix once since the registry last changed (another engine)
        step(engine, [0], [prompt(2, t)], [0])
    before = q8_kernel.calls()
    for t in (1, 3, 8):
        step(engine, [0], [prompt(3, t)], [0])
    after = q8_kernel.calls()
    assert after["lanes"] - before["lanes"] == 3 * (30 * 7 + 1)
    assert after["lanes_locked"] == before["lanes_locked"]


def test_a_long_prefill_splits_its_rows_between_threads_and_keeps_every_bit(engine):
    """Past 64 rows each thread lays out and multiplies its own share of the rows (ggml_hook.c):
    still every matrix in the lanes order, and every position's logits the bits of the same tokens
    prefilled in pieces of at most 64, where each thread takes all rows and a share of the weights."""
    toks = prompt(60, 150)
    before = q8_kernel.calls()
    whole = step(engine, [0], [toks], [0])
    after = q8_kernel.calls()
    assert after["lanes"] - before["lanes"] == 30 * 7 + 1
    assert after["matmul"] == before["matmul"]
    assert after["lanes_reused"] - before["lanes_reused"] == 30 * 3
    pieces = [step(engine, [0], [toks[a:b]], [a]) for a, b in ((0, 40), (40, 104), (104, 150))]
    assert np.array_equal(bits(whole), np.concatenate([bits(x) for x in pieces]))


def test_a_decoding_row_is_the_same_alone_and_in_a_batch(engine):
    for s in range(4):
        step(engine, [s], [prompt(20 + s, CTX)], [0])
    news = [[prompt(30 + s, 1)[0]] for s in range(4)]
    batched = step(engine, [0, 1, 2, 3], news, [CTX] * 4)
    alone = [step(engine, [s], [news[s]], [CTX]) for s in range(4)]
    assert np.array_equal(bits(batched), np.concatenate([bits(x) for x in alone]))


def test_as_close_to_the_unquantized_model_as_the_stock_kernels(engine, checkpoint, tokenizer):
    """Another order of float sums, not another model: on real text, the logits' error against the
    fp32 model and how often the top token is fp32's are those of the stock kernels. (The two differ
    from each other about as much as either from fp32: a last-bit change flips some of the next
    layer's int8 roundings. Measured over 2,880 positions of README text: mean |error| 0.2138 vs
    0.2139, top token fp32's 95.2% vs 94.7%.)"""
    ref = TorchLlama(checkpoint, dtype="fp32", max_slots=1, max_context=CTX)
    paragraphs = [p for p in (ROOT / "docs" / "architecture.md").read_text().split("\n\n") if len(p) > 400][:6]
    err = {"lanes": [], "stock": []}
    top = {"lanes": [], "stock": []}
    for text in paragraphs:
        p = tokenizer(text)["input_ids"][:CTX]
        want = ref.forward([0], [0], [p], logit_rows=[list(range(len(p)))]).float().numpy()
        for name, lanes in (("lanes", True), ("stock", False)):
            q8_kernel.set_lanes_enabled(lanes)
            got = step(engine, [0], [p], [0]).numpy()
            err[name].append(np.abs(got - want).mean())
            top[name] += list(got.argmax(1) == want.argmax(1))
        q8_kernel.set_lanes_enabled(True)
    assert len(top["lanes"]) > 300
    assert np.mean(err["lanes"]) < 1.1 * np.mean(err["stock"]), err
    assert np.mean(top["lanes"]) > np.mean(top["stock"]) - 0.03, {k: np.mean(v) for k, v in top.items()}


def test_the_copies_are_freed_with_their_model(checkpoint):
    held = q8_kernel.lanes_bytes()
    other = LlamaCpp(served_gguf(checkpoint), max_slots=1, max_context=64)
    step(other, [0], [prompt(50, 3)], [0])
    assert q8_kernel.lanes_bytes() > held + 130e6  # a second model: its own copies
    other.close()
    assert q8_kernel.lanes_bytes() == held
