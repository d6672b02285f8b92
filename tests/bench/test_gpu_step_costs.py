"""bench/gpu_step_costs.py, on the CPU with a tiny layout: the GPU cost curve's script runs, its
JSON has a figure for every point, and a saved run prints and plots (the GPU run itself happens
only on a device machine; docs/results.md has its figures)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_step_costs_runs_on_the_cpu_with_a_tiny_layout(tmp_path):
    out, png = tmp_path / "costs.json", tmp_path / "costs.png"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_step_costs.py"), "--layout", "tiny", "--draft-layout", "tiny",
           "--device", "cpu", "--batches", "1,3", "--tokens", "1,2,4", "--ctx", "16,40", "--prefill", "8",
           "--repeats", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    eager = info["target"]["eager_s"]
    assert len(eager) == 2 and all(len(rows) == 2 and all(len(row) == 3 for row in rows) for rows in eager)
    assert all(v > 0 for rows in eager for row in rows for v in row)
    assert len(info["draft"]["eager_s"][0]) == 2 and info["prefill"]["tokens"] == [8]
    assert "ctx 40" in r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_step_costs.py"), "--from",
                        str(ROOT / "docs" / "results" / "gpu_step_costs_h200.json"), "--plot", str(png)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert png.stat().st_size > 10_000 and "6.26" in r.stdout
