"""Whole-model step time of the CPU engine by matmul kernel, measured side by side.

On a CPU without native bf16 (AVX2 only) bf16 matmuls are emulated one row at a
time, so a step's cost grows with the rows it multiplies: verifying drafts and
batched decoding get expensive exactly where speculation and continuous batching
need them cheap. The engine's bf16 layers then keep an fp32 copy of the weight for
`Linear.WIDE_ROWS`+ rows (backend/engines/torch_llama.py). This script times the
three choices on this machine:

  bf16        bf16 weights only (WIDE_ROWS = infinity)
  bf16+fp32   the engine's default: bf16 below WIDE_ROWS rows, the fp32 copy above
  fp32        fp32 weights and activations (dtype=fp32)

for one sequence appending 1..16 tokens (a verify step of γ = n-1 drafts) and for
1..32 sequences decoding one token each, at context 128.

    .venv/bin/python bench/bench_cpu_kernels.py [--repeats 7]

Writes bench/results/cpu_kernels.{json,png}. On a CPU with native bf16 the first
two rows are the same kernel (oneDNN, prepacked) and the fp32 copy is never made.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXT = 128


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sweep(engine, repeats: int) -> dict:
    prompt = list(range(100, 100 + CONTEXT))
    for slot in range(max(BATCHES)):
        engine.forward([slot], [0], [prompt])
    verify = {n: timed(lambda: engine.forward([0], [CONTEXT], [list(range(300, 300 + n))]), repeats) for n in TOKENS}
    decode = {b: timed(lambda: engine.forward(list(range(b)), [CONTEXT] * b, [[5]] * b), repeats) for b in BATCHES}
    return {"verify_tokens": verify, "decode_batch": decode}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    import torch

    from backend.engines import torch_llama as tl
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: {tl.native_bf16()}, "
          f"{torch.get_num_threads()} threads", flush=True)
    results = {}
    default_wide = tl.Linear.WIDE_ROWS
    for label, dtype, wide in (("bf16", "bf16", 10**9), ("bf16+fp32", "bf16", default_wide), ("fp32", "fp32", None)):
        engine = tl.TorchLlama(CHECKPOINT, dtype=dtype, max_slots=max(BATCHES), max_context=CONTEXT + 32)
        if wide is not None:
            tl.Linear.WIDE_ROWS = wide
        print(f"timing {label} ...", flush=True)
        results[label] = sweep(engine, a.repeats)
        tl.Linear.WIDE_ROWS = default_wide
        del engine

    for part, keys, unit in (("verify_tokens", TOKENS, "tokens appended by one sequence"),
                             ("decode_batch", BATCHES, "sequences decoding one token")):
        print(f"\nms per step by {unit} (ratio: bf16-only time / engine default time)")
        print(f"{'n':>4} " + " ".join(f"{k:>10}" for k in results) + "   ratio")
        for n in keys:
            row = [results[k][part][n] * 1e3 for k in results]
            print(f"{n:>4} " + " ".join(f"{v:>10.1f}" for v in row) + f"   {row[0] / row[1]:.2f}x")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"native_bf16": tl.native_bf16(), "wide_rows": default_wide, "context": CONTEXT,
           "seconds": {k: {p: {str(n): v for n, v in d.items()} for p, d in r.items()} for k, r in results.items()}}
    (RESULTS / "cpu_kernels.json").write_text(json.dumps(out, indent=2))
    plot(results, RESULTS / "cpu_kernels.png")
    print(f"\nwrote {RESULTS / 'cpu_kernels.json'} and .png")


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (part, xlabel) in zip(axes, (("verify_tokens", "tokens appended by one sequence (γ + 1)"),
                                         ("decode_batch", "sequences decoding one token each"))):
        for label, r in results.items():
            xs = list(r[part])
            ax.plot(xs, [r[part][x] * 1e3 for x in xs], marker="o", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms per step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"SmolLM2-135M step time on this CPU by matmul kernel (context {CONTEXT})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
