"""specserve's RMS norm (native/llama_cpp/rms_norm.cpp) on its own, compiled here: the SIMD rows equal
the plain-C specification bit for bit, whatever the row length (tails included) and in place, and
the specification is ggml's rms_norm (a double sum of float squares, then the same float
arithmetic) up to the association of that sum."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

from tests.native.test_q8_matmul import compiled

ROOT = Path(__file__).resolve().parents[2]
PATHS = {"avx2": ({"avx2"}, ("-mavx2", "-mfma")), "plain": (set(), ())}


@pytest.fixture(scope="module", params=sorted(PATHS))
def norm(request, tmp_path_factory):
    k = compiled(PATHS, request.param, [ROOT / "native" / "llama_cpp" / "rms_norm.cpp"], tmp_path_factory)
    for fn in (k.specserve_rms_norm_row, k.specserve_rms_norm_row_ref):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    k.specserve_rms_norm_row.restype = ctypes.c_int
    k.path = request.param
    return k


def run(fn, x, w, eps=1e-5):
    y = np.full_like(x, np.nan)
    ok = fn(x.ctypes.data, None if w is None else w.ctypes.data, y.ctypes.data, x.size, eps)
    return ok, y


def ggml_rms_norm(x, w, eps=1e-5):
    """ggml's loop (ops.cpp, ggml_compute_forward_rms_norm_f32) in numpy: the squares in float, summed
    one after another in a double; mean and scale in float; y = (x * scale) * w."""
    total = 0.0
    for v in (x * x).astype(np.float64):
        total += v
    scale = np.float32(1.0) / np.sqrt(np.float32(total / x.size) + np.float32(eps))
    y = x * scale
    return y * w if w is not None else y


@pytest.mark.parametrize("n", [576, 1536, 64, 8, 17, 600])
@pytest.mark.parametrize("weighted", [True, False])
def test_simd_equals_the_specification_bit_for_bit(norm, n, weighted):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0], size=n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32) if weighted else None
    _, want = run(norm.specserve_rms_norm_row_ref, x, w)
    ok, got = run(norm.specserve_rms_norm_row, x, w)
    if norm.path == "plain":
        assert ok == 0 and np.isnan(got).all()  # declines, writes nothing: ggml's loop runs
        return
    assert ok == 1
    assert got.tobytes() == want.tobytes()
    inplace = x.copy()  # ggml may normalise in place
    norm.specserve_rms_norm_row(inplace.ctypes.data, None if w is None else w.ctypes.data, inplace.ctypes.data, n, 1e-5)
    assert inplace.tobytes() == want.tobytes()


def test_the_specification_is_ggmls_norm_up_to_the_sums_association(norm):
    rng = np.random.default_rng(0)
    same = 0
    for trial in range(50):
        x = (rng.standard_normal(576) * 3).astype(np.float32)
        w = rng.standard_normal(576).astype(np.float32)
        _, y = run(norm.specserve_rms_norm_row_ref, x, w)
        want = ggml_rms_norm(x, w)
        assert np.allclose(y, want, rtol=2e-7, atol=0)  # at most the float mean's last bit
        same += y.tobytes() == want.tobytes()
    assert same >= 45  # the double sum's association rarely reaches the float mean
