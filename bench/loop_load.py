"""The server's own loop in process under closed-loop load: tokens/s and what the policy did.

    .venv/bin/python bench/loop_load.py configs/policies/composite.yaml --batch 8 --workload chat --seconds 30
    .venv/bin/python bench/loop_load.py configs/policies/off.yaml --batch 8 --workload chat --seconds 30

`backend/services/build.build_loop` with the served settings and this policy, `--batch` requests
running at once (each finished one replaced by the next held-out prompt of the workload, 64 new
tokens, chat template), for `--seconds` after one warm-up request. Prints the tokens emitted over
the window (every step's, finished requests or not), the share of sequence-steps that drafted,
and the mean step time of drafting and plain steps. No Triton, no HTTP: what the loop and the
policy cost, without the server's own noise. This host drifts by 10-50% within minutes: compare
policies in alternating processes, several rounds.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from peer_workloads import WORKLOADS, sessions  # bench/ (the script's own folder)

from backend.generation.request import GenerationRequest
from backend.loop.offline import ListSink
from backend.server_config import ServerConfig
from backend.services.build import build_loop
from backend.services.heap import freeze_startup_objects

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", help="a policy's YAML file (configs/policies/*.yaml) or registered name")
    ap.add_argument("--batch", type=int, default=8)
    # multi-turn resends the server's own answers: a client's loop (bench_peer.py), not this one
    ap.add_argument("--workload", choices=[w for w in WORKLOADS if w != "multiturn"], default="chat")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    loop = build_loop(ServerConfig(max_batch=a.batch, policy=a.policy), ROOT)
    steps = []
    loop.add_outcome_listener(steps.append)
    prompts = iter([turns[0] for _, turns in sessions(a.workload, 1000)])

    def submit(prompt: str) -> ListSink:
        sink = ListSink()
        loop.submit(GenerationRequest(prompt=prompt, max_new_tokens=a.max_tokens, apply_chat_template=True,
                                      exclude_input_in_output=True), sink)
        return sink

    warm = submit("Hello")
    while not warm.done:
        loop.step()
    freeze_startup_objects()  # as the server does once started
    steps.clear()
    live = [submit(next(prompts)) for _ in range(a.batch)]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        loop.step()
        for sink in [s for s in live if s.done]:
            live.remove(sink)
            live.append(submit(next(prompts)))
    wall = time.perf_counter() - t0
    drafting = [o for o in steps if any(s.gamma for s in o.sequences)]
    plain = [o for o in steps if not any(s.gamma for s in o.sequences)]
    seq_steps = sum(o.batch_size for o in steps)

    def mean_ms(xs) -> str:
        return f"{1e3 * sum(o.total_time_s for o in xs) / len(xs):.1f} ms" if xs else "-"

    print(f"{a.policy} at {a.batch} sequences, {a.workload}: {sum(o.emitted for o in steps) / wall:.1f} tok/s "
          f"over {wall:.0f} s ({len(steps)} steps); drafted in "
          f"{sum(1 for o in steps for s in o.sequences if s.gamma)} of {seq_steps} sequence-steps; "
          f"steps: drafting {len(drafting)} ({mean_ms(drafting)}), plain {len(plain)} ({mean_ms(plain)})", flush=True)


if __name__ == "__main__":
    main()
