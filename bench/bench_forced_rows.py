"""Structured output in process: what speculation on forced tokens buys on the served llama.cpp
engine, and what leaving out the logits of forced rows adds (issue 32).

bench_structured.py's JSON-schema workload (its prompts, schemas, chat template, greedy), run to
the end through the engine loop (backend/loop/engine_loop.py) at each --batch, --rounds times, with
policy off, the served composite (configs/policies/composite.yaml, with this machine's cost profile), and the static
grammar drafter (gamma 6); the last two also with every row's logits computed (GuidedSequences.skip_forced
switched off: the code before forced rows went without them). Each configuration's tokens/s is
printed beside the same round's policy off, and every run's texts must equal policy off's.

    .venv/bin/python bench/bench_forced_rows.py                 # batch 1, 8, 32; 2 rounds
    .venv/bin/python bench/bench_forced_rows.py --batch 1 --rounds 1 --requests 4

Writes bench/results/forced_rows.json. Run it alone: two llama.cpp workloads on the same cores
slow each other down many times over (their threads spin).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_structured import SCHEMAS, workload  # bench/ (its own folder)

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = [("off", True), ("composite", True), ("composite", False), ("grammar", True), ("grammar", False)]
RESULTS = ROOT / "bench" / "results"
SERVED_POLICY_CONFIG = "configs/policies/composite.yaml"  # what model_repository/llm/config.pbtxt serves


def label(policy: str, forced_rows: bool) -> str:
    return policy if forced_rows or policy == "off" else f"{policy}, every row's logits"


def make_requests(n: int, max_tokens: int) -> list:
    from backend.generation.guided import Guide
    from backend.generation.request import GenerationRequest
    return [GenerationRequest(prompt=turns[0], max_new_tokens=max_tokens, exclude_input_in_output=True,
                              apply_chat_template=True,
                              guide=Guide("json_schema", json.dumps(SCHEMAS[key.split("/", 1)[0]])))
            for key, turns in workload(n, seed=1)]


def run(engine, tokenizer, policy: str, forced_rows: bool, batch: int, requests: list) -> dict:
    from backend.drafters import make_drafter
    from backend.generation.request import Limits
    from backend.loop.config import LoopConfig
    from backend.loop.engine_loop import EngineLoop
    from backend.loop.offline import run_all
    from backend.served_policy import load_policy
    from backend.server_config import ServerConfig
    from policy import make_policy

    cfg = ServerConfig()
    pol = (make_policy("static", drafter="grammar", gamma=6) if policy == "grammar" else make_policy("off")
           if policy == "off" else load_policy(ServerConfig(policy=SERVED_POLICY_CONFIG), ROOT))
    loop = EngineLoop(engine, tokenizer, {n: make_drafter(n) for n in cfg.drafters.split(",")}, pol,
                      LoopConfig(max_batch=batch, limits=Limits(max_new_tokens_limit=4096, max_context=engine.max_context)))
    if not forced_rows:
        loop.guides.skip_forced = False
    t0 = time.perf_counter()
    sinks = run_all(loop, requests)
    wall = time.perf_counter() - t0
    tokens = sum(s.chunks[-1].num_output_tokens for s in sinks)
    return {"config": label(policy, forced_rows), "tok_s": tokens / wall, "steps": loop.stats.steps,
            "drafted": loop.stats.drafted, "accepted": loop.stats.accepted, "texts": [s.text for s in sinks]}


def plot(rows: list, batches: list, path: Path) -> None:
    """Median x policy off per configuration, grouped by batch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = [label(p, f) for p, f in CONFIGS[1:]]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(configs)
    for i, c in enumerate(configs):
        ys = [statistics.median(r["vs_off"] for r in rows if r["batch"] == b and r["config"] == c) for b in batches]
        ax.bar([j + i * width for j in range(len(batches))], ys, width, label=c)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s, x policy off")
    ax.set_title("JSON-schema answers in process (llama.cpp, Q8_0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=0, help="requests a level (default: max(2 x batch, 8))")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=RESULTS / "forced_rows.json")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from backend.engines.llama_cpp import LlamaCpp, served_gguf
    torch.set_num_threads(1)  # the engine's threads are llama.cpp's
    checkpoint = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rows, same = [], True
    print(f"JSON-schema answers in process, {os.cpu_count()} cores; batch {args.batch}, {args.rounds} rounds, "
          f"{args.max_tokens} tokens, greedy", flush=True)
    for batch in args.batch:
        engine = LlamaCpp(served_gguf(checkpoint), max_slots=batch, max_context=1024)
        requests = make_requests(args.requests or max(2 * batch, 8), args.max_tokens)
        for rnd in range(args.rounds):
            base = None
            for policy, forced in CONFIGS:
                r = run(engine, tokenizer, policy, forced, batch, requests)
                base = base or r
                same = same and r["texts"] == base["texts"]
                r.update(batch=batch, round=rnd, vs_off=r["tok_s"] / base["tok_s"])
                rows.append({k: v for k, v in r.items() if k != "texts"})
                print(f"  batch {batch:2d} round {rnd}: {r['config']:32s} {r['tok_s']:6.1f} tok/s  {r['vs_off']:.2f}x off"
                      f"  steps {r['steps']:4d}  accepted {r['accepted']}/{r['drafted']}", flush=True)
        engine.close()
    print("\nmedian over rounds, x policy off (same round):")
    for batch in args.batch:
        cells = [f"{label(p, f)} {statistics.median(r['vs_off'] for r in rows if r['batch'] == batch and r['config'] == label(p, f)):.2f}"
                 for p, f in CONFIGS[1:]]
        print(f"  batch {batch:2d}: " + ", ".join(cells))
    print(f"every configuration's texts equal policy off's: {same}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                    "same_text": same}, indent=1))
    plot(rows, args.batch, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png').name}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
