"""Offline profiler: the step-time and switch-cost tables the policies read.

Measures on this machine, with the real engine:
  * target forward time T(context bucket, token batch n) — AdaSpec's table; a token
    batch of n is B = max(1, n // 4) sequences verifying n / B tokens each, the
    shape of a speculative step (γ + 1 = 4) at that load;
  * draft time per model drafter (none yet: model-free drafters cost ~20 µs,
    measured into draft_s so the table is honest about it);
  * C_switch(L_max, B) (Nightjar): the catch-up prefill a model drafter pays after
    speculation was off. Model-free drafters have no state to catch up, so the
    table is zero until model drafters exist (issue 4).

    python -m build_engines.profile_costs --out .cache/profiles/smollm2-135m-bf16.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CTX_BUCKETS = (128, 512, 1536)
TOKEN_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
PROFILE_VERSION = 1


def log(msg: str) -> None:
    print(f"[profile_costs] {msg}", flush=True)


def shape_for(n: int) -> tuple:
    """(sequences, tokens per sequence) whose product is the token batch n."""
    b = max(1, n // 4)
    return b, n // b


def time_forward(engine, ctx: int, n: int, repeats: int) -> float:
    b, t = shape_for(n)
    slots = list(range(b))
    engine.forward(slots, [0] * b, [[11] * ctx] * b, logit_rows=[[ctx - 1]] * b)  # fill the cache
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        engine.forward(slots, [ctx] * b, [[7] * t] * b)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:])  # the first call warms oneDNN's kernels


def time_ngram_draft(repeats: int = 200) -> float:
    from backend.drafters import make_drafter
    d = make_drafter("ngram")
    seq = list(range(400)) * 2
    t0 = time.perf_counter()
    for i in range(repeats):
        d.propose(0, seq[: 400 + i], 4)
    return (time.perf_counter() - t0) / repeats


def profile(checkpoint: Path, dtype: str, repeats: int) -> dict:
    import torch

    from backend.engines.torch_llama import TorchLlama

    max_b = shape_for(TOKEN_BATCH[-1])[0]
    engine = TorchLlama(checkpoint, dtype=dtype, max_slots=max_b, max_context=CTX_BUCKETS[-1] + 16)
    target = []
    for ctx in CTX_BUCKETS:
        row = []
        for n in TOKEN_BATCH:
            row.append(time_forward(engine, ctx, n, repeats))
            log(f"context {ctx:5d}, token batch {n:4d} (B={shape_for(n)[0]}): {1000 * row[-1]:7.1f} ms")
        target.append(row)
    draft = time_ngram_draft()
    log(f"ngram draft: {1e6 * draft:.0f} µs per sequence")
    zeros = [0.0] * len(TOKEN_BATCH)
    return {
        "profile_version": PROFILE_VERSION,
        "checkpoint": str(checkpoint), "dtype": dtype, "threads": torch.get_num_threads(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # AdaSpec step-time table (policy/profiles.py StepTimeProfile)
        "ctx_buckets": list(CTX_BUCKETS), "token_batch": list(TOKEN_BATCH), "target_s": target,
        "draft_s": [[draft * n for n in TOKEN_BATCH] for _ in CTX_BUCKETS],
        "target_overhead_s": zeros, "draft_overhead_s": zeros,
        # Nightjar C_switch(L_max, B) (policy/profiles.py SwitchCostTable): no model drafter yet
        "switch_cost": {"l_max": [16, 64, 256, 1024], "batch": [1, 8, 32], "seconds": [[0.0] * 3] * 4},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        log(f"{args.out} exists; --force to measure again")
        return 0
    result = profile(args.checkpoint, args.dtype, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    switch = args.out.with_name(args.out.stem + ".switch.json")
    switch.write_text(json.dumps(result["switch_cost"], indent=1))
    log(f"wrote {args.out} and {switch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
