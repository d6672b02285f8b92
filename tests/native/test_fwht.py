"""specserve's fast Walsh-Hadamard transform (native/llama_cpp/fwht.cpp) on its own, compiled here:
the SIMD rows equal the plain-C specification, ggml's order of butterflies, bit for bit, and the
specification is a Hadamard transform (orthonormal: applied twice it gives the input back)."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from tests.native.test_q8_lanes import AVX512
from tests.native.test_q8_matmul import compiled

ROOT = Path(__file__).resolve().parents[2]
PATHS = {"avx512": (AVX512, ("-march=native",)), "plain": (set(), ())}


@pytest.fixture(scope="module", params=sorted(PATHS))
def fwht(request, tmp_path_factory):
    k = compiled(PATHS, request.param, [ROOT / "native" / "llama_cpp" / "fwht.cpp"], tmp_path_factory)
    for fn in (k.specserve_fwht_row, k.specserve_fwht_row_ref):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    k.specserve_fwht_row.restype = ctypes.c_int
    k.path = request.param
    return k


def run(fn, x, scale):
    out = np.full_like(x, np.nan)
    ok = fn(x.ctypes.data, out.ctypes.data, x.size, scale)
    return ok, out


@pytest.mark.parametrize("n", [16, 32, 64, 128, 256, 1024])
def test_simd_equals_ggmls_order_bit_for_bit(fwht, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-5, 1.0, 1e4], size=n)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(n))
    _, want = run(fwht.specserve_fwht_row_ref, x, scale)
    ok, got = run(fwht.specserve_fwht_row, x, scale)
    if fwht.path == "plain":
        assert ok == 0 and np.isnan(got).all()  # declines, writes nothing: ggml's code runs
        return
    assert ok == 1
    assert got.tobytes() == want.tobytes()
    inplace = x.copy()  # ggml may hand the same buffer as source and destination
    fwht.specserve_fwht_row(inplace.ctypes.data, inplace.ctypes.data, n, scale)
    assert inplace.tobytes() == want.tobytes()


def test_the_specification_is_an_orthonormal_hadamard_transform(fwht):
    n = 64
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    _, y = run(fwht.specserve_fwht_row_ref, x, np.float32(1 / 8))
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=np.float64) / 8
    assert np.allclose(y, h @ x, atol=1e-5)
    _, back = run(fwht.specserve_fwht_row_ref, y, np.float32(1 / 8))
    assert np.allclose(back, x, atol=1e-5)


def test_sizes_it_cannot_take_are_declined(fwht):
    x = np.ones(8, dtype=np.float32)
    assert run(fwht.specserve_fwht_row, x, 1.0)[0] == 0
    assert run(fwht.specserve_fwht_row, np.ones(48, dtype=np.float32), 1.0)[0] == 0
