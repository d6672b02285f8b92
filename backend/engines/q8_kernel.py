"""Our kernels inside llama.cpp's CPU backend (native/llama_cpp), seen from Python.

Set-up builds llama-cpp-python with them (scripts/setup.sh). Two arithmetics, each computing a
row's result the same way whatever else shares the step (decoding, verification, batches,
prefill), so greedy output never depends on the batch:
- on AVX-512 VNNI CPUs, the rows-in-lanes order (native/llama_cpp/q8_lanes.h): every product of
  the model's Q8_0 weight matrices, one row or many, with its weights repacked once (a copy the
  size of the model's Q8_0 weights), and attention in three passes a query (attn_two_pass.h).
  Not llama.cpp's bits, but as close to the unquantized model (tests/backend/engines/
  test_q8_lanes_engine.py); verifying 8 tokens costs ~1.7 decoding steps instead of ~2.2.
  `set_lanes_enabled(False)` (or SPECSERVE_Q8_LANES=0 before the first step) gives the next:
- llama.cpp's own order elsewhere: our Q8_0 matmul for two or more activation rows and our
  attention over the Q8_0 KV cache, each output bit-identical to the stock kernels', so
  switching them off (`set_enabled(False)`, or SPECSERVE_Q8_MATMUL=0) changes the speed, never
  a logit.
Benchmarks compare the three in one process (bench/bench_verify_curve.py); a switch changes the
speed of the next step, and, for the lanes one, the last bits of its logits.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Optional


def _loaded_cpu_backend() -> Optional[Path]:
    """The file of ggml's CPU backend this process loaded with llama_cpp. A pip-installed wheel
    holds libggml-cpu.so and libggml-cpu.so.0 as two copies of one library (symlinks become
    files), and libllama loads the .so.0: opening the other would load a second, separate copy
    (its own switch and counters), so the mapped one is looked up."""
    import llama_cpp.llama_cpp as low  # loads libllama and, through it, libggml-cpu

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/libggml-cpu.so" in path:
            return Path(path)
    base = Path(low._base_path)  # no /proc (not Linux): the soname libllama asks for
    return next((p for p in (base / "libggml-cpu.so.0", base / "libggml-cpu.so") if p.exists()), None)


@functools.lru_cache(maxsize=1)
def _lib() -> Optional[ctypes.CDLL]:
    """llama.cpp's CPU backend as llama_cpp loaded it (the same copy), or None when the installed
    build lacks our kernels (a llama-cpp-python built elsewhere)."""
    path = _loaded_cpu_backend()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    if not hasattr(lib, "specserve_q8_0_enabled"):
        return None
    lib.specserve_q8_0_enabled.restype = ctypes.c_int
    lib.specserve_q8_0_set_enabled.argtypes = [ctypes.c_int]
    lib.specserve_q8_0_isa.restype = ctypes.c_char_p
    lib.specserve_q8_0_calls.restype = ctypes.c_longlong
    lib.specserve_attn_q8_0_calls.restype = ctypes.c_longlong
    if hasattr(lib, "specserve_q8_lanes_enabled"):
        lib.specserve_q8_lanes_enabled.restype = ctypes.c_int
        lib.specserve_q8_lanes_set_enabled.argtypes = [ctypes.c_int]
        lib.specserve_q8_lanes_calls.restype = ctypes.c_longlong
        lib.specserve_q8_lanes_bytes.restype = ctypes.c_longlong
    if hasattr(lib, "specserve_q8_lanes_act_reuses"):
        lib.specserve_q8_lanes_act_reuses.restype = ctypes.c_longlong
    if hasattr(lib, "specserve_q8_lanes_locked_lookups"):
        lib.specserve_q8_lanes_locked_lookups.restype = ctypes.c_longlong
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


def lanes_enabled() -> bool:
    """Whether the rows-in-lanes arithmetic serves the weights it can (AVX-512 VNNI builds)."""
    lib = _lib()
    return bool(lib and hasattr(lib, "specserve_q8_lanes_enabled") and lib.specserve_q8_lanes_enabled())


def set_lanes_enabled(on: bool) -> None:
    """Switch the rows-in-lanes arithmetic (SPECSERVE_Q8_LANES=0 starts it off). Off, every matmul
    computes llama.cpp's own bits; on, the weights it takes compute its own (q8_lanes.h). Either is
    the same at every number of rows; a switch between steps changes the logits' last bits."""
    lib = _lib()
    if lib is None or not hasattr(lib, "specserve_q8_lanes_set_enabled"):
        raise RuntimeError("this llama-cpp-python has no specserve lanes kernel: run scripts/setup.sh")
    lib.specserve_q8_lanes_set_enabled(1 if on else 0)


def lanes_bytes() -> int:
    """Bytes of rows-in-lanes weight copies this process holds."""
    lib = _lib()
    return int(lib.specserve_q8_lanes_bytes()) if lib and hasattr(lib, "specserve_q8_lanes_bytes") else 0


def calls() -> dict:
    """Ops this process has run through our kernels so far: {"matmul": n, "lanes": n, "attention": n,
    "lanes_reused": n, "lanes_locked": n} ("matmul": llama.cpp's order, "lanes": the rows-in-lanes order,
    "lanes_reused": lanes products that reused the activations' layout of the previous product of the
    same tensor, "lanes_locked": weight-copy lookups that took the registry's lock, by any thread)."""
    lib = _lib()
    if lib is None:
        return {"matmul": 0, "lanes": 0, "attention": 0, "lanes_reused": 0, "lanes_locked": 0}

    def count(name: str) -> int:
        return int(getattr(lib, name)()) if hasattr(lib, name) else 0

    return {"matmul": int(lib.specserve_q8_0_calls()), "lanes": count("specserve_q8_lanes_calls"),
            "attention": int(lib.specserve_attn_q8_0_calls()), "lanes_reused": count("specserve_q8_lanes_act_reuses"),
            "lanes_locked": count("specserve_q8_lanes_locked_lookups")}


def build_id() -> str:
    """What computes llama.cpp's Q8_0 matmuls in this process, as a step-time profile records it
    (build_engines/profile_costs.py measures again when it changes): our kernel (its SIMD path,
    on or off) or the stock one, and a digest of the CPU backend library (any rebuild)."""
    import hashlib

    path = _loaded_cpu_backend()
    digest = hashlib.sha1(path.read_bytes()).hexdigest()[:12] if path else "unknown"
    state = f"specserve-{isa()}-{'on' if enabled() else 'off'}" if available() else "stock"
    if enabled() and lanes_enabled():
        state += "-lanes"
    return f"{state}-{digest}"


def describe() -> str:
    if not available():
        return "llama.cpp's stock Q8_0 kernels (no specserve kernel in this build)"
    if enabled() and lanes_enabled():
        return f"specserve Q8_0 kernels ({isa()}), rows in lanes"
    return f"specserve Q8_0 kernel ({isa()}), {'on' if enabled() else 'off: stock kernels'}"
