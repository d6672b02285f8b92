"""llama.cpp step cost by shape: what verifying drafts costs on this machine.

    .venv/bin/python bench/bench_llama_cpp_shapes.py [--ctx 256] [--repeats 7]

Part 1: B sequences x t tokens each (t = 1: plain decoding; t = 1 + gamma: every sequence
verifying gamma drafts), relative to t = 1. Part 2: ragged steps (some sequences verify
drafts, the others decode one token), padded to one micro-batch, split by llama.cpp, and the
engine's own choice (backend/engines/llama_cpp.py `_pad_pays`). Times are the lower median of
`repeats` (build_engines.profile_costs.median_time): run on a quiet machine.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import backend.engines.llama_cpp as llama_cpp
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from build_engines.profile_costs import fill, median_time

CHECKPOINT = Path(__file__).resolve().parents[1] / ".cache" / "models" / "smollm2-135m-instruct"
RAGGED = {"all plain": lambda b: [1] * b, "one verifies 2": lambda b: [3] + [1] * (b - 1),
          "one verifies 4": lambda b: [1] * 3 + [5] + [1] * (b - 4),
          "half (alternating) verify 2": lambda b: [3, 1] * (b // 2), "all but one verify 2": lambda b: [1] + [3] * (b - 1)}


def step_time(engine, ctx: int, lens, repeats: int) -> float:
    slots = list(range(len(lens)))
    return median_time(lambda: engine.forward(slots, [ctx] * len(lens), [[7] * n for n in lens],
                                              logit_rows=[list(range(n)) for n in lens]), repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    engine = LlamaCpp(served_gguf(CHECKPOINT), max_slots=32, max_context=a.ctx + 64)
    print(f"Part 1: B sequences x t tokens at {a.ctx} cached tokens ({engine.name})", flush=True)
    for b in (1, 2, 4, 8, 16, 32):
        fill(engine, a.ctx, b)
        base = None
        cells = []
        for t in (1, 2, 3, 5):
            s = step_time(engine, a.ctx, [t] * b, a.repeats)
            base = base or s
            cells.append(f"t={t}: {s * 1e3:6.1f} ms ({s / base:.2f}x)")
        print(f"  B={b:2d}  " + "  ".join(cells), flush=True)
    print("Part 2: ragged steps: padded / split / the engine's choice", flush=True)
    choose = llama_cpp._pad_pays
    for b in (8, 32):
        fill(engine, a.ctx, b)
        for name, shape in RAGGED.items():
            lens = shape(b)
            row = []
            for rule in (lambda s, n: True, lambda s, n: False, choose):
                llama_cpp._pad_pays = rule
                row.append(step_time(engine, a.ctx, lens, a.repeats))
            llama_cpp._pad_pays = choose
            print(f"  B={b:2d} {name:28s} padded {row[0] * 1e3:6.1f} ms  split {row[1] * 1e3:6.1f} ms  "
                  f"engine {row[2] * 1e3:6.1f} ms ({'pad' if choose(list(range(b)), lens) else 'split'})", flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
