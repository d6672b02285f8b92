"""specserve's rows-in-lanes Q8_0 matmul (native/llama_cpp/q8_lanes.cpp) on its own, compiled here:
the weights repacked 16 rows to a group, the activations laid out, and every output equal, bit for
bit, to the plain-C specification of q8_lanes.h (per block an exact int32 sum, then
fma(fp32(d_w) x fp32(d_a), q, acc)) for any number of activation rows and any split of the work;
a row's result never depends on how many rows share the call (M = 1..64).
The kernel inside llama.cpp: tests/backend/engines/test_q8_lanes_engine.py."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from tests.native.test_q8_matmul import BLOCK, blocks, compiled, matmul

ROOT = Path(__file__).resolve().parents[2]
SRCS = [ROOT / "native" / "llama_cpp" / f for f in ("q8_lanes.cpp", "q8_matmul.cpp")]
AVX512 = {"avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni"}
PATHS = {  # the SIMD path the build takes on AVX-512 VNNI CPUs, and the plain C one on the packed layout
    "avx512vnni": (AVX512, ("-march=native",)),
    "plain": (set(), ()),
}


@pytest.fixture(scope="module", params=sorted(PATHS))
def lanes(request, tmp_path_factory):
    k = compiled(PATHS, request.param, SRCS, tmp_path_factory)
    k.specserve_q8_lanes_size.restype = ctypes.c_size_t
    k.specserve_q8_lanes_size.argtypes = [ctypes.c_int64, ctypes.c_int64]
    k.specserve_q8_lanes_act_size.restype = ctypes.c_size_t
    k.specserve_q8_lanes_act_size.argtypes = [ctypes.c_int64, ctypes.c_int64]
    k.specserve_q8_lanes_pack.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    k.specserve_q8_lanes_act.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    k.specserve_q8_lanes_matmul.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]
    k.specserve_q8_lanes_ref.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]
    k.specserve_q8_lanes_compiled.restype = ctypes.c_int
    assert k.specserve_q8_lanes_compiled() == (request.param == "avx512vnni")
    return k


def pack(k, w):
    out = np.zeros(k.specserve_q8_lanes_size(w.shape[0], w.shape[1]) + 64, dtype=np.uint8)
    base = (-out.ctypes.data) % 64  # 64-byte aligned, as the hook allocates it
    packed = out[base:]
    k.specserve_q8_lanes_pack(w.ctypes.data, w.strides[0], w.shape[0], w.shape[1], packed.ctypes.data)
    return packed


def lanes_matmul(k, packed, n_w, a, splits=None):
    """dst[c, r] = the lanes product of weight row r and activation row c; `splits`: the (groups,
    rows) ranges to compute in separate calls, as threads take chunks."""
    nb = a.shape[1]
    act = np.zeros(k.specserve_q8_lanes_act_size(a.shape[0], nb), dtype=np.uint8)
    k.specserve_q8_lanes_act(a.ctypes.data, a.strides[0], a.shape[0], nb, act.ctypes.data)
    out = np.full((a.shape[0], n_w), np.nan, dtype=np.float32)
    for (g0, ng), (c0, nc) in splits or [((0, n_w // 16), (0, a.shape[0]))]:
        k.specserve_q8_lanes_matmul(packed.ctypes.data, g0, ng, nb, act.ctypes.data, a.shape[0], c0, nc,
                                    out.ctypes.data, out.shape[1])
    return out


def test_one_element_worked_by_hand(lanes):
    """Per block the 32 products summed exactly, then fma(d_w x d_a, q, acc), block after block."""
    w = np.zeros((16, 2), dtype=BLOCK)
    a = np.zeros((1, 2), dtype=BLOCK)
    w["qs"][3, 0, :4], a["qs"][0, 0, :4] = [1, 2, 3, 4], [1, 1, 1, 1]     # block 0: 10
    w["qs"][3, 1, 28:], a["qs"][0, 1, 28:] = [-1, 0, 0, 0], [127, 0, 0, 0]  # block 1: -127
    w["d"], a["d"] = 0.5, [[2.0, 4.0]]                                      # d = 1.0, then 2.0
    want = np.float32(10.0 - 2 * 127.0)
    assert matmul(lanes.specserve_q8_lanes_ref, w, a)[0, 3] == want
    got = lanes_matmul(lanes, pack(lanes, w), 16, a)
    assert got[0, 3] == want and np.count_nonzero(got) == 1


@pytest.mark.parametrize("n_w,nb", [(16, 1), (32, 3), (64, 18), (48, 48), (192, 5)])
def test_equals_the_specification_bit_for_bit(lanes, n_w, nb):
    rng = np.random.default_rng(n_w * 100 + nb)
    w = blocks(rng, n_w, nb)
    packed = pack(lanes, w)
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64):
        a = blocks(rng, m, nb, scale=1.0)
        want = matmul(lanes.specserve_q8_lanes_ref, w, a)
        got = lanes_matmul(lanes, packed, n_w, a)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n_w, nb, m)


def test_differs_from_the_stock_order_only_in_rounding(lanes):
    """Not llama.cpp's order of sums (8 partial sums per row), but the same dot products."""
    rng = np.random.default_rng(3)
    w, a = blocks(rng, 64, 18), blocks(rng, 8, 18, scale=1.0)
    got = lanes_matmul(lanes, pack(lanes, w), 64, a)
    exact = np.einsum("rbi,cbi->cr", w["qs"].astype(np.float64) * w["d"].astype(np.float64)[..., None],
                      a["qs"].astype(np.float64) * a["d"].astype(np.float64)[..., None])
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_a_row_is_the_same_whatever_shares_the_call(lanes):
    """M = 1..64 rows in one call, and the work split into chunks as threads take it: each row equals
    that row computed alone (tolerance 0)."""
    rng = np.random.default_rng(7)
    w = blocks(rng, 96, 18)
    a = blocks(rng, 64, 18, scale=1.0)
    packed = pack(lanes, w)
    alone = np.concatenate([lanes_matmul(lanes, packed, 96, a[c:c + 1]) for c in range(64)])
    for m in range(1, 65):
        got = lanes_matmul(lanes, packed, 96, a[:m])
        assert np.array_equal(got.view(np.uint32), alone[:m].view(np.uint32)), m
    chunks = [((g0, 2), (c0, min(13, 64 - c0))) for g0 in (4, 0, 2) for c0 in range(0, 64, 13)]
    split = lanes_matmul(lanes, packed, 96, a, splits=chunks)
    assert np.array_equal(split.view(np.uint32), alone.view(np.uint32))


def test_extreme_quants_are_exact(lanes):
    """The offset sums (w + 128) x a of a block reach 255 x 128 x 32: far inside an int32; the
    correction -128 x sum(a) makes them exact again. -128 (not made by ggml's quantizer) too."""
    w = np.zeros((16, 2), dtype=BLOCK)
    a = np.zeros((3, 2), dtype=BLOCK)
    w["qs"], a["qs"] = 127, -128
    w["qs"][1], a["qs"][1] = -128, -128
    w["d"], a["d"] = 1.0, 1.0
    got = lanes_matmul(lanes, pack(lanes, w), 16, a)
    assert got[0, 0] == -127 * 128 * 64 and got[0, 1] == 128 * 128 * 64 and got[1, 1] == 128 * 128 * 64


def quantize_like_ggml_x86(x):
    """ggml's x86 quantize_row_q8_0, in numpy float32: d = half(amax / 127); quants x * (127 / amax)
    rounded to nearest even."""
    blk = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(blk).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    out = np.zeros(blk.shape[:2], dtype=BLOCK)
    out["d"] = (amax / np.float32(127)).astype(np.float16)
    out["qs"] = np.clip(np.rint(blk * inv[..., None]), -128, 127).astype(np.int8)
    return out


@pytest.mark.parametrize("n_a, nb", [(1, 18), (8, 18), (5, 48), (64, 3), (3, 70)])
def test_act_from_fp32_equals_ggmls_quantization_laid_out(lanes, n_a, nb):
    """The hook quantizes src1's fp32 rows itself (no shared buffer, no barrier): its layout must be
    byte for byte that of ggml's own quantization laid out, whatever the values (zeros, ties at .5,
    a block's largest value either sign, tiny and huge scales)."""
    lanes.specserve_q8_lanes_act_f32.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(n_a * 100 + nb)
    x = (rng.standard_normal((n_a, nb * 32)) * rng.choice([1e-6, 1e-2, 1.0, 300.0], size=(n_a, nb * 32))).astype(np.float32)
    x[0, :32] = 0.0                                      # an all-zero block: d = 0, quants 0
    x[-1, 32 * (nb - 1):] = np.arange(32, dtype=np.float32) - 15.5  # a ramp of half-integers
    x[:, 5] = -np.abs(x).max(axis=1)                     # the largest magnitude negative
    got = np.zeros(lanes.specserve_q8_lanes_act_size(n_a, nb), dtype=np.uint8)
    lanes.specserve_q8_lanes_act_f32(x.ctypes.data, x.strides[0], n_a, nb, got.ctypes.data)
    q = quantize_like_ggml_x86(x)
    want = np.zeros_like(got)
    lanes.specserve_q8_lanes_act(q.ctypes.data, q.strides[0], n_a, nb, want.ctypes.data)
    assert np.array_equal(got, want)
