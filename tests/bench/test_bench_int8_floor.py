"""bench/bench_int8_floor.py: the int8 floor benchmark compiles against the kernel's header as it
is now, runs one round, and writes figures for every sequence and every t, and a plot. (What the
figures are on a machine is docs/results.md's business, not a test's.)"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not shutil.which("g++") or "avx2" not in Path("/proc/cpuinfo").read_text(),
                    reason="needs g++ and an AVX2 CPU (the sequences are AVX2 instructions)")
def test_one_round_writes_every_figure_and_a_plot(tmp_path):
    out = tmp_path / "floor.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_int8_floor.py"), "--rounds", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert info["isa"] in ("avx2", "avxvnni", "avx512vnni")
    want = {"madd", "signed", "stock", "stock_bcast"} | ({"vnni512", "vnni512_bcast"} if info["isa"] == "avx512vnni" else set())
    assert set(info["mix_cycles"]) == want
    assert all(v > 0 for v in info["mix_cycles"].values())
    assert [row["t"] for row in info["tile"]] == [1, 2, 4, 8, 16]
    assert all(row[k] > 0 for row in info["tile"] for k in ("hot_ms", "cold_ms", "cold_ms_threads", "hot_cycles", "cold_cycles"))
    assert info["threads"] == 2
    assert all(row[k] > 0 for row in info["tile"] for k in ("lanes_hot_ms", "lanes_cold_ms", "lanes_hot_cycles"))
    assert info["lanes_max_diff_of_scale"] < 1e-5  # the prototype computes the same products, summed in another order
    assert info["block_rows_per_token"] == 4_202_496  # SmolLM2-135M: 30 x (q k v o gate up down) + output, in blocks
    assert "G multiply-adds/s a core" in r.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000
