"""The verify curve T(B, t) of the served engine: B sequences each evaluating t tokens in one
step (t = 1: decoding; t = 1 + gamma: verifying gamma drafts), in one process, the kernels
switched at run time and the arms alternating measurement by measurement, so all see the same
machine:
  stock        llama.cpp's own kernels
  stock order  ours in llama.cpp's order (native/llama_cpp/q8_matmul.h, attn_hook.cpp)
  ours         what is served: the rows-in-lanes order on AVX-512 VNNI CPUs (q8_lanes.h,
               attn_two_pass.h), else the same as "stock order"

    .venv/bin/python bench/bench_verify_curve.py [--ctx 256] [--repeats 7] [--batches 1 8 32]

Prints ms per step for each, ours / stock, and each curve relative to its own t = 1; checks that
"stock order" gives stock's logits bit for bit (the served lanes order is checked for batch
invariance by tests/backend/engines/test_q8_lanes_engine.py); writes
bench/results/verify_curve.{json,png}.
The issue-40 targets are printed beside the figures: T(1, 8) <= 1.3 x T(1, 1) with VNNI
(1.6 on AVX2 only), T(32, 1) <= 0.6 x stock. Run it alone: a second llama.cpp workload on the
same cores slows both many times over.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from backend.engines import q8_kernel
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from build_engines.profile_costs import fill, median_time
from cpu_kind import cpu_kind  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
RESULTS = ROOT / "bench" / "results"
TOKENS = (1, 2, 4, 8, 16, 32)


def step(engine, ctx: int, b: int, t: int):
    return engine.forward(list(range(b)), [ctx] * b, [[7 + i for i in range(t)]] * b,
                          logit_rows=[list(range(t))] * b)


ARMS = {"stock": (False, False), "stock_order": (True, False), "ours": (True, True)}  # (ours on, lanes on)


def use(arm: str) -> None:
    on, lanes = ARMS[arm]
    q8_kernel.set_enabled(on)
    if lanes or q8_kernel.lanes_enabled():
        q8_kernel.set_lanes_enabled(lanes)


def measure(engine, ctx: int, b: int, t: int, repeats: int, arms) -> dict:
    """ms per step of each arm (alternating), and whether "stock order" gives stock's logits."""
    logits = {}
    for arm in ("stock", "stock_order"):
        use(arm)
        logits[arm] = step(engine, ctx, b, t).numpy().copy()
    times = {arm: [] for arm in arms}
    for _ in range(2):  # two alternating halves: drift hits every arm
        for arm in arms:
            use(arm)
            times[arm].append(median_time(lambda: step(engine, ctx, b, t), max(1, repeats // 2)))
    use("ours")
    row = {"B": b, "t": t, **{f"{arm}_ms": 1e3 * min(times[arm]) for arm in arms},
           "identical": bool(np.array_equal(logits["stock"].view(np.uint32), logits["stock_order"].view(np.uint32)))}
    row.setdefault("ours_ms", row["stock_order_ms"])
    return row


def plot(rows, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for b in sorted({r["B"] for r in rows}):
        pts = [r for r in rows if r["B"] == b]
        ts = [r["t"] for r in pts]
        line = ax.plot(ts, [r["stock_ms"] for r in pts], "--o", label=f"stock, B={b}")[0]
        if "stock_order_ms" in pts[0] and pts[0]["ours_ms"] != pts[0]["stock_order_ms"]:
            ax.plot(ts, [r["stock_order_ms"] for r in pts], ":^", color=line.get_color(), label=f"stock order, B={b}")
        ax.plot(ts, [r["ours_ms"] for r in pts], "-s", color=line.get_color(), label=f"ours, B={b}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per sequence in the step (t)")
    ax.set_ylabel("ms per step")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=256, help="cached tokens per sequence")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 8, 32])
    ap.add_argument("--max-tokens-per-step", type=int, default=512)
    a = ap.parse_args(argv)
    if not q8_kernel.available():
        raise SystemExit("this llama-cpp-python has no specserve kernel: run scripts/setup.sh")
    engine = LlamaCpp(served_gguf(CHECKPOINT), max_slots=max(a.batches), max_context=a.ctx + max(TOKENS) + 8)
    kind = cpu_kind()
    lanes = q8_kernel.lanes_enabled()
    arms = ("stock", "stock_order", "ours") if lanes else ("stock", "stock_order")
    print(f"{engine.name}, {a.ctx} cached tokens, {engine.threads} threads, {q8_kernel.describe()}; CPU: {kind}",
          flush=True)
    rows = []
    for b in a.batches:
        fill(engine, a.ctx, b)
        for t in TOKENS:
            if b * t > a.max_tokens_per_step:
                continue
            r = measure(engine, a.ctx, b, t, a.repeats, arms)
            rows.append(r)
            base = next(x for x in rows if x["B"] == b and x["t"] == 1)
            cols = "   ".join(f"{arm} {r[arm + '_ms']:6.1f} ms ({r[arm + '_ms'] / base[arm + '_ms']:4.2f}x t=1)"
                               for arm in arms)
            print(f"  B={b:2d} t={t:2d}  {cols}   ours/stock {r['ours_ms'] / r['stock_ms']:.2f}"
                  f"   stock order's logits {'identical to stock' if r['identical'] else 'DIFFER'}", flush=True)
    engine.close()
    at = {(r["B"], r["t"]): r for r in rows}
    vnni = q8_kernel.isa() in ("avx512vnni", "avxvnni")
    print("targets (issue 40):")
    if (1, 8) in at:
        ratio = at[1, 8]["ours_ms"] / at[1, 1]["ours_ms"]
        print(f"  T(1,8) / T(1,1) = {ratio:.2f} (target <= {1.3 if vnni else 1.6}; stock "
              f"{at[1, 8]['stock_ms'] / at[1, 1]['stock_ms']:.2f})")
    if (32, 1) in at:
        print(f"  T(32,1) ours / stock = {at[32, 1]['ours_ms'] / at[32, 1]['stock_ms']:.2f} (target <= 0.6)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "verify_curve.json").write_text(json.dumps({"cpu": kind, "kernel": q8_kernel.isa(), "lanes": lanes,
                                                           "ctx": a.ctx, "rows": rows}, indent=1))
    plot(rows, RESULTS / "verify_curve.png", f"{engine.name}, {a.ctx} cached; {kind}")
    print(f"wrote {RESULTS / 'verify_curve.json'} and verify_curve.png")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
