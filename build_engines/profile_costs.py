"""Offline profiler: the step-time and switch-cost tables the policies read.

Measures on this machine, with the real engine:
  * target forward time T(context bucket, token batch n) — AdaSpec's table; a token
    batch of n is B = max(1, n // 4) sequences verifying n / B tokens each, the
    shape of a speculative step (γ + 1 = 4) at that load;
  * draft time: one decode sub-step of the model drafter (the distilled drafter
    built by build_engines/distill_drafter.py, if any; its B sequences x 1 token at
    token batch B) — without one, the n-gram drafter's ~20 µs per sequence;
  * C_switch(L_max, B) (Nightjar): the catch-up prefill of L_max tokens for B
    sequences a model drafter pays after it was not drafting; zero without one.

    python -m build_engines.profile_costs --engine llama.cpp --out-dir .cache/profiles [--budget-s 120]

Within a time budget. Each context bucket gets an equal share of the time left (what one does
not use goes to the next), and inside it the points are measured in order of what the policies
read most: token batches 1, 2, 8, 32 (batch-1 speculation and the loads' anchors), then 128
and 4, then 16 and 64. Before each point its time is predicted from the points already
measured; one that would not fit in what is left of the share is skipped, and a slow point
gets fewer repeats. Skipped points are interpolated linearly in n between measured neighbours
(the policies interpolate the same way), so a slow engine (the batch-invariant torch engine on
an AVX2 CPU: ~0.3 s a token at 1,536 cached tokens) gets fewer, wider samples in minutes, not
an hour of them. The JSON records which points were measured (`measured`, `draft_measured`).

Each engine has its own curve (llama.cpp on a 2-core CPU is close to compute-bound,
so verifying k tokens costs nearly k steps; torch bf16 with native bf16 makes it
nearly free), so the profile is per engine: `<model>-<engine name>.json`, e.g.
smollm2-135m-llama.cpp-Q8_0.json, and the policy configs name it with `{engine}`
(backend/served_policy.py fills in the served engine). The profile records which
drafter it measured; a run whose drafter differs (one was built since) measures the
drafter's tables again and keeps the target's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

CTX_BUCKETS = (128, 512, 1536)
TOKEN_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
# measurement order inside a context bucket: what batch-1 speculation and the loads' anchors read first
PRIORITY = ((1, 2, 8, 32), (128, 4), (16, 64))
SWITCH_L_MAX, SWITCH_BATCH = (16, 64, 256, 1024), (1, 8, 32)
PROFILE_VERSION = 2  # 2: measured within a budget; `measured` marks the points not interpolated
DEFAULT_BUDGET_S = 120.0
DRAFTER_SHARE = 0.3  # of the budget, for a model drafter's tables (the target's table gets the rest)


def log(msg: str) -> None:
    print(f"[profile_costs] {msg}", flush=True)


def shape_for(n: int) -> tuple:
    """(sequences, tokens per sequence) whose product is the token batch n."""
    b = max(1, n // 4)
    return b, n // b


def median_time(fn, repeats: int) -> float:
    """Wall time of fn() over `repeats` calls after one warm-up (oneDNN picks kernels then): the
    lower median. Other processes on a shared machine only ever add time, and llama.cpp's
    spinning workers turn a descheduled thread into a stall of a whole time slice, so the upper
    half of the samples measures the neighbours, not the engine."""
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median_low(sorted(samples[1:])[: max(1, repeats // 2 + 1)])


def interpolate_row(xs: Sequence[float], known: Dict[float, float]) -> List[float]:
    """A value for every x: measured where known, else linear between the nearest known
    neighbours, linear from the last two beyond the ends (one known point: proportional to x).

    >>> interpolate_row([1, 2, 4, 8], {1: 1.0, 4: 2.5})
    [1.0, 1.5, 2.5, 4.5]
    >>> interpolate_row([1, 2, 4], {2: 0.5})
    [0.25, 0.5, 1.0]
    """
    pts = sorted(known.items())
    if len(pts) == 1:
        (x0, y0), = pts
        return [y0 * x / x0 for x in xs]
    out = []
    for x in xs:
        if x in known:
            out.append(known[x])
            continue
        i = next((k for k, (px, _) in enumerate(pts) if px > x), len(pts))
        (xa, ya), (xb, yb) = pts[min(max(i - 1, 0), len(pts) - 2)], pts[min(max(i, 1), len(pts) - 1)]
        out.append(max(0.0, ya + (yb - ya) * (x - xa) / (xb - xa)))
    return out


class BudgetedTable:
    """A table of seconds, one row per context bucket over the token batches, measured point by
    point before a deadline; the points that would not fit are interpolated. Rows are measured
    one after another (a row's cache is filled once), each within an equal share of the time
    left, so what one row does not use goes to the next; inside a row, in PRIORITY's order.

    `measure(row, n, repeats)` returns one point's time."""

    def __init__(self, rows: Sequence[int], xs: Sequence[int], budget_s: float, repeats: int, label: str):
        self.rows, self.xs, self.repeats, self.label = tuple(rows), tuple(xs), repeats, label
        self.deadline = time.monotonic() + budget_s
        self.known: Dict[int, Dict[int, float]] = {r: {} for r in self.rows}

    def predict(self, row: int, x: int) -> Optional[float]:
        """A point's time from the points measured: its own row, else the row before (times the
        context ratio: an upper bound, as if attention were all of it); None before any."""
        if self.known[row]:
            return interpolate_row([x], self.known[row])[0]
        i = self.rows.index(row)
        for prev in reversed(self.rows[:i]):
            if self.known[prev]:
                return interpolate_row([x], self.known[prev])[0] * row / prev
        return None

    def run(self, measure: Callable[[int, int, int], float]) -> None:
        for i, row in enumerate(self.rows):
            row_deadline = time.monotonic() + (self.deadline - time.monotonic()) / (len(self.rows) - i)
            for x in priority_order(self.xs):
                guess = self.predict(row, x)
                left = row_deadline - time.monotonic()
                # a row's first point (n=1, the cheapest) is always measured: every row needs one
                if self.known[row] and (self.repeats_for(guess) + 1) * guess > left:
                    log(f"{self.label}: context {row}, n={x} skipped (~{guess * 1000:.0f} ms a call, "
                        f"{max(0.0, left):.0f} s of this context's share left): interpolated")
                    continue
                repeats = self.repeats if guess is None else self.repeats_for(guess)
                self.known[row][x] = t = measure(row, x, repeats)
                log(f"{self.label}: context {row:5d}, n={x:4d}: {1000 * t:8.1f} ms ({repeats} repeats)")

    def repeats_for(self, guess: float) -> int:
        """Fewer repeats for slow points: about a second's worth, at least one."""
        return max(1, min(self.repeats, int(1.0 / max(guess, 1e-6))))

    def table(self) -> List[List[float]]:
        """Every row over every x (run() measures at least one point of each row)."""
        return [interpolate_row(self.xs, self.known[r]) for r in self.rows]

    def measured(self) -> List[List[bool]]:
        return [[x in self.known[r] for x in self.xs] for r in self.rows]


def priority_order(xs: Sequence[int]) -> List[int]:
    """The grid's points in measurement order: PRIORITY's, then any it does not name.

    >>> priority_order([1, 2, 4, 8, 16, 32, 64, 128, 256])
    [1, 2, 8, 32, 128, 4, 16, 64, 256]
    """
    order = [x for level in PRIORITY for x in level if x in xs]
    return order + [x for x in xs if x not in order]


def fill(engine, ctx: int, b: int) -> None:
    """Slots 0..b-1 hold ctx cached tokens (one prefill copied where the engine can copy)."""
    if hasattr(engine, "copy_slot"):
        engine.forward([0], [0], [[11] * ctx], logit_rows=[[ctx - 1]])
        for s in range(1, b):
            engine.copy_slot(0, s)
    else:
        engine.forward(list(range(b)), [0] * b, [[11] * ctx] * b, logit_rows=[[ctx - 1]] * b)


class TargetTimer:
    """Forwards of token batch n at context ctx. An engine that can copy slots (llama.cpp, whose
    forward needs the positions before it filled) gets its slots filled once per bucket: every
    forward starts at ctx and so replaces only what the last one wrote. The torch engine is not
    filled: attending over zeros costs what attending over real keys does."""

    def __init__(self, engine, max_b: int):
        self.engine, self.max_b, self.filled = engine, max_b, None

    def __call__(self, ctx: int, n: int, repeats: int) -> float:
        if hasattr(self.engine, "copy_slot") and self.filled != ctx:
            fill(self.engine, ctx, self.max_b)
            self.filled = ctx
        b, t = shape_for(n)
        slots = list(range(b))
        return median_time(lambda: self.engine.forward(slots, [ctx] * b, [[7] * t] * b), repeats)


def time_ngram_draft(repeats: int = 200) -> float:
    from backend.drafters import make_drafter
    d = make_drafter("ngram")
    seq = list(range(400)) * 2
    t0 = time.perf_counter()
    for i in range(repeats):
        d.propose(0, seq[: 400 + i], 4)
    return (time.perf_counter() - t0) / repeats


def time_decode(engine, ctx: int, b: int, repeats: int) -> float:
    """One decode sub-step of b sequences (1 token each) at context ctx. The cache is not filled
    first: attending over zeros costs what attending over real keys does, and filling 128
    sequences of 1.5k tokens would take minutes."""
    slots = list(range(b))
    return median_time(lambda: engine.forward(slots, [ctx] * b, [[7]] * b), repeats)


def time_catch_up(engine, l_max: int, b: int, repeats: int) -> float:
    return median_time(lambda: engine.forward(list(range(b)), [0] * b, [[11] * l_max] * b,
                                              logit_rows=[[l_max - 1]] * b), repeats)


def profiled_drafter(drafter_dir: Path) -> Optional[Path]:
    """The model drafter the profile measures: the first built of chat, code."""
    from backend.drafters.artifacts import find_artifact
    return next((p for p in (find_artifact(drafter_dir, n) for n in ("chat", "code")) if p is not None), None)


def drafter_label(path: Optional[Path]) -> str:
    """What the profile records as its drafter (a rebuilt drafter gets a new label)."""
    if path is None:
        return "ngram"
    mf = path / "manifest.json"
    return f"{path.name}@{json.loads(mf.read_text()).get('built_at', '?') if mf.exists() else '?'}"


def switch_costs(engine, repeats: int, deadline: float) -> List[List[float]]:
    """C_switch(l_max, b), smallest first; what is too big for this machine (over 8,192 tokens)
    or for the budget is extrapolated linearly in tokens from the l_max before it."""
    seconds = [[0.0] * len(SWITCH_BATCH) for _ in SWITCH_L_MAX]
    for i, lm in enumerate(SWITCH_L_MAX):
        for j, b in enumerate(SWITCH_BATCH):
            guess = seconds[i - 1][j] * lm / SWITCH_L_MAX[i - 1] if i else 0.0
            if lm * b <= 8192 and (i == 0 or 2 * guess < deadline - time.monotonic()):
                seconds[i][j] = time_catch_up(engine, lm, b, max(1, repeats // 2))
            else:
                seconds[i][j] = guess
    return seconds


def drafter_profile(path: Path, dtype: str, repeats: int, budget_s: float):
    """(draft_s table, which points were measured, switch-cost table) of a built model drafter."""
    from backend.engines.torch_llama import TorchLlama
    eng = TorchLlama(path, dtype=dtype, max_slots=TOKEN_BATCH[-1], max_context=CTX_BUCKETS[-1] + 16,
                     batch_invariant=False)  # as backend/drafters/model.py runs drafters
    table = BudgetedTable(CTX_BUCKETS, TOKEN_BATCH, 0.7 * budget_s, repeats, f"drafter {path.name}")
    table.run(lambda ctx, b, r: time_decode(eng, ctx, b, r))
    switch = switch_costs(eng, repeats, time.monotonic() + 0.3 * budget_s)
    log(f"{path.name} catch-up (l_max x batch, s): {switch}")
    return table.table(), table.measured(), {"l_max": list(SWITCH_L_MAX), "batch": list(SWITCH_BATCH),
                                             "seconds": switch}


def target_engine(cfg, max_slots: int, max_context: int):
    """The engine a ServerConfig serves (engine, checkpoint, dtype, batch_invariant, gguf), sized
    for the profile."""
    root = Path.cwd()
    checkpoint = cfg.resolve(cfg.checkpoint, root)
    if cfg.engine == "llama.cpp":
        from backend.engines.llama_cpp import LlamaCpp, served_gguf
        gguf = cfg.resolve(cfg.gguf, root) if cfg.gguf else served_gguf(checkpoint)
        return LlamaCpp(gguf, max_slots=max_slots, max_context=max_context)
    from backend.engines.torch_llama import TorchLlama
    return TorchLlama(checkpoint, dtype=cfg.dtype, max_slots=max_slots, max_context=max_context,
                      batch_invariant=cfg.batch_invariant)


def profile_name(model: str, engine_name: str) -> str:
    """The profile file of an engine: torch/bf16 -> <model>-torch-bf16.json."""
    return f"{model}-{engine_name.replace('/', '-')}.json"


def target_profile(engine, repeats: int, budget_s: float) -> dict:
    """The target's step-time table, measured within budget_s."""
    table = BudgetedTable(CTX_BUCKETS, TOKEN_BATCH, budget_s, repeats, "target")
    timer = TargetTimer(engine, shape_for(TOKEN_BATCH[-1])[0])
    table.run(timer)
    return {"ctx_buckets": list(CTX_BUCKETS), "token_batch": list(TOKEN_BATCH), "target_s": table.table(),
            "measured": table.measured()}


def draft_tables(drafter_dir: Path, dtype: str, repeats: int, budget_s: float) -> dict:
    """The profile's drafter part: the model drafter's tables, or the n-gram drafter's cost."""
    path = profiled_drafter(drafter_dir)
    if path is None:
        ngram = time_ngram_draft()
        log(f"no model drafter built; ngram draft: {1e6 * ngram:.0f} µs per sequence")
        return {"drafter": "ngram", "draft_s": [[ngram * n for n in TOKEN_BATCH] for _ in CTX_BUCKETS],
                "draft_measured": [[True] * len(TOKEN_BATCH) for _ in CTX_BUCKETS],
                "switch_cost": {"l_max": list(SWITCH_L_MAX), "batch": list(SWITCH_BATCH),
                                "seconds": [[0.0] * len(SWITCH_BATCH)] * len(SWITCH_L_MAX)}}
    draft_s, measured, switch = drafter_profile(path, dtype, repeats, budget_s)
    return {"drafter": drafter_label(path), "draft_s": draft_s, "draft_measured": measured, "switch_cost": switch}


def profile(engine, name: str, checkpoint: Path, dtype: str, repeats: int, drafter_dir: Path,
            budget_s: float = DEFAULT_BUDGET_S, target: Optional[dict] = None) -> dict:
    """The whole profile of the engine called `name`; `target` (a previous profile's target part)
    is kept, not measured, and then no engine is needed (None)."""
    import torch

    t0 = time.monotonic()
    if target is None:
        has_drafter = profiled_drafter(drafter_dir) is not None
        target = target_profile(engine, repeats, budget_s * (1 - DRAFTER_SHARE if has_drafter else 1.0))
        if hasattr(engine, "close"):
            engine.close()
    del engine
    drafts = draft_tables(drafter_dir, dtype, repeats, max(1.0, budget_s - (time.monotonic() - t0)))
    zeros = [0.0] * len(TOKEN_BATCH)
    return {
        "profile_version": PROFILE_VERSION,
        "checkpoint": str(checkpoint), "engine": name, "dtype": dtype, "threads": torch.get_num_threads(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget_s": budget_s, "elapsed_s": round(time.monotonic() - t0, 1),
        # AdaSpec step-time table (policy/profiles.py StepTimeProfile)
        **target, **{k: v for k, v in drafts.items() if k != "switch_cost"},
        "target_overhead_s": zeros, "draft_overhead_s": zeros,
        # Nightjar C_switch(L_max, B) (policy/profiles.py SwitchCostTable)
        "switch_cost": drafts["switch_cost"],
    }


TARGET_KEYS = ("ctx_buckets", "token_batch", "target_s", "measured")


def reusable_target(path: Path, engine_name: str) -> Optional[dict]:
    """The target part of a profile on disk, if this version measured it for this engine."""
    if not path.exists():
        return None
    have = json.loads(path.read_text())
    if have.get("profile_version") != PROFILE_VERSION or have.get("engine") != engine_name:
        return None
    return {k: have[k] for k in TARGET_KEYS if k in have}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "torch"])
    ap.add_argument("--dtype", default="bf16", help="torch engine's dtype")
    ap.add_argument("--no-batch-invariant", action="store_true", help="torch engine, bf16: the batch-variant kernels")
    ap.add_argument("--gguf", default="", help="llama.cpp engine: this GGUF instead of the checkpoint's")
    ap.add_argument("--out-dir", type=Path, default=Path(".cache/profiles"))
    ap.add_argument("--model", default="smollm2-135m", help="file name prefix")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per point (fewer for slow points)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="time for the whole profile; points that do not fit are interpolated")
    ap.add_argument("--drafter-dir", type=Path, default=Path(".cache/drafters"))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    from backend.served_policy import engine_name
    from backend.server_config import ServerConfig
    served = ServerConfig(checkpoint=str(args.checkpoint), engine=args.engine, dtype=args.dtype, gguf=args.gguf,
                          batch_invariant=not args.no_batch_invariant)
    name = engine_name(served, Path.cwd())
    args.out = args.out_dir / profile_name(args.model, name)
    target = None
    if args.out.exists() and not args.force:  # checked before loading the engine: a second set-up is quick
        have = json.loads(args.out.read_text())
        built = drafter_label(profiled_drafter(args.drafter_dir))
        target = reusable_target(args.out, name)
        if target is not None and have.get("drafter") == built:
            log(f"{args.out} is up to date ({built}); --force to measure again")
            return 0
        if target is not None:
            log(f"{args.out} measured {have.get('drafter')!r}, now {built!r}: measuring the drafter again")
    engine = None if target is not None else target_engine(served, shape_for(TOKEN_BATCH[-1])[0], CTX_BUCKETS[-1] + 16)
    log(f"measuring {name} within {args.budget_s:.0f} s")
    result = profile(engine, name, args.checkpoint, args.dtype, args.repeats, args.drafter_dir, args.budget_s, target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    switch = args.out.with_name(args.out.stem + ".switch.json")
    switch.write_text(json.dumps(result["switch_cost"], indent=1))
    log(f"wrote {args.out} and {switch} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
