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

    python -m build_engines.profile_costs --engine llama.cpp --out-dir .cache/profiles

Each engine has its own curve (llama.cpp on a 2-core CPU is close to compute-bound,
so verifying k tokens costs nearly k steps; torch bf16 with native bf16 makes it
nearly free), so the profile is per engine: `<model>-<engine name>.json`, e.g.
smollm2-135m-llama.cpp-Q4_0.json, and the policy configs name it with `{engine}`
(backend/service.load_policy fills in the served engine). The profile records which
drafter it measured; a run whose drafter differs (one was built since) measures again.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Optional

CTX_BUCKETS = (128, 512, 1536)
TOKEN_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
PROFILE_VERSION = 1


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


def fill(engine, ctx: int, b: int) -> None:
    """Slots 0..b-1 hold ctx cached tokens (one prefill copied where the engine can copy)."""
    if hasattr(engine, "copy_slot"):
        engine.forward([0], [0], [[11] * ctx], logit_rows=[[ctx - 1]])
        for s in range(1, b):
            engine.copy_slot(0, s)
    else:
        engine.forward(list(range(b)), [0] * b, [[11] * ctx] * b, logit_rows=[[ctx - 1]] * b)


def time_forward(engine, ctx: int, n: int, repeats: int) -> float:
    b, t = shape_for(n)
    slots = list(range(b))
    fill(engine, ctx, b)
    return median_time(lambda: engine.forward(slots, [ctx] * b, [[7] * t] * b), repeats)


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
    from backend.drafters.model import find_artifact
    return next((p for p in (find_artifact(drafter_dir, n) for n in ("chat", "code")) if p is not None), None)


def drafter_label(path: Optional[Path]) -> str:
    """What the profile records as its drafter (a rebuilt drafter gets a new label)."""
    if path is None:
        return "ngram"
    mf = path / "manifest.json"
    return f"{path.name}@{json.loads(mf.read_text()).get('built_at', '?') if mf.exists() else '?'}"


def drafter_profile(path: Path, dtype: str, repeats: int):
    """(draft_s table, switch-cost table) of a built model drafter."""
    from backend.engines.torch_llama import TorchLlama
    eng = TorchLlama(path, dtype=dtype, max_slots=TOKEN_BATCH[-1], max_context=CTX_BUCKETS[-1] + 16,
                     batch_invariant=False)  # as backend/drafters/model.py runs drafters
    draft = []
    for ctx in CTX_BUCKETS:
        draft.append([time_decode(eng, ctx, n, repeats) for n in TOKEN_BATCH])
        log(f"{path.name}, context {ctx}: " + ", ".join(f"B={n} {1000 * t:.1f} ms"
                                                         for n, t in zip(TOKEN_BATCH, draft[-1])))
    l_max, batch = [16, 64, 256, 1024], [1, 8, 32]
    switch = [[time_catch_up(eng, lm, b, max(1, repeats // 2)) if lm * b <= 8192 else 0.0 for b in batch]
              for lm in l_max]
    for i, lm in enumerate(l_max):  # too big to time here: extrapolate linearly in tokens
        for j, b in enumerate(batch):
            if switch[i][j] == 0.0:
                switch[i][j] = switch[i - 1][j] * lm / l_max[i - 1]
    log(f"{path.name} catch-up (l_max x batch, s): {switch}")
    return draft, {"l_max": l_max, "batch": batch, "seconds": switch}


def target_engine(kind: str, checkpoint: Path, dtype: str, max_slots: int, max_context: int):
    if kind == "llama.cpp":
        from backend.engines.llama_cpp import LlamaCpp, served_gguf
        return LlamaCpp(served_gguf(checkpoint), max_slots=max_slots, max_context=max_context)
    from backend.engines.torch_llama import TorchLlama
    return TorchLlama(checkpoint, dtype=dtype, max_slots=max_slots, max_context=max_context)


def profile_name(model: str, engine_name: str) -> str:
    """The profile file of an engine: torch/bf16 -> <model>-torch-bf16.json."""
    return f"{model}-{engine_name.replace('/', '-')}.json"


def profile(engine, checkpoint: Path, dtype: str, repeats: int, drafter_dir: Path) -> dict:
    import torch

    target = []
    for ctx in CTX_BUCKETS:
        row = []
        for n in TOKEN_BATCH:
            row.append(time_forward(engine, ctx, n, repeats))
            log(f"context {ctx:5d}, token batch {n:4d} (B={shape_for(n)[0]}): {1000 * row[-1]:7.1f} ms")
        target.append(row)
    name = engine.name
    if hasattr(engine, "close"):
        engine.close()
    del engine
    zeros = [0.0] * len(TOKEN_BATCH)
    path = profiled_drafter(drafter_dir)
    drafter = drafter_label(path)
    if path is None:
        ngram = time_ngram_draft()
        log(f"no model drafter built; ngram draft: {1e6 * ngram:.0f} µs per sequence")
        draft_s = [[ngram * n for n in TOKEN_BATCH] for _ in CTX_BUCKETS]
        switch = {"l_max": [16, 64, 256, 1024], "batch": [1, 8, 32], "seconds": [[0.0] * 3] * 4}
    else:
        draft_s, switch = drafter_profile(path, dtype, repeats)
    return {
        "profile_version": PROFILE_VERSION,
        "checkpoint": str(checkpoint), "engine": name, "dtype": dtype, "threads": torch.get_num_threads(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # AdaSpec step-time table (policy/profiles.py StepTimeProfile)
        "ctx_buckets": list(CTX_BUCKETS), "token_batch": list(TOKEN_BATCH), "target_s": target,
        "drafter": drafter, "draft_s": draft_s,
        "target_overhead_s": zeros, "draft_overhead_s": zeros,
        # Nightjar C_switch(L_max, B) (policy/profiles.py SwitchCostTable)
        "switch_cost": switch,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "torch"])
    ap.add_argument("--dtype", default="bf16", help="torch engine's dtype")
    ap.add_argument("--out-dir", type=Path, default=Path(".cache/profiles"))
    ap.add_argument("--model", default="smollm2-135m", help="file name prefix")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--drafter-dir", type=Path, default=Path(".cache/drafters"))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    max_b = shape_for(TOKEN_BATCH[-1])[0]
    engine = target_engine(args.engine, args.checkpoint, args.dtype, max_b, CTX_BUCKETS[-1] + 16)
    args.out = args.out_dir / profile_name(args.model, engine.name)
    if args.out.exists() and not args.force:
        have = json.loads(args.out.read_text()).get("drafter")
        built = drafter_label(profiled_drafter(args.drafter_dir))
        if have == built:
            log(f"{args.out} is up to date ({built}); --force to measure again")
            return 0
        log(f"{args.out} measured {have!r}, now {built!r}: measuring again")
    log(f"measuring {engine.name}")
    result = profile(engine, args.checkpoint, args.dtype, args.repeats, args.drafter_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    switch = args.out.with_name(args.out.stem + ".switch.json")
    switch.write_text(json.dumps(result["switch_cost"], indent=1))
    log(f"wrote {args.out} and {switch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
