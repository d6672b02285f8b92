"""Whole-model step time of the CPU engine by matmul kernel, measured side by side.

On a CPU without native bf16 (AVX2 only) bf16 matmuls are emulated one row at a
time, so a step's cost grows with the rows it multiplies: verifying drafts and
batched decoding get expensive exactly where speculation and continuous batching
need them cheap. The engine's bf16 layers then keep an fp32 copy of the weight for
`Linear.WIDE_ROWS`+ rows (backend/engines/torch_llama.py). This script times the
three choices on this machine:

  bf16        bf16 weights only (WIDE_ROWS = infinity)
  bf16+fp32   the engine's default: bf16 below WIDE_ROWS rows, the fp32 copy above
  fp32        fp32 weights and activations (dtype=fp32), prepacked for oneDNN (the engine's fp32)
  fp32-mkl    the same through F.linear (MKL), which packs the weight again on every call of 2+
              rows (the engine's fp32 before 2026-11-27; Linear.PACK_FP32 = False)

for one sequence appending 1..16 tokens (a verify step of γ = n-1 drafts) and for
1..32 sequences decoding one token each, at context 128.

    .venv/bin/python bench/bench_cpu_kernels.py [--repeats 9]

Writes bench/results/cpu_kernels.{json,png}. On a CPU with native bf16 the first
two rows are the same kernel (oneDNN, prepacked) and the fp32 copy is never made.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXT = 128


def interleaved(calls: dict, repeats: int) -> dict:
    """Median seconds per call of each labelled function, timed round-robin (one call of
    each per round, after a warm-up round) so a noisy neighbour hits every choice alike."""
    times = {k: [] for k in calls}
    for r in range(repeats + 1):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args(argv)
    import torch

    from backend.engines import torch_llama as tl
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: {tl.native_bf16()}, "
          f"{torch.get_num_threads()} threads", flush=True)
    default_wide = tl.Linear.WIDE_ROWS
    engines = {"bf16": (tl.TorchLlama(CHECKPOINT, dtype="bf16", max_slots=max(BATCHES), max_context=CONTEXT + 32), 10**9),
               "bf16+fp32": (tl.TorchLlama(CHECKPOINT, dtype="bf16", max_slots=max(BATCHES), max_context=CONTEXT + 32),
                             default_wide),
               "fp32": (tl.TorchLlama(CHECKPOINT, dtype="fp32", max_slots=max(BATCHES), max_context=CONTEXT + 32),
                        default_wide)}
    tl.Linear.PACK_FP32 = False
    engines["fp32-mkl"] = (tl.TorchLlama(CHECKPOINT, dtype="fp32", max_slots=max(BATCHES), max_context=CONTEXT + 32),
                           default_wide)
    tl.Linear.PACK_FP32 = True
    prompt = list(range(100, 100 + CONTEXT))
    for engine, _ in engines.values():
        for slot in range(max(BATCHES)):
            engine.forward([slot], [0], [prompt])

    def call(label, slots, tokens):
        engine, wide = engines[label]

        def run():
            tl.Linear.WIDE_ROWS = wide
            engine.forward(slots, [CONTEXT] * len(slots), tokens)
        return run

    results = {k: {"verify_tokens": {}, "decode_batch": {}} for k in engines}
    for part, keys in (("verify_tokens", TOKENS), ("decode_batch", BATCHES)):
        for n in keys:
            slots, tokens = ([0], [list(range(300, 300 + n))]) if part == "verify_tokens" else (list(range(n)), [[5]] * n)
            med = interleaved({k: call(k, slots, tokens) for k in engines}, a.repeats)
            for k, v in med.items():
                results[k][part][n] = v
            print(f"  {part} {n}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()), flush=True)
    tl.Linear.WIDE_ROWS = default_wide

    for part, keys, unit in (("verify_tokens", TOKENS, "tokens appended by one sequence"),
                             ("decode_batch", BATCHES, "sequences decoding one token")):
        print(f"\nms per step by {unit} (ratios: bf16-only / bf16+fp32, fp32-mkl / fp32)")
        print(f"{'n':>4} " + " ".join(f"{k:>10}" for k in results) + "   ratios")
        for n in keys:
            t = {k: results[k][part][n] * 1e3 for k in results}
            print(f"{n:>4} " + " ".join(f"{v:>10.1f}" for v in t.values())
                  + f"   {t['bf16'] / t['bf16+fp32']:.2f}x {t['fp32-mkl'] / t['fp32']:.2f}x")

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
