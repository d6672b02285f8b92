"""Our kernels inside llama.cpp's CPU backend (native/llama_cpp), seen from Python.

Set-up builds llama-cpp-python with them (scripts/setup.sh): ggml hands our Q8_0 matmul every
product of Q8_0 weights with two or more activation rows (verification, batched decoding,
prefill), and our attention every flash attention over the Q8_0 KV cache. Both compute each
output exactly as llama.cpp's stock kernels do, so switching them off (`set_enabled(False)`,
or SPECSERVE_Q8_MATMUL=0 in the environment before the first step) changes the speed, never
a logit; benchmarks compare both in one process (bench/bench_verify_curve.py).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Optional


@functools.lru_cache(maxsize=1)
def _lib() -> Optional[ctypes.CDLL]:
    """llama.cpp's CPU backend as llama_cpp loaded it (the same handle), or None when the
    installed build lacks our kernel (a llama-cpp-python built elsewhere)."""
    import llama_cpp.llama_cpp as low  # loads libllama and, through it, libggml-cpu

    path = Path(low._base_path) / "libggml-cpu.so"
    if not path.exists():
        return None
    lib = ctypes.CDLL(str(path))
    if not hasattr(lib, "specserve_q8_0_enabled"):
        return None
    lib.specserve_q8_0_enabled.restype = ctypes.c_int
    lib.specserve_q8_0_set_enabled.argtypes = [ctypes.c_int]
    lib.specserve_q8_0_isa.restype = ctypes.c_char_p
    lib.specserve_q8_0_calls.restype = ctypes.c_longlong
    lib.specserve_attn_q8_0_calls.restype = ctypes.c_longlong
    return lib


def available() -> bool:
    return _lib() is not None


def enabled() -> bool:
    lib = _lib()
    return bool(lib and lib.specserve_q8_0_enabled())


def set_enabled(on: bool) -> None:
    lib = _lib()
    if lib is None:
        raise RuntimeError("this llama-cpp-python has no specserve Q8_0 kernel: run scripts/setup.sh")
    lib.specserve_q8_0_set_enabled(1 if on else 0)


def isa() -> Optional[str]:
    """The SIMD path compiled for this CPU: avx512vnni, avxvnni, avx2 or ref (None: no kernel)."""
    lib = _lib()
    return lib.specserve_q8_0_isa().decode() if lib else None


def calls() -> dict:
    """Ops this process has run through our kernels so far: {"matmul": n, "attention": n}."""
    lib = _lib()
    if lib is None:
        return {"matmul": 0, "attention": 0}
    return {"matmul": int(lib.specserve_q8_0_calls()), "attention": int(lib.specserve_attn_q8_0_calls())}


def build_id() -> str:
    """What computes llama.cpp's Q8_0 matmuls in this process, as a step-time profile records it
    (build_engines/profile_costs.py measures again when it changes): our kernel (its SIMD path,
    on or off) or the stock one, and a digest of the CPU backend library (any rebuild)."""
    import hashlib
    import llama_cpp.llama_cpp as low

    path = Path(low._base_path) / "libggml-cpu.so"
    digest = hashlib.sha1(path.read_bytes()).hexdigest()[:12] if path.exists() else "unknown"
    state = f"specserve-{isa()}-{'on' if enabled() else 'off'}" if available() else "stock"
    return f"{state}-{digest}"


def describe() -> str:
    if not available():
        return "llama.cpp's stock Q8_0 kernels (no specserve kernel in this build)"
    return f"specserve Q8_0 kernel ({isa()}), {'on' if enabled() else 'off: stock kernels'}"
