"""Plain vs static n-gram γ=4 vs the default policy at 1, 8 and 32 closed-loop streams, through a
server somebody else started: the GPU container's (scripts/gpu_check.sh starts one per arm and
level), or ours on a CPU for a quick check.

It is bench_speculation.py's Part B with the server started outside: the client, the measurement,
the per-level line and the table are Part B's own, imported from there (gRPC streaming, a warm-up
request, distinct requests, `streams` closed-loop clients, aggregate output tokens/s from the
server's token counter over a window after the ramp-up). The policy is fixed when a server starts,
so each arm is measured against a server started with that arm's settings (`env`), a fresh one per
(arm, streams) as Part B does; `report` then puts the arms together: the levels' lines, the table
(× = ratio to plain decoding at the same streams), JSON and a plot.

    python3 bench/bench_gpu_policies.py env --arm static             # the arm's server settings, KEY=VALUE
    python3 bench/bench_gpu_policies.py prompts                      # the requests ready (ShareGPT, fetched once)
    python3 bench/bench_gpu_policies.py measure --arm plain --streams 1 8 32 --seconds 60 \\
        [--host 127.0.0.1 --grpc-port 8001 --metrics-port 8002] [--out bench/results/gpu_policies.json]
    python3 bench/bench_gpu_policies.py report [--out bench/results/gpu_policies.json]   # table, .json, .png

Arms: plain (policy `off`), static (n-gram drafter, γ = 4: configs/policies/static.yaml) and
composite, the policy the GPU image serves by default (SPECSERVE_POLICY=composite with no
policy file: its built-in cost tables, docker/Dockerfile.trtllm). Requests are distinct ShareGPT
prompts as in Part B, from all of ShareGPT rather than its held-out 5% (~6,700 instead of ~330:
no model drafter is served here, and a GPU level finishes thousands); past the last one they
start over and the level says how many were repeated (a repeated greedy request flatters the
suffix drafter). `measure` adds each level to --out (replacing that arm and streams' earlier
row), so arms measured by separate calls, on separate servers, share one table.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import types
from pathlib import Path

from bench_speculation import (_metrics, _steady_run, _stream_client, add_ratios, arm_label,  # bench/ (its own folder)
                               log, log_server_row, plot_server, server_table)
from prompts import distinct_requests

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "gpu_policies.json"
# arm -> (policy, parameters) as bench_speculation.py names them, and the server settings that serve it
ARMS = {"plain": ("off", {}), "static": ("static", {"gamma": 4}), "composite": ("composite", {})}
STATIC_CONFIG = "configs/policies/static.yaml"  # policy: static, drafter ngram, gamma 4 (checked by a test)
ALL_OF_SHAREGPT = 1.0  # distinct_requests' share: no model drafter served, so the held-out split is not needed


def arm_env(arm: str) -> dict:
    """The SPECSERVE_* settings a server needs to serve `arm` (scripts/gpu_check.sh passes the same).
    SPECSERVE_POLICY, the one policy key, takes a name or a policy file, over config.pbtxt's."""
    return {"plain": {"SPECSERVE_POLICY": "off"}, "static": {"SPECSERVE_POLICY": STATIC_CONFIG},
            "composite": {"SPECSERVE_POLICY": "composite"}}[arm]


class Feed:
    """The level's requests in a fixed order (the same for every arm and level), started over after
    the last one; `repeats` counts the requests sent again. An iterator, as _steady_run takes it."""

    def __init__(self, prompts: list):
        if not prompts:
            raise ValueError("no requests")
        self.prompts, self.i, self.repeats = prompts, 0, 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.i >= len(self.prompts):
            self.repeats += 1
        prompt = self.prompts[self.i % len(self.prompts)]
        self.i += 1
        return prompt


def counter_deltas(before: dict, after: dict) -> dict:
    """What the server did over a level, from its specserve_* counters: draft tokens verified and
    accepted, and the policy's decisions per sequence-step by arm ("ngram/4", "none/0", ...)."""
    def delta(key):
        return after.get(key, 0.0) - before.get(key, 0.0)

    from backend.frontend.prometheus_text import LABEL
    decisions = {}
    for key in after:
        if key.startswith("specserve_decisions_total{") and delta(key):
            labels = dict(LABEL.findall(key))
            decisions[f"{labels['drafter']}/{labels['gamma']}"] = int(delta(key))
    drafted, accepted = delta("specserve_tokens_drafted_total"), delta("specserve_tokens_accepted_total")
    return {"drafted": int(drafted), "accepted": int(accepted),
            "acceptance": accepted / drafted if drafted else math.nan, "decisions": decisions}


def check_arm(arm: str, row: dict) -> list:
    """Warnings where the server's counters say it is not serving `arm` (a setting that did not
    reach it), or did not count what was served (its metrics are what throughput is read from)."""
    out = []
    speculative = {k: n for k, n in row["decisions"].items() if not k.startswith("none/")}
    if arm == "plain" and (row["drafted"] or speculative):
        out.append(f"plain: the server drafted ({row['drafted']} draft tokens, decisions {speculative}); "
                   f"it does not serve SPECSERVE_POLICY=off")
    if arm == "static":
        want = f"ngram/{ARMS['static'][1]['gamma']}"
        if set(speculative) != {want}:
            out.append(f"static: decisions {row['decisions']}, expected {want} on every sequence-step; "
                       f"the server does not serve {STATIC_CONFIG}")
    if row["requests"] and not row["tok_s"] > 0:
        out.append(f"{arm}, {row['concurrency']} streams: {row['requests']} requests finished but the server's "
                   f"token counter (specserve_tokens_emitted_total) did not move: its metrics are not published")
    if row.get("repeats"):
        out.append(f"{arm}, {row['concurrency']} streams: {row['repeats']} requests were sent again "
                   f"(more than --prompts distinct ones); repeated greedy requests flatter the suffix drafter")
    return out


def load(path: Path) -> list:
    return json.loads(path.read_text())["rows"] if path.exists() else []


def save(path: Path, rows: list, **extra) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps({"rows": rows, **extra}, indent=1, default=str))
    tmp.replace(path)


def device_name() -> str:
    """The GPU(s) as nvidia-smi names them, or "" (a CPU run, or no nvidia-smi here)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return ", ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) if out.returncode == 0 else ""


def measure(args) -> int:
    policy, params = ARMS[args.arm]
    label = arm_label(policy, params)
    prompts = distinct_requests(args.prompts, share=ALL_OF_SHAREGPT)
    grpc = f"{args.host}:{args.grpc_port}"
    ports = types.SimpleNamespace(grpc=args.grpc_port, metrics=args.metrics_port)
    device = args.device if args.device is not None else device_name()
    log(f"{label}: {grpc} (metrics :{args.metrics_port}), streams {args.streams}, {args.seconds:.0f} s measured "
        f"per level, {args.max_tokens} new tokens a request, {len(prompts)} distinct requests"
        + (f", {device}" if device else ""))
    for streams in args.streams:
        _stream_client(grpc, lambda: "Hello", 8, [], threading.Event(), limit=1)  # warm-up, as Part B
        feed = Feed(prompts)
        before = _metrics(args.metrics_port, args.host)
        row = _steady_run(ports, feed, streams, args.max_tokens, args.seconds, args.host)
        row.update(counter_deltas(before, _metrics(args.metrics_port, args.host)),
                   arm=label, round=0, repeats=feed.repeats, max_tokens=args.max_tokens, device=device)
        row["warnings"] = check_arm(args.arm, row)
        log_server_row(row)
        for w in row["warnings"]:
            log(f"  WARNING: {w}")
        rows = [r for r in load(args.out) if (r["arm"], r["concurrency"]) != (label, streams)]
        save(args.out, rows + [row])
    log(f"added to {args.out}")
    return 0


def report(args) -> int:
    rows = load(args.out)
    if not rows:
        log(f"nothing measured in {args.out}")
        return 1
    order = [arm_label(*a) for a in ARMS.values()]
    rows.sort(key=lambda r: (order.index(r["arm"]) if r["arm"] in order else len(order), r["concurrency"]))
    add_ratios(rows)
    devices = sorted({r.get("device") or "" for r in rows} - {""})
    log(f"Through the server{f' on {devices[0]}' if len(devices) == 1 else ''}: plain vs static n-gram γ=4 vs "
        f"the default policy, {rows[0].get('max_tokens', '?')} new tokens a request, "
        f"{rows[0]['window_s']:.0f} s measured per level")
    for row in rows:
        log_server_row(row)
    table = server_table(rows)
    log("aggregate output tokens/s (× = ratio to plain decoding at the same streams):\n" + table)
    for r in rows:
        if r["arm"] != "plain":
            log(f"  {r['arm']:10s} {r['concurrency']:3d} streams: acceptance {r['acceptance']:.2f} of "
                f"{r['drafted']} draft tokens, decisions {r['decisions']}")
    warnings = [w for r in rows for w in r.get("warnings", [])]
    for w in warnings:
        log(f"WARNING: {w}")
    save(args.out, rows, table=table, devices=devices)
    png = args.out.with_suffix(".png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"wrote {args.out} (no matplotlib here: no plot)")
        return 0
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    plot_server(ax, rows)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    log(f"wrote {args.out} and {png}")
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print the SPECSERVE_* settings that serve an arm")
    env.add_argument("--arm", choices=list(ARMS), required=True)
    pr = sub.add_parser("prompts", help="make sure the requests are there (downloads ShareGPT's wheel the first time)")
    m = sub.add_parser("measure", help="measure one arm against a running server; add its levels to --out")
    m.add_argument("--arm", choices=list(ARMS), required=True, help="the arm the server was started with")
    m.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    m.add_argument("--seconds", type=float, default=60.0, help="seconds of steady load measured per level")
    m.add_argument("--max-tokens", type=int, default=64, help="new tokens a request (Part B's default)")
    for p in (pr, m):
        p.add_argument("--prompts", type=int, default=6000, help="distinct requests before they start over")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--grpc-port", type=int, default=8001)
    m.add_argument("--metrics-port", type=int, default=8002)
    m.add_argument("--device", default=None, help="what served it, for the record (default: nvidia-smi's GPU names)")
    r = sub.add_parser("report", help="print the table of what --out holds; write its .json and .png")
    for p in (m, r):
        p.add_argument("--out", type=Path, default=OUT, help="the JSON the levels are added to")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "env":
        for key, value in arm_env(args.arm).items():
            print(f"{key}={value}")
        return 0
    if args.command == "prompts":
        log(f"{len(distinct_requests(args.prompts, share=ALL_OF_SHAREGPT))} distinct requests ready")
        return 0
    return measure(args) if args.command == "measure" else report(args)


if __name__ == "__main__":
    sys.exit(main())
