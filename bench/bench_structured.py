"""Structured output: JSON-schema answers from our server (default policy, and policy off) and from
llama.cpp's llama-server with the same schema (its OpenAI `response_format` json_schema), on the
same GGUF, prompts and client (issue 32).

The workload asks to extract facts from a short generated text into JSON under one of three
schemas (a person, a product, an event): keys, punctuation and enum values are forced by the
schema, the values are the model's. Every request sends `response_format: {"type": "json_schema",
...}`, streaming, temperature 0, --max-tokens. Closed loop at each of --streams for --seconds, a
fresh server per level, one at a time (bench/bench_peer.py's servers and client).

Prints per level output tokens/s, TTFT and TPOT p50, the share of finished answers that parse and
have the schema's keys in order; then default / off and default / llama-server per level, and the
share of prompts whose text is the same under the default policy and off (lossless: it must be all).

    .venv/bin/python bench/bench_structured.py                        # 1 and 8 streams, 30 s each
    .venv/bin/python bench/bench_structured.py --streams 1 --seconds 15 --skip-peer

Writes bench/results/structured.json and structured.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
from pathlib import Path

from bench_peer import CHECKPOINT, RESULTS, log, our_server, peer_server, ramp, serve_level  # bench/ (its own folder)
from peer_stats import identity, summarise

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
        "occupation": {"type": "string"}, "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age", "city", "occupation", "hobbies"], "additionalProperties": False},
    "product": {"type": "object", "properties": {
        "product": {"type": "string"}, "price": {"type": "number"},
        "currency": {"type": "string", "enum": ["USD", "EUR", "GBP"]}, "in_stock": {"type": "boolean"},
        "color": {"type": "string"}},
        "required": ["product", "price", "currency", "in_stock", "color"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "title": {"type": "string"}, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "city": {"type": "string"}, "attendees": {"type": "integer"}, "free": {"type": "boolean"}},
        "required": ["title", "date", "city", "attendees", "free"], "additionalProperties": False},
}
NAMES = ["Alice Martin", "Bob Chen", "Carla Rossi", "David Okafor", "Emma Schulz", "Farid Haddad", "Grace Kim",
         "Hugo Lefevre", "Ines Duarte", "Jonas Berg"]
CITIES = ["Lisbon", "Toronto", "Osaka", "Nairobi", "Berlin", "Lima", "Oslo", "Melbourne", "Dublin", "Seoul"]
JOBS = ["nurse", "architect", "baker", "pilot", "teacher", "software engineer", "farmer", "journalist"]
HOBBIES = ["chess", "hiking", "painting", "cycling", "cooking", "birdwatching", "swimming", "photography"]
PRODUCTS = ["desk lamp", "rain jacket", "coffee grinder", "wireless mouse", "yoga mat", "backpack", "teapot"]
COLORS = ["red", "navy blue", "forest green", "black", "white", "orange"]
EVENTS = ["Spring Jazz Night", "Open Source Summit", "Farmers Market Day", "Charity 10K Run", "Poetry Slam"]


def prompt(kind: str, rng: random.Random) -> str:
    if kind == "person":
        h = rng.sample(HOBBIES, 2)
        text = (f"{rng.choice(NAMES)} is {rng.randint(21, 70)} years old and works as a {rng.choice(JOBS)} in "
                f"{rng.choice(CITIES)}. In their free time they enjoy {h[0]} and {h[1]}.")
    elif kind == "product":
        text = (f"The {rng.choice(COLORS)} {rng.choice(PRODUCTS)} costs {rng.randint(5, 300)}.{rng.randint(0, 99):02d} "
                f"{rng.choice(['dollars', 'euros', 'pounds'])} and is {rng.choice(['in stock', 'sold out'])}.")
    else:
        text = (f"{rng.choice(EVENTS)} takes place in {rng.choice(CITIES)} on 2026-{rng.randint(1, 12):02d}-"
                f"{rng.randint(1, 28):02d}; {rng.randint(20, 900)} people are expected and entry is "
                f"{rng.choice(['free', 'ticketed'])}.")
    return f"Extract the facts from this text as JSON.\n\n{text}"


def workload(n: int, seed: int = 0) -> list:
    """(key, [prompt]) sessions: one-turn, schemas in turn; the key names its schema."""
    rng = random.Random(seed)
    kinds = list(SCHEMAS)
    return [(f"{kinds[i % 3]}/{i}", [prompt(kinds[i % 3], rng)]) for i in range(n)]


def response_format(key: str) -> dict:
    kind = key.split("/", 1)[0]
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": kind, "schema": SCHEMAS[kind], "strict": True}}}


def valid(key: str, text: str) -> bool:
    """A finished answer that parses and has its schema's keys, in order."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and list(value) == SCHEMAS[key.split("/", 1)[0]]["required"]


def run_level(name: str, start, specs, streams: int, args) -> tuple:
    requests, w0, w1, started, _ = serve_level(name, start, specs, streams, ramp(streams), args.seconds,
                                               args.max_tokens, extra=response_format)
    done = [r for r in requests if r.ok]
    finished = [r for r in done if r.tokens < args.max_tokens]
    row = {"server": name, "streams": streams, "start_s": started, **summarise(requests, w0, w1),
           "finished": len(finished), "valid": sum(valid(r.key, r.text) for r in finished)}
    row["valid_share"] = row["valid"] / len(finished) if finished else math.nan
    log(f"  {name:14s} {streams:3d} streams: {row['tok_s']:7.1f} tok/s  TTFT p50 {row['ttft_p50_s']:5.2f} s  TPOT p50 "
        f"{row['tpot_p50_ms']:6.1f} ms  done {row['done']:4d} failed {row['failed']}  valid JSON "
        f"{row['valid']}/{len(finished)} finished" + (f"  errors: {row['errors']}" if row["errors"] else ""))
    return row, {r.key: r.text for r in done}


def plot(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    servers = list(dict.fromkeys(r["server"] for r in rows))
    streams = sorted({r["streams"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(servers)
    for i, s in enumerate(servers):
        ys = [next((r["tok_s"] for r in rows if r["server"] == s and r["streams"] == n), 0) for n in streams]
        ax.bar([j + i * width for j in range(len(streams))], ys, width, label=s)
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(streams))], [f"{n} streams" for n in streams])
    ax.set_ylabel("output tokens/s")
    ax.set_title("JSON-schema answers (response_format), same GGUF and client")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--prompts", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    from backend.engines.llama_cpp import served_gguf
    gguf = served_gguf(CHECKPOINT)
    servers = [("ours-default", lambda n, f: our_server(n, {}, f)),
               ("ours-off", lambda n, f: our_server(n, {"SPECSERVE_POLICY": "off"}, f))]
    if not args.skip_peer:
        from build_engines.on_demand import llama_server
        binary = llama_server()
        servers.append(("llama-server", lambda n, f: peer_server(binary, gguf, n, [], f)))
    specs = workload(args.prompts)
    log(f"structured-output benchmark: {', '.join(s for s, _ in servers)} on {gguf.name}; streams {args.streams}; "
        f"{args.seconds:.0f} s a level; {args.max_tokens} tokens, greedy, response_format json_schema")
    rows, texts = [], {}
    for streams in args.streams:
        for name, start in servers:
            with open(RESULTS / "structured_server.log", "a") as f:
                row, answers = run_level(name, lambda: start(streams, f), specs, streams, args)
            rows.append(row)
            texts[(name, streams)] = answers
    summary = []
    for streams in args.streams:
        by = {r["server"]: r for r in rows if r["streams"] == streams}
        same, common, _ = identity(texts[("ours-default", streams)], texts[("ours-off", streams)])
        line = {"streams": streams, "default_vs_off": by["ours-default"]["tok_s"] / by["ours-off"]["tok_s"],
                "same_text_default_off": [same, common]}
        if "llama-server" in by:
            line["default_vs_llama_server"] = by["ours-default"]["tok_s"] / by["llama-server"]["tok_s"]
        summary.append(line)
        log(f"  {streams:3d} streams: default / off ×{line['default_vs_off']:.2f}"
            + (f", default / llama-server ×{line['default_vs_llama_server']:.2f}" if "llama-server" in by else "")
            + f"; same text default and off: {same}/{common}")
    stem = "structured" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": vars(args), "gguf": gguf.name, "cores": os.cpu_count(),
                                                      "rows": rows, "ratios": summary}, indent=1, default=str))
    plot(rows, RESULTS / f"{stem}.png")
    log(f"wrote {RESULTS / stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
