"""What batch invariance costs the torch engine, and what it buys, measured side by side.

TorchLlama(batch_invariant=True) (the default, bf16) pads linear layers to >= 8 rows and
gives the CPU flash attention one token per batch entry and keys in whole 512-key blocks, so
a position's logits do not depend on what shares the forward (backend/engines/torch_llama.py).
This script builds
the engine both ways in one process and prints

  1. step times, on vs off, timed round-robin (one call of each per round) so a noisy
     neighbour hits both alike: decode B=1, B=8, B=32 (context 128), verify k=4 drafts
     (5 tokens), prefill 256 tokens; and the on/off ratio;
  2. divergence: N greedy prompts (bench/prompts.py) decoded for 48 tokens alone, one
     sequence per forward, and again 8 at a time in one ragged batch (mixed prompt
     lengths, one ragged prefill); how many of the N outputs differ, on vs off.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_batch_invariance.py [--prompts 16] [--tokens 48] [--repeats 7]

About 4 minutes on one core of an idle machine (OMP_NUM_THREADS=1 keeps the timings steady
when other work shares the cores; two OpenMP threads fighting a neighbour slow 10x).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from backend.engines.torch_llama import TorchLlama, native_bf16

CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CONTEXT = 128


def log(*a):
    print(*a, flush=True)


def interleaved(calls: dict, repeats: int) -> dict:
    """Median seconds per call of each labelled function, round-robin after one warm-up round."""
    times = {k: [] for k in calls}
    for r in range(repeats + 1):
        for k, f in calls.items():
            t = time.perf_counter()
            f()
            if r:
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def step_times(engines: dict, repeats: int) -> None:
    tok = list(range(1000, 1000 + CONTEXT))
    for name, eng in engines.items():  # 32 slots at context CONTEXT
        log(f"  filling 32 slots of '{name}' ...")
        for b in range(0, 32, 8):
            eng.forward(list(range(b, b + 8)), [0] * 8, [tok] * 8, logit_rows=[[]] * 8)
    cases = {
        "decode B=1": lambda e: e.forward([0], [CONTEXT], [[7]]),
        "decode B=8": lambda e: e.forward(list(range(8)), [CONTEXT] * 8, [[7]] * 8),
        "decode B=32": lambda e: e.forward(list(range(32)), [CONTEXT] * 32, [[7]] * 32),
        "verify k=4": lambda e: e.forward([0], [CONTEXT], [[7, 8, 9, 10, 11]]),
        "prefill 256": lambda e: e.forward([0], [0], [list(range(2000, 2256))], logit_rows=[[255]]),
    }
    log(f"\n{'step':<14}{'on ms':>9}{'off ms':>9}{'on/off':>8}")
    for label, f in cases.items():
        t = interleaved({k: (lambda e=e: f(e)) for k, e in engines.items()}, repeats)
        log(f"{label:<14}{t['on'] * 1e3:9.2f}{t['off'] * 1e3:9.2f}{t['on'] / t['off']:8.3f}")
    for eng in engines.values():  # the prefill case overwrote slot 0; refill for hygiene
        eng.forward([0], [0], [tok], logit_rows=[[]])


def prompts(n: int, tokenizer) -> list:
    """n chat-templated prompts from bench/prompts.py: held-out ShareGPT requests when the
    download is there, else the fixed prompts, cycled with a numbered prefix."""
    try:
        from bench.prompts import distinct_requests
        texts = distinct_requests(n)
    except Exception as e:  # noqa: BLE001 - the dataset is optional here
        from bench.prompts import CODE_PROMPTS, COPY_HEAVY, FREE_FORM, PROSE_PROMPTS
        log(f"  (held-out requests unavailable: {type(e).__name__}; using the fixed prompts)")
        fixed = [*COPY_HEAVY.values(), *FREE_FORM.values(), *CODE_PROMPTS.values(), *PROSE_PROMPTS.values()]
        texts = [(f"Request {i + 1}. " if i >= len(fixed) else "") + fixed[i % len(fixed)] for i in range(n)]
    out = []
    for t in texts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        out.append(list(ids)[-400:])  # keep prompt + decode inside the engine's context
    return out


def greedy(eng: TorchLlama, group: list, n_tokens: int) -> list:
    """Greedy-decode every prompt of `group` together (slots 0..len-1, one ragged prefill,
    then one token per sequence per forward)."""
    B = len(group)
    slots = list(range(B))
    logits = eng.forward(slots, [0] * B, group, logit_rows=[[len(p) - 1] for p in group])
    outs = [[t] for t in logits.argmax(-1).tolist()]
    for i in range(n_tokens - 1):
        starts = [len(p) + i for p in group]
        logits = eng.forward(slots, starts, [[o[-1]] for o in outs])
        for o, t in zip(outs, logits.argmax(-1).tolist()):
            o.append(t)
    return outs


def divergence(engines: dict, n: int, n_tokens: int, batch: int = 8) -> None:
    from transformers import AutoTokenizer
    ps = prompts(n, AutoTokenizer.from_pretrained(CHECKPOINT))
    log(f"\n{n} prompts of {min(map(len, ps))}..{max(map(len, ps))} tokens, {n_tokens} greedy tokens each")
    for name, eng in engines.items():
        t = time.perf_counter()
        alone = []
        for i, p in enumerate(ps):
            alone += greedy(eng, [p], n_tokens)
            if (i + 1) % 4 == 0:
                log(f"  [{name}] alone {i + 1}/{n}")
        log(f"  [{name}] decoded {n} prompts alone ({time.perf_counter() - t:.0f} s)")
        t = time.perf_counter()
        batched = []
        for g in range(0, n, batch):
            batched += greedy(eng, ps[g: g + batch], n_tokens)
        log(f"  [{name}] decoded them {batch} per batch ({time.perf_counter() - t:.0f} s)")
        differ = [i for i, (a, b) in enumerate(zip(alone, batched)) if a != b]
        first = [next(j for j, (x, y) in enumerate(zip(alone[i], batched[i])) if x != y) for i in differ]
        log(f"batch_invariant={name}: {len(differ)}/{n} outputs differ between alone and batched"
            + (f" (first differing token index: {first})" if differ else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-timing", action="store_true")
    a = ap.parse_args()
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, native bf16: {native_bf16()}")
    engines = {k: TorchLlama(CHECKPOINT, dtype="bf16", max_slots=32, max_context=512, batch_invariant=k == "on")
               for k in ("on", "off")}
    if not a.skip_timing:
        step_times(engines, a.repeats)
    divergence(engines, a.prompts, a.tokens)


if __name__ == "__main__":
    main()
