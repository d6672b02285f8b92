"""Soak test: many gRPC streams against the server for a long time; nothing may fail, every KV
block must come back, and the model's memory must not grow.

    .venv/bin/python bench/soak.py                         # 64 streams, 10 minutes, its own server
    .venv/bin/python bench/soak.py --streams 16 --duration 60 --png /tmp/soak.png
    .venv/bin/python bench/soak.py --grpc 127.0.0.1:8001 --metrics 127.0.0.1:8002   # a running server

Each stream sends one streaming request after another (prompts rotate; max_tokens 32..96). Every
`--sample-every` seconds it records requests, failures, tokens/s and the RSS of the `llm` model's
Python-backend stub (the engine's process). At the end it waits for the server to go idle and reads
specserve_kv_blocks{state="free"} and {state="total"}. Prints the figures, writes them as JSON
(`--json`) and plots RSS and throughput over time to a PNG (`--png`). tests/integration/test_soak.py
runs it for 60 s.
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

from backend.frontend.prometheus_text import scrape, specserve_series

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a short story about a lighthouse keeper.", "1, 2, 3, 4, 5, 6, 7, 8,",
           "Explain how a bicycle works.", "The capital of France is", "List ten fruits:",
           "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
           "def fibonacci(n):", "Translate to French: good morning, how are you?"]
SERVER_ENV = {"SPECSERVE_MAX_CONTEXT": "512", "SPECSERVE_MAX_TOKENS_LIMIT": "256", "SPECSERVE_MAX_QUEUE": "0"}


def _inputs(prompt: str, max_tokens: int):
    import tritonclient.grpc as grpcclient
    out = []
    for name, value, dt, np_t in (("text_input", prompt.encode(), "BYTES", object), ("max_tokens", max_tokens, "INT32", np.int32),
                                  ("stream", True, "BOOL", bool)):
        t = grpcclient.InferInput(name, [1, 1], dt)
        t.set_data_from_numpy(np.array([[value]], dtype=np_t))
        out.append(t)
    return out


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.failures = self.tokens = 0
        self.errors: list = []

    def add(self, tokens: int = 0, error: str | None = None) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens
            if error is not None:
                self.failures += 1
                if len(self.errors) < 10:
                    self.errors.append(error)


def stream_worker(url: str, index: int, until: float, totals: Totals, timeout: float = 120.0) -> None:
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url)
    q: "queue.Queue" = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    n = index
    try:
        while time.monotonic() < until:
            n += 1
            client.async_stream_infer("llm", _inputs(PROMPTS[n % len(PROMPTS)], 32 + 16 * (n % 5)),
                                      enable_empty_final_response=True)
            tokens, error = 0, None
            while True:
                try:
                    result, err = q.get(timeout=timeout)
                except queue.Empty:
                    error = f"no response for {timeout:.0f} s"
                    break
                if err is not None:
                    error = str(err)
                    break
                out = result.as_numpy("num_output_tokens")
                if out is not None:
                    tokens = int(out.reshape(-1)[0])
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            totals.add(tokens, error)
            if error is not None and "no response" in error:
                break
    finally:
        client.stop_stream()
        client.close()


def metrics(address: str) -> dict:
    """{'name{state="x"}': value} of the specserve_* series (model / version labels dropped)."""
    return specserve_series(scrape(address))


def model_stub_pid(grpc_port: int) -> int | None:
    """The `llm` stub of the tritonserver listening on this gRPC port."""
    from backend.frontend.supervisor.processes import proc_argv
    from backend.frontend.supervisor.stubs import stub_processes
    for pid, argv in stub_processes():
        if "/llm/1/" in argv[1] and f"--grpc-port={grpc_port}" in proc_argv(int(argv[5])):
            return pid
    return None


def rss_mib(pid: int | None) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, TypeError):
        pass
    return float("nan")


def soak(grpc: str, metrics_address: str, streams: int, duration: float, sample_every: float = 5.0,
         log=print) -> dict:
    totals, t0 = Totals(), time.monotonic()
    until = t0 + duration
    stub = model_stub_pid(int(grpc.rsplit(":", 1)[1]))
    workers = [threading.Thread(target=stream_worker, args=(grpc, i, until, totals), daemon=True) for i in range(streams)]
    for w in workers:
        w.start()
    samples, last_tokens, last_t = [], 0, t0
    while any(w.is_alive() for w in workers):
        time.sleep(min(sample_every, max(0.1, until + 1 - time.monotonic())) if time.monotonic() < until else 0.5)
        now = time.monotonic()
        if now - last_t >= sample_every or not any(w.is_alive() for w in workers):
            with totals.lock:
                req, fail, tok = totals.requests, totals.failures, totals.tokens
            row = {"t": round(now - t0, 1), "requests": req, "failures": fail,
                   "tokens_per_s": round((tok - last_tokens) / max(1e-9, now - last_t), 1), "rss_mib": round(rss_mib(stub), 1)}
            samples.append(row)
            log(f"t={row['t']:6.1f}s requests {req:6d} failures {fail:3d} tokens/s {row['tokens_per_s']:7.1f} "
                f"stub RSS {row['rss_mib']:7.1f} MiB")
            last_tokens, last_t = tok, now
    elapsed = time.monotonic() - t0
    kv_free = kv_total = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the last requests' blocks come back when the loop retires them
        m = metrics(metrics_address)
        kv_free, kv_total = m.get('specserve_kv_blocks{state="free"}'), m.get('specserve_kv_blocks{state="total"}')
        if kv_free is not None:  # blocks kept for reuse (retained cells) count as back: given up on demand
            kv_free += m.get('specserve_kv_blocks{state="retained"}', 0)
        if kv_free is not None and kv_free == kv_total:
            break
        time.sleep(0.5)
    # warm-up: the stub grows ~60 MiB while the first long prompts arrive (10-25 s into a 16-stream run)
    warm = [s["rss_mib"] for s in samples if s["t"] >= min(60.0, duration * 0.4)]
    result = {"streams": streams, "duration_s": round(elapsed, 1), "requests": totals.requests,
              "failures": totals.failures, "errors": totals.errors, "tokens": totals.tokens,
              "tokens_per_s": round(totals.tokens / elapsed, 1), "kv_blocks_free": kv_free, "kv_blocks_total": kv_total,
              "rss_start_mib": samples[0]["rss_mib"] if samples else None,
              "rss_after_warmup_mib": warm[0] if warm else None, "rss_end_mib": samples[-1]["rss_mib"] if samples else None,
              "rss_growth_after_warmup_mib": round(warm[-1] - warm[0], 1) if warm else None, "samples": samples}
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] for s in result["samples"]]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(t, [s["rss_mib"] for s in result["samples"]], marker=".")
    a.set_ylabel("llm stub RSS (MiB)")
    a.set_title(f"soak: {result['streams']} gRPC streams, {result['requests']} requests, {result['failures']} failures")
    b.plot(t, [s["tokens_per_s"] for s in result["samples"]], marker=".", color="tab:green")
    b.set_ylabel("tokens/s")
    b.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds")
    ap.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--grpc", help="a running server's gRPC address (default: start one)")
    ap.add_argument("--metrics", help="its metrics address (with --grpc)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--png", type=Path, help="plot RSS and throughput over time here")
    args = ap.parse_args(argv)
    proc = None
    if args.grpc:
        grpc, metrics_address = args.grpc, args.metrics or args.grpc.rsplit(":", 1)[0] + ":8002"
    else:
        from backend.frontend.supervisor.launch import start_server
        env = dict(SERVER_ENV, SPECSERVE_MAX_BATCH=str(min(32, args.streams)))
        print(f"starting a server ({env}) ...", flush=True)
        proc, ports = start_server(env=env)
        grpc, metrics_address = f"127.0.0.1:{ports.grpc}", f"127.0.0.1:{ports.metrics}"
    try:
        result = soak(grpc, metrics_address, args.streams, args.duration, args.sample_every,
                      log=lambda s: print(s, flush=True))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.png:
        plot(result, args.png)
        print(f"plot: {args.png}")
    ok = result["failures"] == 0 and result["kv_blocks_free"] == result["kv_blocks_total"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
