"""The softmax's vector expf (native/llama_cpp/expf8.h) on its own, compiled here for this CPU: it
must return glibc's expf bit for bit -- that is what keeps our attention kernel identical to
llama.cpp's stock one, which calls expf per key -- over the arguments the softmax uses (every
float in [-110, 0], sampled densely here; -inf), and the once-a-process probe the kernel trusts
must say so. The kernel inside llama.cpp is checked against the stock kernels in
tests/backend/engines/test_q8_kernel_engine.py."""
import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "native" / "llama_cpp" / "expf8.h"
HARNESS = r"""
#include "expf8.h"
#include <cstdio>

extern "C" int proven(void) { return specserve::expf8_matches_libm(); }

// floats from -0 down to -110, every `step`-th bit pattern, 8 at a time through expf_n: how many
// differ from expf, the first one in *first_bad
extern "C" long long mismatches(unsigned step, float * first_bad) {
    unsigned lo = 0x80000000u, hi;
    const float limit = -110.0f;
    std::memcpy(&hi, &limit, sizeof hi);
    long long bad = 0;
    float x[256], y[256];
    int n = 0;
    auto check = [&]() {
        specserve::expf_n(x, y, n);
        for (int i = 0; i < n; ++i) {
            const float e = expf(x[i]);
            if (std::memcmp(&e, &y[i], sizeof e) != 0 && bad++ == 0) {
                *first_bad = x[i];
            }
        }
        n = 0;
    };
    for (unsigned long long u = lo; u <= hi; u += step) {
        const unsigned bits = (unsigned) u;
        std::memcpy(&x[n++], &bits, sizeof bits);
        if (n == 253) {  // odd lengths: the tail path too
            check();
        }
    }
    x[n++] = -INFINITY;
    x[n++] = specserve::EXPF_UNDERFLOW;
    check();
    return bad;
}
"""


@pytest.fixture(scope="module")
def expf8(tmp_path_factory):
    if not shutil.which("g++"):
        pytest.skip("no C++ compiler")
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("expf8 reproduces glibc's expf; the kernel's probe falls back to expf elsewhere")
    d = tmp_path_factory.mktemp("expf8")
    (d / "harness.cpp").write_text(HARNESS)
    lib = d / "libexpf8.so"
    subprocess.run(["g++", "-O2", "-march=native", "-shared", "-fPIC", "-I", str(HEADER.parent), "-o", str(lib),
                    str(d / "harness.cpp")], check=True)
    k = ctypes.CDLL(str(lib))
    k.mismatches.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_float)]
    k.mismatches.restype = ctypes.c_longlong
    return k


def test_the_probe_proves_it_equals_this_libms_expf(expf8):
    flags = Path("/proc/cpuinfo").read_text()
    if " avx2 " not in flags or " fma " not in flags:
        assert not expf8.proven()  # no vector path: the kernel calls expf
    else:
        assert expf8.proven()


@pytest.mark.parametrize("step", [1021, 7919])  # two strides: ~1.1 million and ~140,000 floats over all exponents
def test_every_argument_gives_expfs_bits(expf8, step):
    first = ctypes.c_float(0.0)
    bad = expf8.mismatches(step, ctypes.byref(first))
    assert bad == 0, f"{bad} differ, first at {first.value!r}"
