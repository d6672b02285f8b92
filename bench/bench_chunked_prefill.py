"""Chunked prefill: how long a full-context prompt stalls the streams already running.

    .venv/bin/python bench/bench_chunked_prefill.py [--streams 4] [--chunks 0 256 128 64]

The served engine (llama.cpp, the checkpoint's GGUF, Q8_0 KV) in the served engine loop on
its own thread, plain decoding. `--streams` streaming requests decode (min_length keeps them
going); once each has streamed 16 tokens a prompt filling the context window (2,040 tokens)
arrives. Per prefill chunk size (0 = whole prompts, the old behaviour), side by side in one
run: the running streams' largest gap between two tokens while the long prompt is prefilled,
their median gap before it arrived, the long prompt's time to first token, and the tokens
the running streams produced meanwhile. Run on a quiet machine.

Writes bench/results/chunked_prefill.png and .json (the recorded run is in docs/results/).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from transformers import AutoTokenizer

from prompts import ARTICLE  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from backend.generation.logits_processors import Penalties
from backend.loop.offline import ListSink, make_loop
from backend.generation.request import GenerationRequest

CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
OUT = ROOT / "bench" / "results" / "chunked_prefill"  # the recorded run: docs/results/
CONTEXT = 2048
LONG_TOKENS = 2040


class TimedSink(ListSink):
    """A ListSink that notes when each response arrived."""

    def __init__(self):
        super().__init__()
        self.times = []

    def send(self, chunk, final):
        self.times.append(time.perf_counter())
        super().send(chunk, final)


def long_prompt(tok) -> str:
    ids = tok((ARTICLE + " ") * 12).input_ids[:LONG_TOKENS]
    text = tok.decode(ids)
    assert abs(len(tok(text).input_ids) - LONG_TOKENS) < 8
    return text


def run(engine, tok, chunk: int, streams: int, prompt: str) -> dict:
    loop = make_loop(engine, tok, "off", max_batch=streams + 1, prefill_chunk=chunk)
    loop.start()
    try:
        sinks = []
        for i in range(streams):
            sinks.append(TimedSink())
            loop.submit(GenerationRequest(prompt=f"Tell me a long story about river {i}.", max_new_tokens=1000, stream=True,
                                          penalties=Penalties(min_length=1000)), sinks[-1])
        while min(len(s.times) for s in sinks) < 16:
            time.sleep(0.01)
        long, t_submit = TimedSink(), time.perf_counter()
        loop.submit(GenerationRequest(prompt=prompt, max_new_tokens=4, exclude_input_in_output=True), long)
        while not long.done:
            time.sleep(0.01)
        t_first = long.times[0]  # not streaming: its one response is its first (and last) token
        time.sleep(1.0)  # a second of decoding after it
        for s in sinks:
            s.cancel = True
        while not all(s.done for s in sinks):
            time.sleep(0.01)
    finally:
        loop.stop()
    before = [b - a for s in sinks for a, b in zip(s.times, s.times[1:]) if b < t_submit]
    during = [(b - t_submit, b - a) for s in sinks for a, b in zip(s.times, s.times[1:]) if t_submit < b <= t_first + 0.5]
    return {"chunk": chunk, "median_gap_before_s": statistics.median(before),
            "largest_gap_s": max(g for _, g in during), "long_ttft_s": t_first - t_submit,
            "tokens_meanwhile": sum(1 for s in sinks for t in s.times if t_submit < t <= t_first),
            "gaps": during}


def plot(results: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in results:
        xs, ys = zip(*sorted(r["gaps"]))
        label = f"chunk {r['chunk']}" if r["chunk"] else "whole prompt (no chunks)"
        ax.plot(xs, [y * 1e3 for y in ys], ".-", ms=3, lw=0.8, label=f"{label}: largest {r['largest_gap_s']:.2f} s")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the 2,040-token prompt arrived")
    ax.set_ylabel("gap between two tokens of a running stream (ms)")
    ax.set_title("A full-context prompt arrives while streams decode (llama.cpp, plain decoding)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 128, 64])
    a = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(CHECKPOINT)
    engine = LlamaCpp(served_gguf(CHECKPOINT), max_slots=a.streams + 1, max_context=CONTEXT)
    prompt = long_prompt(tok)
    results = []
    print(f"{a.streams} streams decoding; a {LONG_TOKENS}-token prompt arrives ({engine.name})", flush=True)
    print(f"{'chunk':>6} {'median gap before':>18} {'largest gap':>12} {'ratio':>6} {'long TTFT':>10} "
          f"{'tokens meanwhile':>17}", flush=True)
    for chunk in a.chunks:
        r = run(engine, tok, chunk, a.streams, prompt)
        results.append(r)
        print(f"{chunk or 'whole':>6} {r['median_gap_before_s'] * 1e3:15.0f} ms {r['largest_gap_s']:10.2f} s "
              f"{r['largest_gap_s'] / r['median_gap_before_s']:5.0f}x {r['long_ttft_s']:8.2f} s "
              f"{r['tokens_meanwhile']:17d}", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, OUT.with_suffix(".png"))
    print(f"wrote {OUT.with_suffix('.png')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
