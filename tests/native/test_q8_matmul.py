"""specserve's Q8_0 matmul kernel (native/llama_cpp/q8_matmul.cpp) on its own, compiled here for
this CPU: every SIMD path must give, bit for bit, the plain-C specification (which is ggml's
vec_dot_q8_0_q8_0 arithmetic), for any number of weight and activation rows; and a row's
result must not depend on how many rows share the call (batch invariance, M = 1..64).
The same kernel inside llama.cpp is checked against llama.cpp's stock kernels in
tests/backend/engines/test_q8_kernel_engine.py."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "native" / "llama_cpp" / "q8_matmul.cpp"
BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", 32)])  # ggml's block_q8_0: 34 bytes


# Each SIMD path this CPU can run, compiled on purpose (the build takes the widest with
# -march=native; the narrower ones must stay right too): (the path's name, the CPU flags it needs,
# g++ flags)
AVX2 = ("-mavx2", "-mfma", "-mf16c")
PATHS = {
    "native": (set(), ("-march=native",)),
    "avx2": ({"avx2", "fma", "f16c"}, AVX2),
    "avxvnni": ({"avx2", "fma", "f16c", "avx_vnni"}, AVX2 + ("-mavxvnni",)),
    "avx512vnni": ({"avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni"},
                   AVX2 + ("-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512vnni")),
}


def cpu_flags() -> set:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def compiled(paths: dict, path: str, sources, tmp_path_factory) -> ctypes.CDLL:
    """The sources built as a shared library for one SIMD path (skipped where this CPU cannot run it)."""
    if not shutil.which("g++"):
        pytest.skip("no C++ compiler")
    needs, flags = paths[path]
    if needs - cpu_flags():
        pytest.skip(f"this CPU cannot run the {path} path (no {', '.join(sorted(needs - cpu_flags()))})")
    lib = tmp_path_factory.mktemp("kernel") / "libkernel.so"
    subprocess.run(["g++", "-O2", *flags, "-shared", "-fPIC", "-o", str(lib), *map(str, sources)], check=True)
    return ctypes.CDLL(str(lib))


@pytest.fixture(scope="module", params=sorted(PATHS))
def kernel(request, tmp_path_factory):
    k = compiled(PATHS, request.param, [SRC], tmp_path_factory)
    for fn in (k.specserve_q8_0_matmul, k.specserve_q8_0_matmul_ref):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]
    k.specserve_q8_0_matmul_isa.restype = ctypes.c_char_p
    return k


def blocks(rng, rows, nb, scale=1e-2):
    """Q8_0 rows as quantize_row_q8_0 makes them: quants in [-127, 127], positive half scales."""
    x = np.zeros((rows, nb), dtype=BLOCK)
    x["qs"] = rng.integers(-127, 128, size=(rows, nb, 32), dtype=np.int8)
    x["d"] = (rng.random((rows, nb)) * scale + 1e-5).astype(np.float16)
    return x


def matmul(fn, w, a):
    """dst[c, r] = dot(w[r], a[c])"""
    out = np.full((a.shape[0], w.shape[0]), np.nan, dtype=np.float32)
    fn(w.ctypes.data, w.strides[0], w.shape[0], a.ctypes.data, a.strides[0], a.shape[0], w.shape[1],
       out.ctypes.data, out.shape[1])
    return out


def test_a_path_is_compiled_for_this_cpu(kernel, request):
    isa = kernel.specserve_q8_0_matmul_isa().decode()
    assert isa in ("avx512vnni", "avxvnni", "avx2", "ref")
    path = request.node.callspec.params["kernel"]
    if path != "native":  # the path compiled on purpose is the one that runs
        assert isa == path


def test_one_element_worked_by_hand(kernel):
    """8 int32 lanes of 4 products each, scaled per block by the product of the two halves and
    fma'd into 8 float lanes, then summed in ggml's hsum_float_8 order."""
    w = np.zeros((1, 2), dtype=BLOCK)
    a = np.zeros((1, 2), dtype=BLOCK)
    w["qs"][0, 0, :4], a["qs"][0, 0, :4] = [1, 2, 3, 4], [1, 1, 1, 1]     # block 0, lane 0: 10
    w["qs"][0, 1, 28:], a["qs"][0, 1, 28:] = [-1, 0, 0, 0], [127, 0, 0, 0]  # block 1, lane 7: -127
    w["d"], a["d"] = [[0.5, 0.25]], [[2.0, 4.0]]                             # d = 1.0 for both blocks
    for fn in (kernel.specserve_q8_0_matmul_ref, kernel.specserve_q8_0_matmul):
        assert matmul(fn, w, a)[0, 0] == np.float32(10.0 - 127.0)


@pytest.mark.parametrize("n_w,nb", [(1, 1), (7, 3), (64, 18), (33, 48), (130, 5)])
def test_simd_equals_the_specification_bit_for_bit(kernel, n_w, nb):
    rng = np.random.default_rng(n_w * 100 + nb)
    w = blocks(rng, n_w, nb)
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64):
        a = blocks(rng, m, nb, scale=1.0)
        got = matmul(kernel.specserve_q8_0_matmul, w, a)
        want = matmul(kernel.specserve_q8_0_matmul_ref, w, a)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n_w, nb, m)


def test_a_row_is_the_same_whatever_shares_the_call(kernel):
    """M = 1..64 rows in one call: each row equals that row computed alone (tolerance 0)."""
    rng = np.random.default_rng(7)
    w = blocks(rng, 96, 18)
    a = blocks(rng, 64, 18, scale=1.0)
    alone = np.concatenate([matmul(kernel.specserve_q8_0_matmul, w, a[c:c + 1]) for c in range(64)])
    for m in range(1, 65):
        got = matmul(kernel.specserve_q8_0_matmul, w, a[:m])
        assert np.array_equal(got.view(np.uint32), alone[:m].view(np.uint32)), m


def test_extreme_quants_do_not_saturate(kernel):
    """127 * 127 pairs are the largest products (maddubs adds two into an int16: 32258 fits; the
    AVX-512 path's offset sums, (w + 128) x a, stay far inside an int32)."""
    w = np.zeros((4, 2), dtype=BLOCK)
    a = np.zeros((3, 2), dtype=BLOCK)
    w["qs"], a["qs"] = 127, -127
    w["qs"][1], a["qs"][1] = -127, -127
    w["d"], a["d"] = 1.0, 1.0
    got = matmul(kernel.specserve_q8_0_matmul, w, a)
    assert got[0, 0] == -127 * 127 * 64 and got[0, 1] == 127 * 127 * 64
