"""Which drafters and gammas the server's composite policy plays, per drafter set.

    .venv/bin/python bench/composite_drafter_usage.py ["ngram,suffix;ngram,suffix,code,chat"] [12]

In-process (the server's own loop, `backend/services/build.build_loop`, composite.yaml), batch 1:
the first N distinct held-out requests of bench/bench_speculation.py (copy-heavy,
free-form and code requests alternated), 64 new tokens each, one after the other, for
each ';'-separated drafter set. Prints tok/s and, per (drafter, gamma) played, the steps,
drafted, accepted and emitted tokens (drafter None: plain decoding steps).
"""
from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

from prompts import distinct_requests  # bench/ (the script's own folder)

from backend.loop.offline import run_all
from backend.generation.request import GenerationRequest
from backend.server_config import ServerConfig
from backend.services.build import build_loop

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sets = (argv[0] if argv else "ngram,suffix;ngram,suffix,code,chat").split(";")
    requests = distinct_requests(int(argv[1]) if len(argv) > 1 else 12, code=True)
    for drafters in sets:
        played = collections.defaultdict(lambda: [0, 0, 0, 0])  # steps, drafted, accepted, emitted

        def record(outcome) -> None:
            for s in outcome.sequences:
                row = played[(s.drafter, s.gamma)]
                row[0], row[1], row[2], row[3] = row[0] + 1, row[1] + s.gamma, row[2] + s.accepted, row[3] + s.emitted

        cfg = ServerConfig(policy="configs/policies/composite.yaml", drafters=drafters,
                           max_batch=1, max_context=2048)
        loop = build_loop(cfg, ROOT)
        loop.add_outcome_listener(record)
        tokens, seconds = 0, 0.0
        for prompt in requests:
            req = GenerationRequest(prompt=prompt, max_new_tokens=64, apply_chat_template=True, exclude_input_in_output=True)
            t0 = time.perf_counter()
            sink = run_all(loop, [req])[0]
            seconds += time.perf_counter() - t0
            tokens += sink.chunks[-1].num_output_tokens
        print(f"== {drafters}: {tokens / seconds:.1f} tok/s over {len(requests)} requests, "
              f"{sum(r[0] for r in played.values())} steps", flush=True)
        for (d, g), (steps, drafted, accepted, emitted) in sorted(played.items(), key=lambda kv: str(kv[0])):
            print(f"   {str(d):8s} gamma {g}: steps {steps:4d} drafted {drafted:4d} accepted {accepted:4d} "
                  f"emitted {emitted:4d}")


if __name__ == "__main__":
    main()
