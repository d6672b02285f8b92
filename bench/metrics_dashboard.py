"""Render the Grafana dashboard's panels against a live server, without Grafana.

Grafana cannot be installed here (no Debian or PyPI package ships its server), so this starts
the real server, a real Prometheus scraping its metrics port every second, drives a short mixed
load (streaming and not, copy-heavy and free-form prompts, a few refused requests), then runs
every query of deploy/grafana/specserve-dashboard.json through Prometheus' query_range API and
draws each panel with matplotlib, in the dashboard's order and titles. The PromQL is the
dashboard's own, so this also checks that every query parses and returns data.

    apt-get install prometheus   # once (Debian's package; the script needs only its binary)
    .venv/bin/python bench/metrics_dashboard.py [--seconds 90] [--concurrency 4]

Writes docs/results/metrics_dashboard.png (and .json: the queried series).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from prompts import COPY_HEAVY, FREE_FORM, PROSE_PROMPTS  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from server_helpers import running_server  # noqa: E402

DASHBOARD = ROOT / "deploy" / "grafana" / "specserve-dashboard.json"
OUT = ROOT / "docs" / "results" / "metrics_dashboard.png"
RATE_INTERVAL = "30s"  # $__rate_interval: long enough that one multi-second step does not spike a rate


def start_prometheus(target: str, workdir: Path):
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus not found: apt-get install prometheus")
    from backend.frontend.supervisor.launch import free_port
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"scrape_configs:\n  - job_name: specserve\n    static_configs:\n"
                      f"      - targets: ['{target}']\n")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=open(workdir / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(60):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("prometheus did not become ready")


def drive_load(server, seconds: float, concurrency: int) -> None:
    """Closed-loop clients for `seconds`, and a refused request (max_tokens 0) every 3 s."""
    prompts = list(COPY_HEAVY.values()) + list(FREE_FORM.values()) + list(PROSE_PROMPTS.values())
    stop = time.time() + seconds

    def client(i: int) -> None:
        rng = random.Random(i)
        n = 0
        while time.time() < stop:
            n += 1
            payload = {"text_input": rng.choice(prompts) + f" ({i}.{n})", "max_tokens": rng.choice([24, 48]),
                       "apply_chat_template": True, "temperature": rng.choice([0.0, 0.0, 0.7]), "random_seed": n}
            server.generate(dict(payload, stream=rng.random() < 0.5), stream=False)

    def refused() -> None:
        while time.time() < stop:
            server.generate({"text_input": "Hello", "max_tokens": 0})
            time.sleep(3)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    threads.append(threading.Thread(target=refused))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def query_range(port: int, expr: str, start: float, end: float) -> list:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace('model=~"$model"', 'model=~"llm"')
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 2})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query_range?{qs}", timeout=30) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    for k, v in labels.items():
        fmt = fmt.replace("{{" + k + "}}", v)
    return fmt


def plot(dashboard: dict, data: list, start: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = dashboard["panels"]
    rows = (len(panels) + 2) // 3
    fig, axes = plt.subplots(rows, 3, figsize=(18, 4.2 * rows), constrained_layout=True)
    for ax, panel, series in zip(axes.flat, panels, data):
        for label, points in series:
            ax.plot([t - start for t, _ in points], [v for _, v in points], label=label, linewidth=1.6)
        ax.set_title(panel["title"], fontsize=11, loc="left")
        ax.grid(alpha=0.3)
        ax.set_xlabel("seconds", fontsize=8)
        if panel["fieldConfig"]["defaults"]["unit"] == "percentunit":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        if series:
            ax.legend(fontsize=7, loc="upper left", ncol=2)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} — the Grafana dashboard's queries through a live Prometheus, "
                 f"drawn with matplotlib (not a Grafana screenshot)", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    dashboard = json.loads(DASHBOARD.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with running_server({"SPECSERVE_MAX_BATCH": "8"}, tmp) as server:
            prom, port = start_prometheus(f"127.0.0.1:{server.ports.metrics}", tmp)
            try:
                time.sleep(5)  # an idle stretch before the load
                start = time.time()
                print(f"load: {args.concurrency} clients for {args.seconds:.0f} s", flush=True)
                drive_load(server, args.seconds, args.concurrency)
                time.sleep(20)  # the load ends inside the window
                end = time.time()
                data = []
                for panel in dashboard["panels"]:
                    series = []
                    for target in panel["targets"]:
                        for res in query_range(port, target["expr"], start - 5, end):
                            points = [(float(t), float(v)) for t, v in res["values"] if v not in ("NaN", "+Inf", "-Inf")]
                            if points:
                                series.append((legend(target["legendFormat"], res["metric"]), points))
                    data.append(series)
            finally:
                prom.terminate()
                prom.wait(20)
    plot(dashboard, data, start, OUT)
    OUT.with_suffix(".json").write_text(json.dumps(
        {"seconds": args.seconds, "concurrency": args.concurrency, "rate_interval": RATE_INTERVAL,
         "panels": [{"title": p["title"], "series": {label: pts for label, pts in s}}
                    for p, s in zip(dashboard["panels"], data)]}) + "\n")
    empty = [p["title"] for p, s in zip(dashboard["panels"], data) if not s]
    print(f"wrote {OUT}" + (f"; panels without data: {empty}" if empty else ""))


if __name__ == "__main__":
    main()
