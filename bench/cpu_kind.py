"""The CPU a benchmark ran on, as its figures should name it: the model name and the SIMD that
matters for our kernels (figures differ 2x between kinds)."""
from pathlib import Path


def cpu_kind() -> str:
    text = Path("/proc/cpuinfo").read_text()
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    simd = [f for f in ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2") if f in flags]
    return f"{name} ({', '.join(simd) or 'no AVX2'})"
