"""This CPU's int8 floor for Q8_0 products, measured, against what our matmul kernel reaches.

Issue 40 asks where a verification step's time goes against the physical floor (weight bytes /
bandwidth, multiply-adds / int8 rate). This measures the int8 side on this machine instead of
estimating it: `bench/int8_floor.cpp`, compiled here with the kernel (`native/llama_cpp/
q8_matmul.cpp`), times on one thread
  - the AVX2 instruction sequences of one block-row (a 32-weight Q8_0 block times one activation
    row: 32 multiply-adds) on registers only, so only the execution ports limit them: the
    multiply-add alone (maddubs + madd), signed as Q8_0 needs it (+ sign), in ggml's vec_dot order
    (+ convert + fma with the block's scale product), and with that scale broadcast from memory;
  - our kernel on the served model's matmuls (SmolLM2-135M, 4.2 M block-rows a token) for
    t = 1..16 activation rows, hot (weights in L1/L2: compute only) and cold (all 143 MB, as a
    step reads them), and cold on --threads threads sharing each matrix's chunks as ggml does
    (what two cores give over one on this machine);
  - a prototype of another arithmetic, not in the product (`lanes_*` in int8_floor.cpp): weights
    repacked 8 rows to a group so that SIMD lanes are weight rows, a block's products summed
    exactly per row, one convert + fma per block for 8 rows. Its float sums run in another order
    than ggml's (not bit-identical to stock; checked against the specification to float
    rounding): what giving that up would buy, measured.

    .venv/bin/python bench/bench_int8_floor.py [--rounds 9] [--threads 2]

Prints cycles a block-row, G multiply-adds/s a core, and the matmuls' floor for one step of t
rows on --threads cores (the register floor) against the kernel on as many threads; writes
bench/results/int8_floor.{json,png}. AVX2 machines only (the sequences are AVX2 instructions; on AVX-512
VNNI machines the 512-bit path's own sequence is timed too, and is the kernel's floor there). Run it
alone: a second workload on the same cores halves what both measure.
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
MIXES = (("madd", "maddubs + madd"), ("signed", "sign + maddubs + madd"),
         ("stock", "sign + maddubs + madd + cvt + fma"), ("stock_bcast", "the same + scale broadcast"))
# AVX-512 VNNI machines: the sequence of the kernel's 512-bit path (two block-rows a register)
MIXES_512 = (("vnni512", "512-bit: copy + dpbusd + cvt + fma"), ("vnni512_bcast", "the same + scale broadcast"))


def floor_key(r: dict) -> str:
    """The register-only sequence the kernel runs on this machine: its floor."""
    return "vnni512_bcast" if "vnni512_bcast" in r["mix_cycles"] else "stock_bcast"


def measure(rounds: int, threads: int) -> dict:
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        raise SystemExit("bench_int8_floor: this CPU has no AVX2")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "int8_floor"
        subprocess.run(["g++", "-O2", "-march=native", "-fopenmp", f"-I{ROOT / 'native' / 'llama_cpp'}", "-o", str(exe),
                        str(ROOT / "bench" / "int8_floor.cpp"), str(ROOT / "native" / "llama_cpp" / "q8_matmul.cpp")],
                       check=True)
        out = subprocess.run([str(exe), str(rounds), str(threads)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def report(r: dict) -> None:
    ghz, rows, threads = r["tsc_ghz"], r["block_rows_per_token"], r["threads"]
    print(f"{r['cpu']}; kernel path {r['isa']}; time-stamp counter {ghz:.3f} GHz (cycles below are its)")
    print("\none block-row (32 int8 multiply-adds), registers only, one thread:")
    for key, what in MIXES + MIXES_512:
        if key in r["mix_cycles"]:
            c = r["mix_cycles"][key]
            print(f"  {what:36s} {c:6.3f} cycles  {32 * ghz / c:6.1f} G multiply-adds/s a core")
    floor = r["mix_cycles"][floor_key(r)]
    print(f"  (the kernel's floor below: {dict(MIXES + MIXES_512)[floor_key(r)]})")
    print(f"\nour kernel, the model's matmuls ({rows / 1e6:.1f} M block-rows a token, "
          f"{r['weight_bytes'] / 1e6:.0f} MB), one thread:")
    print(f"  {'t':>3} {'hot ms':>8} {'cold ms':>8} {'cycles/block-row hot':>21} {'of floor':>9} "
          f"{'floor ms, ' + str(threads) + ' cores':>18} {'cold ms, ' + str(threads) + ' threads':>19} {'speed-up':>9}")
    for row in r["tile"]:
        t = row["t"]
        floor_ms = rows * t * floor / ghz / 1e6 / threads
        print(f"  {t:3d} {row['hot_ms']:8.2f} {row['cold_ms']:8.2f} {row['hot_cycles']:21.2f} "
              f"{row['hot_cycles'] / floor:8.2f}x {floor_ms:18.2f} {row['cold_ms_threads']:19.2f} "
              f"{row['cold_ms'] / row['cold_ms_threads']:8.2f}x")
    print(f"  cold t = 1 streams the weights at {r['weight_bytes'] / r['tile'][0]['cold_ms'] / 1e6:.1f} GB/s "
          "on one thread")
    print(f"\nprototype, rows in lanes (another order of sums; largest difference from the specification "
          f"{r['lanes_max_diff_of_scale']:.1e} of the largest output), one thread:")
    print(f"  {'t':>3} {'hot ms':>8} {'cold ms':>8} {'cycles/block-row hot':>21} {'cold, kernel / prototype':>25}")
    for row in r["tile"]:
        print(f"  {row['t']:3d} {row['lanes_hot_ms']:8.2f} {row['lanes_cold_ms']:8.2f} {row['lanes_hot_cycles']:21.2f} "
              f"{row['cold_ms'] / row['lanes_cold_ms']:24.2f}x")


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ts = [row["t"] for row in r["tile"]]
    ax.plot(ts, [row["cold_cycles"] for row in r["tile"]], "-o", label="our kernel, weights from memory (cold)")
    ax.plot(ts, [row["hot_cycles"] for row in r["tile"]], "-s", label="our kernel, weights in L1/L2 (hot)")
    ax.plot(ts, [row["lanes_cold_ms"] / row["cold_ms"] * row["cold_cycles"] for row in r["tile"]], "-^",
            label="prototype, rows in lanes (another order of sums), cold")
    for (key, what), style in zip(MIXES, (":", "-.", "--", "-")):
        ax.axhline(r["mix_cycles"][key], color="grey", linestyle=style, linewidth=1, label=f"registers only: {what}")
    for (key, what), style in zip(MIXES_512, ("--", "-")):
        if key in r["mix_cycles"]:
            ax.axhline(r["mix_cycles"][key], color="tab:red", linestyle=style, linewidth=1, label=f"registers only: {what}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("activation rows a call (t: tokens verified, or sequences decoded)")
    ax.set_ylabel("cycles per block-row (32 int8 multiply-adds)")
    ax.set_title(f"{r['cpu']}, one thread, SmolLM2-135M's Q8_0 matmuls", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="measurements alternate round by round; the best of each is kept")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of the shared-chunk measurement and cores of the floor (the served engine's threads)")
    ap.add_argument("--out", type=Path, default=RESULTS / "int8_floor.json", help="the figures (a .png beside it)")
    args = ap.parse_args(argv)
    r = measure(args.rounds, args.threads)
    r["cpu"] = cpu_kind()
    report(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(r, indent=1) + "\n")
    plot(r, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
