"""What coarser weight scales than Q8_0's would buy verification: the model's matmuls, measured.

Issue 40's T(1, 8) <= 1.3 x T(1, 1) is not met on Q8_0 (1.6-1.7 on the AMX Xeon): every 32 weights
carry their own scale, so every block's int32 sums leave the multiply for a convert, a scale product
and an fma, and on AMX leave the tiles (docs/results.md, sessions 39-41). This measures what a
format with one scale a weight row, or one every 192 weights, would change, on the served model's
shapes (SmolLM2-135M: 30 layers x 7 matrices + the output matrix, 143 MB as Q8_0): `bench/
coarse_scales.cpp`, compiled here with the product's kernel (`native/llama_cpp/q8_lanes.cpp`), runs
a step's matmuls for t = 1, 2, 4, 8, 16 activation rows on two threads (half of each matrix each, a
barrier between matrices, as llama.cpp's graph runs them), weights from memory, variants alternating
round by round:
  q8_0      the product's kernel (a scale every 32 weights)
  row_vnni  one scale a row, AVX-512 VNNI: the same vpdpbusd, no per-block epilogue
  row_amx   one scale a row, Intel AMX tiles accumulating the whole row
  b192_amx  one scale every 192 weights (the model's depths 576 and 1536 are multiples of 192, not
            of 128), AMX: a sixth of Q8_0's epilogues
Each prototype is first checked against a plain reference of its own arithmetic. The prototypes are
measurements for a product decision (a new weight format changes the model's numbers; its quality
is measured apart), not served code.

    .venv/bin/python bench/bench_coarse_scales.py [--rounds 7] [--steps 15]

Prints ms a step's matmuls and T(t) / T(1) per variant; writes bench/results/coarse_scales.{json,png}.
AVX-512 VNNI machines only (the product kernel's SIMD path); the AMX rows where Linux grants AMX.
Run it alone: another workload on the same cores changes what it measures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from cpu_kind import cpu_kind  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NATIVE = ROOT / "native" / "llama_cpp"
LABELS = {"q8_0": "Q8_0, the product's kernel (scale a 32)", "row_vnni": "a scale a row, VNNI",
          "row_amx": "a scale a row, AMX", "b192_amx": "a scale a 192, AMX"}


def measure(rounds: int, steps: int) -> dict:
    flags = Path("/proc/cpuinfo").read_text()
    if "avx512_vnni" not in flags:
        raise SystemExit("bench_coarse_scales: needs AVX-512 VNNI (the product kernel's SIMD path)")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "coarse_scales"
        subprocess.run(["g++", "-O2", "-march=native", "-fopenmp", f"-I{NATIVE}", "-o", str(exe),
                        str(ROOT / "bench" / "coarse_scales.cpp"), str(NATIVE / "q8_lanes.cpp"),
                        str(NATIVE / "q8_matmul.cpp")], check=True)
        out = subprocess.run([str(exe), str(rounds), str(steps)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def report(r: dict) -> None:
    ts, ms = r["t"], r["ms"]
    print(f"{r['cpu']}; the served model's matmuls ({r['weight_bytes_q8_0'] / 1e6:.0f} MB as Q8_0), two threads, "
          f"weights from memory; AMX {'granted' if r['amx'] else 'not available'}")
    print(f"  {'variant':42s}" + "".join(f"{'t=' + str(t):>9s}" for t in ts) + "   T(8)/T(1)")
    for key, row in ms.items():
        print(f"  {LABELS[key] + ', ms':42s}" + "".join(f"{x:9.2f}" for x in row) + f"   {row[ts.index(8)] / row[0]:9.2f}")
    base = ms["q8_0"]
    for key, row in ms.items():
        if key != "q8_0":
            print(f"  {LABELS[key] + ' / Q8_0':42s}" + "".join(f"{x / b:9.2f}" for x, b in zip(row, base)))
    print(f"  (prototypes against their references: largest relative difference {r['worst_rel_diff']:.1e})")


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, row in r["ms"].items():
        ax.plot(r["t"], row, "-o", label=LABELS[key])
    ax.set_xscale("log", base=2)
    ax.set_xticks(r["t"], [str(t) for t in r["t"]])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("activation rows a step (t: tokens verified)")
    ax.set_ylabel("ms a step's matmuls (two threads)")
    ax.set_title(f"{r['cpu']}: SmolLM2-135M's matmuls by weight format", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="variants alternate round by round; the best median is kept")
    ap.add_argument("--steps", type=int, default=15, help="steps a measurement (its median is taken)")
    ap.add_argument("--out", type=Path, default=RESULTS / "coarse_scales.json", help="the figures (a .png beside it)")
    args = ap.parse_args(argv)
    r = measure(args.rounds, args.steps)
    r["cpu"] = cpu_kind()
    report(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(r, indent=1) + "\n")
    plot(r, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
