"""specserve's attention scores with the queries in SIMD lanes (native/llama_cpp/attn_scores.cpp) on
their own, compiled here: every score equals, bit for bit, the plain-C specification of
attn_scores.h (per block an exact int32 sum, then fma(fp32(d_q) x fp32(d_k), s, acc)); a query's
scores do not depend on the other queries of the call, on its lane or on how many keys the call
walks. Inside llama.cpp: tests/backend/engines/test_q8_lanes_engine.py (verification equals
decoding at tolerance 0)."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from tests.native.test_q8_lanes import AVX512
from tests.native.test_q8_matmul import BLOCK, blocks, compiled

ROOT = Path(__file__).resolve().parents[2]
SRCS = [ROOT / "native" / "llama_cpp" / f for f in ("attn_scores.cpp", "q8_lanes.cpp", "q8_matmul.cpp")]
PATHS = {"avx512vnni": (AVX512, ("-march=native",)), "plain": (set(), ())}


@pytest.fixture(scope="module", params=sorted(PATHS))
def kernel(request, tmp_path_factory):
    k = compiled(PATHS, request.param, SRCS, tmp_path_factory)
    for fn in (k.specserve_attn_scores, k.specserve_attn_scores_ref):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]
    k.specserve_attn_scores_compiled.restype = ctypes.c_int
    assert k.specserve_attn_scores_compiled() == (request.param == "avx512vnni")
    return k


def scores(fn, keys, queries, n_keys=None, pad=None):
    n_keys = keys.shape[0] if n_keys is None else n_keys
    pad = (n_keys + 15) // 16 * 16 if pad is None else pad
    out = np.full((queries.shape[0], pad), np.nan, dtype=np.float32)
    fn(keys.ctypes.data, keys.strides[0], n_keys, queries.ctypes.data, queries.strides[0], queries.shape[0],
       queries.shape[1], out.ctypes.data, pad)
    return out


def test_one_score_worked_by_hand(kernel):
    q = np.zeros((1, 1), dtype=BLOCK)
    k = np.zeros((1, 1), dtype=BLOCK)
    q["qs"][0, 0, :3], q["d"] = [3, -2, 127], 0.5
    k["qs"][0, 0, :3], k["d"] = [5, 7, -128], 0.25
    got = scores(kernel.specserve_attn_scores, k, q)
    assert got[0, 0] == np.float32(0.5 * 0.25 * (15 - 14 - 127 * 128))
    assert (got[0, 1:] == 0).all()  # past the keys: zeros up to the pad


@pytest.mark.parametrize("nq", [1, 3, 12, 16, 17, 40])
@pytest.mark.parametrize("n_keys, nb", [(1, 2), (7, 2), (33, 2), (264, 2), (20, 1), (19, 4)])
def test_equals_the_specification_bit_for_bit(kernel, nq, n_keys, nb):
    rng = np.random.default_rng(nq * 1000 + n_keys * 10 + nb)
    keys, queries = blocks(rng, n_keys, nb), blocks(rng, nq, nb, scale=0.5)
    want = scores(kernel.specserve_attn_scores_ref, keys, queries)
    got = scores(kernel.specserve_attn_scores, keys, queries)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # and it is the score the arithmetic says, to fp32 rounding
    exact = np.einsum("qbi,kbi->qkb", queries["qs"].astype(np.float64), keys["qs"].astype(np.float64))
    exact = (exact * queries["d"].astype(np.float64)[:, None, :] * keys["d"].astype(np.float64)[None, :, :]).sum(-1)
    np.testing.assert_allclose(got[:, :n_keys], exact, rtol=1e-5, atol=1e-6 * np.abs(exact).max())


def test_a_query_is_the_same_alone_in_any_lane_and_over_fewer_keys(kernel):
    """Batch invariance: query i's scores equal it scored alone, in another position of another
    call, and with the walk cut short (the keys a call covers depend on the other queries)."""
    rng = np.random.default_rng(7)
    keys, queries = blocks(rng, 100, 2), blocks(rng, 24, 2, scale=0.5)
    full = scores(kernel.specserve_attn_scores, keys, queries)
    for i in (0, 5, 15, 16, 23):
        alone = scores(kernel.specserve_attn_scores, keys, queries[i:i + 1])
        np.testing.assert_array_equal(alone[0, :100].view(np.uint32), full[i, :100].view(np.uint32))
        moved = scores(kernel.specserve_attn_scores, keys, np.concatenate([queries[:3], queries[i:i + 1]]))
        np.testing.assert_array_equal(moved[3, :100].view(np.uint32), full[i, :100].view(np.uint32))
        fewer = scores(kernel.specserve_attn_scores, keys, queries, n_keys=37)
        np.testing.assert_array_equal(fewer[i, :37].view(np.uint32), full[i, :37].view(np.uint32))


def test_extreme_quants_are_exact(kernel):
    """-128 and 127 everywhere: the offset's correction and the int32 sums stay exact."""
    rng = np.random.default_rng(3)
    keys, queries = blocks(rng, 40, 2), blocks(rng, 18, 2)
    keys["qs"][::2], queries["qs"][::3] = -128, -128
    keys["qs"][1::2], queries["qs"][1::3] = 127, 127
    want = scores(kernel.specserve_attn_scores_ref, keys, queries)
    got = scores(kernel.specserve_attn_scores, keys, queries, pad=64)
    np.testing.assert_array_equal(got[:, :48].view(np.uint32), want.view(np.uint32))
    assert (got[:, 40:] == 0).all()
