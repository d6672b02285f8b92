"""Our kernels inside llama.cpp (native/llama_cpp), on the served model: set-up built them in,
the model's matmuls and attention go through them, and with the rows-in-lanes arithmetic off
(its own order: tests/backend/engines/test_q8_lanes_engine.py) every logit is bit-identical to
llama.cpp's stock kernels (switched at run time in the same process) and the same whatever
else shares the step -- decoding, verification of t = 2..32 tokens, batches, prefill."""
import numpy as np
import pytest

from backend.engines import q8_kernel
from backend.engines.llama_cpp import LlamaCpp, served_gguf

CTX = 96  # cached tokens before the measured steps


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=4, max_context=CTX + 80)
    yield eng
    q8_kernel.set_enabled(True)
    eng.close()


@pytest.fixture(autouse=True)
def stock_order():
    """Every matmul in llama.cpp's own order (ggml_hook.c), as the stock kernels compute it."""
    was = q8_kernel.lanes_enabled()
    q8_kernel.set_lanes_enabled(False)
    yield
    q8_kernel.set_lanes_enabled(was)


def prompt(seed, n):
    return [int(x) for x in np.random.default_rng(seed).integers(100, 40000, size=n)]


def bits(t):
    return t.numpy().view(np.uint32)


def step(engine, slots, news, starts):
    return engine.forward(slots, starts, news, logit_rows=[list(range(len(n))) for n in news])


def test_set_up_built_our_kernels_in():
    assert q8_kernel.available(), "the installed llama-cpp-python lacks native/llama_cpp: run scripts/setup.sh"
    assert q8_kernel.isa() in ("avx512vnni", "avxvnni", "avx2")
    assert q8_kernel.enabled()


SHAPES = {  # name: tokens per sequence in the step, sequences in slots 0..
    "decode 1": [1], "decode 4": [1, 1, 1, 1], "verify 2": [2], "verify 8": [8], "verify 32": [32],
    "verify 5 x 3": [5, 5, 5], "ragged": [3, 1, 9, 2], "prefill 61": [61],
}


@pytest.mark.parametrize("name", SHAPES)
def test_logits_equal_the_stock_kernels_bit_for_bit(engine, name):
    lens = SHAPES[name]
    slots = list(range(len(lens)))
    for s in slots:
        step(engine, [s], [prompt(s, CTX)], [0])
    news = [prompt(10 + s, n) for s, n in zip(slots, lens)]
    before = q8_kernel.calls()
    q8_kernel.set_enabled(True)
    ours = step(engine, slots, news, [CTX] * len(lens))
    after = q8_kernel.calls()
    q8_kernel.set_enabled(False)
    stock = step(engine, slots, news, [CTX] * len(lens))
    q8_kernel.set_enabled(True)
    assert np.array_equal(bits(ours), bits(stock)), name
    assert after["attention"] > before["attention"]  # every step's attention is ours
    assert after["matmul"] > before["matmul"]  # and its products, decoding's one row too


@pytest.fixture(scope="module")
def long_engine(checkpoint):
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=2, max_context=1100)
    step(eng, [0], [prompt(5, 1024)], [0])
    step(eng, [1], [[11] * 1024], [0])  # one token repeated: many equal keys, long equal sums
    yield eng
    q8_kernel.set_enabled(True)
    eng.close()


@pytest.mark.parametrize("slot", [0, 1])
@pytest.mark.parametrize("t", [16, 32])
def test_logits_equal_the_stock_kernels_after_a_long_context(long_engine, slot, t):
    """1,024 cached tokens: 17 blocks of keys and long softmax sums (an fma against a multiply
    and an add there once made the last bit of some sums differ: after 1,024 repeated tokens,
    not after 96)."""
    news = [[7 + i for i in range(t)]]
    q8_kernel.set_enabled(True)
    ours = step(long_engine, [slot], news, [1024])
    q8_kernel.set_enabled(False)
    stock = step(long_engine, [slot], news, [1024])
    q8_kernel.set_enabled(True)
    assert np.array_equal(bits(ours), bits(stock))


@pytest.mark.parametrize("t", [2, 7, 16, 32])
def test_a_position_is_the_same_verified_in_one_step_or_decoded_one_by_one(engine, t):
    """A verification step of t tokens against t decoding steps (tolerance 0), with a second
    sequence verifying beside it in the first case."""
    base, toks = prompt(1, CTX), prompt(2, t)
    step(engine, [0], [base], [0])
    step(engine, [1], [prompt(3, CTX)], [0])
    together = step(engine, [0, 1], [toks, prompt(4, 5)], [CTX, CTX])[:t]
    one_by_one = [step(engine, [0], [[tok]], [CTX + i]) for i, tok in enumerate(toks)]
    assert np.array_equal(bits(together), np.concatenate([bits(x) for x in one_by_one]))
