"""Our server against llama.cpp's own server, llama-server, on the same GGUF, prompts and client:
ours as served (the default policy) and with speculation off, llama-server with its defaults and
with its static n-gram speculation (`--arms`; ratios are ours / each other arm).

A person serving a small model on a CPU compares us with llama-server (issue 30): built from the
very llama.cpp our engine runs (the pinned llama-cpp-python sdist's vendored sources; built the
first time, ~10-15 min on 2 cores: `python -m build_engines.on_demand llama-server`), started
with `-np N -c N*2048` (2048 tokens a sequence, as ours) `-t <cores> -fa on`, its defaults
otherwise (prompt cache on). Both are driven by one client (bench/peer_load.py: OpenAI chat
completions, streaming, temperature 0, --max-tokens), closed loop, on three workloads
(bench/peer_workloads.py: distinct chat prompts, multi-turn chat resending the history,
copy-heavy), at each of --streams for --ramp-s + --seconds.

Every (workload, streams) starts a fresh server per arm, one at a time: no
level inherits another's caches (our suffix drafter's store of recent outputs, llama-server's
prompt cache) and each ratio compares two runs minutes apart (these machines drift by 10-20%
over minutes, more from day to day: compare only inside one run). `--rounds N` runs each level N
times, the arms' order reversed every other round (A B, B A, ...), and pairs the arms within a
round: the ratio is the rounds' geometric mean, each round's printed beside it. Per level: output tokens/s
over the measured window, TTFT and TPOT p50/p90, requests done/failed; then ours / llama-server
per level, and per server the share of prompts whose greedy text is the same at the fewest and
the most streams (ours is batch-invariant; llama-server's is not).

    .venv/bin/python bench/bench_peer.py                          # 1/8/32 streams, 45 s each, all workloads
    .venv/bin/python bench/bench_peer.py --streams 1 4 --seconds 20 --workloads chat multiturn --prompts 40

Writes bench/results/peer.json (figures), peer_requests.json (every request: times, tokens, text,
error) and peer.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from backend.engines.llama_cpp_cpu import LLAMA_SERVER_ARGS
from peer_load import closed_loop, warm_up  # bench/ (the script's own folder)
from peer_stats import identity, levels, ratios, summarise
from peer_workloads import WORKLOADS, Feed, sessions

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CONTEXT = 2048  # tokens a sequence: our max_context (model_repository/llm/config.pbtxt), per llama-server slot
OURS, PEER = "ours", "llama-server"
# Every arm a run can measure: ours as served (the default policy) and with speculation off; llama-server
# with its defaults and with its static n-gram speculation. Ratios are ours / each other arm.
ARMS = {
    OURS: {},
    "ours-off": {"SPECSERVE_POLICY": "configs/policies/off.yaml"},
    PEER: [],
    "llama-server-ngram": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "4"],
}


def log(msg: str) -> None:
    print(msg, flush=True)


@contextmanager
def our_server(streams: int, env: dict, log_file, stats: dict | None = None):
    """The project's server (launcher: edge + Triton), as served by default unless `env` says;
    `stats` gets what its speculation did over the level (`policy_stats`), read before it stops."""
    from backend.frontend.supervisor.launch import start_server
    proc, ports = start_server(env={"SPECSERVE_MAX_BATCH": str(max(32, streams)), **env}, log_file=log_file)
    try:
        yield f"http://127.0.0.1:{ports.http}"
        if stats is not None:
            stats.update(policy_stats(f"http://127.0.0.1:{ports.metrics}/metrics"))
    finally:
        _stop(proc, 40)


def policy_stats(url: str) -> dict:
    """The engine loop's counters from our Prometheus endpoint (backend/frontend/metrics.py) over the
    server's life, warm-up included: why a level's speculation paid or not. Empty if unreadable."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    def total(name, labels=""):  # a family's samples summed, those whose labels contain `labels`
        pattern = "^" + re.escape(name) + r"(?:\{([^}]*)\})? (\S+)$"
        return sum(float(v) for lab, v in re.findall(pattern, text, re.M) if labels in lab)
    steps, seq_steps = total("specserve_steps_total"), total("specserve_step_sequences_total")
    drafted, accepted = total("specserve_tokens_drafted_total"), total("specserve_tokens_accepted_total")
    plain = total("specserve_gamma_played_total", 'gamma="0"')
    step_s = total("specserve_phase_seconds_total", 'phase="step"')
    return {"steps": steps, "mean_batch": seq_steps / steps if steps else math.nan,
            "step_ms": 1e3 * step_s / steps if steps else math.nan,
            "drafting_share": 1 - plain / seq_steps if seq_steps else math.nan,
            "drafted_per_seq_step": drafted / seq_steps if seq_steps else math.nan,
            "acceptance": accepted / drafted if drafted else math.nan,
            "emitted_per_seq_step": total("specserve_tokens_emitted_total") / seq_steps if seq_steps else math.nan}


def peer_command(binary: Path, gguf: Path, port: int, slots: int, threads: int, extra=()) -> list:
    """llama-server's command line: the flags of ../shared/design/ENVIRONMENT.md, one slot per
    stream (at least 32), CONTEXT tokens each, OpenAI API only, and what every llama.cpp we run
    is asked for (backend/engines/llama_cpp_cpu.py: no repack, no AMX)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(slots * CONTEXT), "-t", str(threads), "-fa", "on", "--no-webui", *LLAMA_SERVER_ARGS, *extra]


@contextmanager
def peer_server(binary: Path, gguf: Path, streams: int, extra, log_file, ready_timeout_s: float = 120):
    """llama-server on a free loopback port, ready (model loaded) when this yields its URL."""
    from backend.frontend.supervisor.launch import free_port, wait_http_ok
    port = free_port()
    cmd = peer_command(binary, gguf, port, max(32, streams), os.cpu_count() or 1, extra)
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        # llama-server answers /health 503 while it loads the model, 200 once it serves
        wait_http_ok(f"http://127.0.0.1:{port}/health", proc, ready_timeout_s, "llama-server")
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc, 20)


def _stop(proc: subprocess.Popen, wait_s: float) -> None:
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ramp(streams: int) -> float:
    """Seconds of load before the measured window: every stream's first request admitted (as
    bench_speculation.py's Part B waits)."""
    return min(30.0, 2.0 + 0.5 * streams)


def serve_level(server: str, start, specs, streams: int, ramp_s: float, seconds: float, max_tokens: int,
                extra=None) -> tuple:
    """One fresh server, one warm-up request, one closed-loop level: (its requests, the measured
    window w0, w1, seconds the server took to start, the feed). `extra`: peer_load's per-request
    body fields."""
    t = time.perf_counter()
    with start() as url:
        started = time.perf_counter() - t
        w = warm_up(url)
        if not w.ok:
            raise RuntimeError(f"{server}: warm-up request failed: {w.error}")
        feed = Feed(specs)
        requests, w0, w1 = closed_loop(url, feed, streams, ramp_s, seconds, max_tokens, extra)
    return requests, w0, w1, started, feed


def run_level(server: str, start, workload: str, specs, streams: int, args) -> tuple:
    """serve_level, summarised: (row, its requests as dicts, times from the window's start)."""
    ramp_s = args.ramp_s if args.ramp_s is not None else ramp(streams)
    stats = {}
    requests, w0, w1, started, feed = serve_level(server, lambda: start(stats), specs, streams, ramp_s, args.seconds,
                                                  args.max_tokens)
    row = {"server": server, "workload": workload, "streams": streams, "start_s": started,
           "sessions": feed.i, "repeats": feed.repeats, **summarise(requests, w0, w1)}
    if stats:
        row["policy"] = stats
    log(f"  {server:12s} {workload:9s} {streams:3d} streams: {row['tok_s']:7.1f} tok/s  TTFT p50 "
        f"{row['ttft_p50_s']:6.2f} p90 {row['ttft_p90_s']:6.2f} s  TPOT p50 {row['tpot_p50_ms']:6.1f} p90 "
        f"{row['tpot_p90_ms']:6.1f} ms  done {row['done']:4d} failed {row['failed']}"
        + (f"  ({row['repeats']} sessions repeated: raise --prompts)" if row["repeats"] else "")
        + (f"  errors: {row['errors']}" if row["errors"] else ""))
    if "steps" in stats:
        log(f"  {'':12s} {'':9s} {'':3s}          speculation: batch {stats['mean_batch']:.1f}, step "
            f"{stats['step_ms']:.1f} ms, {100 * stats['drafting_share']:.0f}% of sequence-steps drafted, "
            f"{stats['drafted_per_seq_step']:.2f} drafts and {stats['emitted_per_seq_step']:.2f} tokens a "
            f"sequence-step, acceptance {stats['acceptance']:.2f}")
    return row, [r.as_dict(w0) for r in requests]


def identities(answers: dict, streams: list) -> list:
    """Per (server, workload): greedy text at the fewest vs the most streams."""
    lo, hi = min(streams), max(streams)
    out = []
    for server, workload in dict.fromkeys((s, w) for s, w, _ in answers):
        if (server, workload, lo) in answers and (server, workload, hi) in answers and lo != hi:
            same, common, differ = identity(answers[(server, workload, lo)], answers[(server, workload, hi)])
            out.append({"server": server, "workload": workload, "streams": [lo, hi], "identical": same,
                        "common": common, "share": same / common if common else math.nan, "differ": differ[:20]})
    return out


def plot(rows: list, ident: list, path: Path) -> None:
    """Throughput and TTFT p50 against streams, per workload (several rounds: their mean)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r["server"] for r in rows))
    ref = PEER if PEER in servers else next((x for x in servers if x != OURS), PEER)  # what the × compare with
    rat = {(x["workload"], x["streams"]): x for x in ratios(rows, OURS, ref)}
    rows = levels(rows)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.2 * len(workloads), 8), squeeze=False)
    for j, workload in enumerate(workloads):
        top, bottom = axes[0][j], axes[1][j]
        for server in dict.fromkeys(r["server"] for r in rows):
            pts = sorted((r["streams"], r["tok_s"], r["ttft_p50_s"]) for r in rows
                         if r["server"] == server and r["workload"] == workload)
            ttft = [(n, t) for n, _, t in pts if not math.isnan(t)]  # NaN: no request started in the window
            same = next((i for i in ident if i["server"] == server and i["workload"] == workload), None)
            label = server + (f" (greedy text same at {same['streams'][0]} and {same['streams'][1]} streams: "
                              f"{same['identical']}/{same['common']})" if same else "")
            top.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            bottom.plot([n for n, _ in ttft], [t for _, t in ttft], marker="o", label=server)
        for (w, s), x in rat.items():
            if w == workload and not math.isnan(x["tok_s"]):
                y = next(r["tok_s"] for r in rows if (r["server"], r["workload"], r["streams"]) == (OURS, w, s))
                top.annotate(f"×{x['tok_s']:.2f}", (s, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
        loads = sorted({r["streams"] for r in rows})
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(loads, [str(n) for n in loads])
            ax.minorticks_off()
            ax.set_xlim(loads[0] / 1.5, loads[-1] * 1.5)
            ax.set_xlabel("closed-loop streams")
        top.set_title(f"{workload}: output tokens/s (× = ours / {ref})")
        top.set_ylabel("output tokens/s")
        top.legend(fontsize=7)
        if any(r["ttft_p50_s"] > 0 for r in rows if r["workload"] == workload):  # NaN > 0 is False
            bottom.set_yscale("log")
        bottom.set_ylabel("TTFT p50 (s)")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=45.0, help="measured seconds per level")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of each level: the arms in turn, the order reversed every other round "
                         "(A B, B A, ...), each with a fresh server; ratios pair within a round")
    ap.add_argument("--ramp-s", type=float, default=None, help="load before the window (default 2 + streams/2, ≤ 30)")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--prompts", type=int, default=1000,
                    help="distinct sessions per workload, at most (the held-out split has ~340-430)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                    help="ours: the default policy; ours-off: plain decoding; llama-server: its defaults; "
                         "llama-server-ngram: its static n-gram speculation (4 draft tokens)")
    ap.add_argument("--ours-env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="SPECSERVE_* settings for our server (e.g. SPECSERVE_POLICY=off)")
    ap.add_argument("--peer-kv-q8", action="store_true", help="llama-server with a Q8_0 KV cache (ours serves one)")
    ap.add_argument("--peer-args", default="", help="more llama-server flags, e.g. '--no-cache-prompt'")
    ap.add_argument("--tag", default="", help="suffix of the result files' names")
    ap.add_argument("--plot-only", type=Path, metavar="JSON", help="only redraw the plot of a saved run (its .png beside it)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        saved = json.loads(args.plot_only.read_text())
        plot(saved["rows"], saved["identity"], args.plot_only.with_suffix(".png"))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    from backend.engines.llama_cpp import served_gguf
    gguf = served_gguf(CHECKPOINT)
    servers = []
    env = dict(kv.split("=", 1) for kv in args.ours_env)
    binary = None
    for arm in args.arms:
        if arm.startswith(OURS):
            servers.append((arm, lambda streams, f, stats, e={**ARMS[arm], **env}: our_server(streams, e, f, stats),
                            f"peer_{arm}_server.log"))
            continue
        if binary is None:
            from build_engines.on_demand import llama_server
            binary = llama_server()  # built the first time (with progress), then cached
        extra = ARMS[arm] + shlex.split(args.peer_args) + (["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
                                                          if args.peer_kv_q8 else [])
        servers.append((arm, lambda streams, f, stats, x=extra: peer_server(binary, gguf, streams, x, f),
                        f"peer_{arm}.log"))
    log(f"peer benchmark: {', '.join(s[0] for s in servers)} on {gguf.name}; workloads {', '.join(args.workloads)}; "
        f"streams {args.streams}; {args.seconds:.0f} s measured per level; {args.max_tokens} tokens, greedy")
    rows, answers, records = [], {}, []
    for workload in args.workloads:
        specs = sessions(workload, args.prompts)
        log(f"{workload}: {len(specs)} sessions prepared")
        for streams in args.streams:
            for rnd in range(args.rounds):
                if args.rounds > 1:
                    log(f"{workload}, {streams} streams: round {rnd + 1} of {args.rounds}")
                # a level's arms minutes apart see the host at different speeds; alternating the order
                # puts a steady drift on both arms alike
                for server, start, log_name in (servers if rnd % 2 == 0 else servers[::-1]):
                    with open(RESULTS / log_name, "a") as f:
                        row, requests = run_level(server, lambda stats: start(streams, f, stats), workload, specs,
                                                  streams, args)
                    rows.append(dict(row, round=rnd))
                    answers.setdefault((server, workload, streams), {}).update(
                        {r["key"]: r["text"] for r in requests if not r["error"]})
                    records.append({"server": server, "workload": workload, "streams": streams, "round": rnd,
                                    "requests": requests})
    rat = [{"vs": arm, **x} for arm in args.arms if arm != OURS for x in ratios(rows, OURS, arm)]
    ident = identities(answers, args.streams)
    for x in rat:
        log(f"  ours / {x['vs']:18s} {x['workload']:9s} {x['streams']:3d} streams: tokens/s ×{x['tok_s']:.2f}, "
            f"TTFT p50 ×{x['ttft_p50']:.2f}"
            + (f"  (rounds: {', '.join(f'×{r:.2f}' for r in x['rounds'])})" if len(x["rounds"]) > 1 else ""))
    for x in ident:
        log(f"  {x['server']:12s} {x['workload']:9s} greedy text the same at {x['streams'][0]} and "
            f"{x['streams'][1]} streams: {x['identical']}/{x['common']}")
    stem = "peer" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"args": vars(args), "gguf": gguf.name, "cores": os.cpu_count(), "rows": rows, "ratios": rat,
         "identity": ident}, indent=1, default=str))
    (RESULTS / f"{stem}_requests.json").write_text(json.dumps(records, indent=1))
    plot(rows, ident, RESULTS / f"{stem}.png")
    log(f"wrote {RESULTS / stem}.json, {stem}_requests.json and {stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
