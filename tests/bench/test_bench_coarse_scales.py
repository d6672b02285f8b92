"""bench/bench_coarse_scales.py: the prototypes of coarser-scaled formats compile against the product's
kernel as it is now, pass their own reference check (the binary exits non-zero otherwise), and one
round writes a time for every variant and row count, and a plot. (What the times are on a machine
is docs/results.md's business, not a test's.)"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not shutil.which("g++") or "avx512_vnni" not in Path("/proc/cpuinfo").read_text(),
                    reason="needs g++ and an AVX-512 VNNI CPU (the product kernel's SIMD path)")
def test_one_round_writes_every_variant_and_a_plot(tmp_path):
    out = tmp_path / "coarse.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_coarse_scales.py"), "--rounds", "1", "--steps", "3",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert info["t"] == [1, 2, 4, 8, 16]
    want = {"q8_0", "row_vnni"} | ({"row_amx", "b192_amx"} if info["amx"] else set())
    assert set(info["ms"]) == want
    assert all(len(v) == 5 and all(x > 0 for x in v) for v in info["ms"].values())
    assert info["worst_rel_diff"] < 1e-4
    assert info["weight_bytes_q8_0"] == 4_202_496 * 34  # SmolLM2-135M's matmuls, in Q8_0 blocks of 34 bytes
    assert "T(8)/T(1)" in r.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000
