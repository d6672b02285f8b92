"""Speculative decoding benchmark: plain vs static n-gram speculation, measured side by side.

Part A (engine loop in-process, batch 1): tokens/s and ratio to plain greedy for
gamma = 2, 4, 8 on copy-heavy and free-form prompts, and where a step's time goes
(draft, verify forward, acceptance, scheduling) plus prefill.
Part B (through the real Triton server, gRPC streaming clients): aggregate output
tokens/s at 1, 8 and 32 concurrent streams, plain vs speculation, and the share of
client-observed time spent outside the engine loop (Triton + gRPC + adapter).

    .venv/bin/python bench/bench_speculation.py [--max-tokens 128] [--skip-server]

Writes bench/results/speculation.{json,png}.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from prompts import CODE_PROMPTS, COPY_HEAVY, FREE_FORM, PROSE_PROMPTS  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
MODEL_DRAFTERS = "ngram,suffix,code,chat"  # the distilled drafters too (built by the set-up)
ARMS = [("off", {}), ("static", {"gamma": 2}), ("static", {"gamma": 4}), ("static", {"gamma": 8}), ("composite", {})]


def log(msg):
    print(msg, flush=True)


def arm_label(policy, params):
    if policy == "composite":
        return "composite + model drafters" if "drafters" in params else "composite"
    return "plain" if policy == "off" else f"ngram γ={params['gamma']}"


def composite_policy():
    """Our adaptive policy exactly as the server builds it from its example config."""
    from backend.server_config import ServerConfig
    from backend.service import load_policy
    return load_policy(ServerConfig(policy_config="configs/policies/composite.yaml"), ROOT)


# -- Part A ------------------------------------------------------------------------------------
def part_a(max_tokens: int, repeats: int) -> list:
    from transformers import AutoTokenizer

    from backend.engines.torch_llama import TorchLlama
    from backend.offline import make_loop, run_all
    from backend.request import GenerationRequest

    tok = AutoTokenizer.from_pretrained(CHECKPOINT)
    engine = TorchLlama(CHECKPOINT, dtype="bf16", max_slots=1, max_context=2048)
    prompts = [("copy-heavy", n, p) for n, p in COPY_HEAVY.items()] + [("free-form", n, p) for n, p in FREE_FORM.items()]
    rows = []
    for kind, name, prompt in prompts:
        for policy, params in ARMS:
            best = None
            for _ in range(repeats):  # best of N: the machine is shared and noisy
                loop = make_loop(engine, tok, "off" if policy == "composite" else policy, max_batch=1,
                                 **({"drafter": "ngram", **params} if params else {}))
                if policy == "composite":
                    loop.policy = composite_policy()
                req = GenerationRequest(prompt=prompt, max_tokens=max_tokens, apply_chat_template=True,
                                        exclude_input_in_output=True)
                t0 = time.perf_counter()
                sink = run_all(loop, [req])[0]
                wall = time.perf_counter() - t0
                c = sink.chunks[-1]
                st = loop.stats
                row = {"kind": kind, "prompt": name, "arm": arm_label(policy, params), "tokens": c.num_output_tokens,
                       "wall_s": wall, "tok_s": c.num_output_tokens / wall, "steps": st.steps,
                       "tokens_per_step": st.emitted / max(st.steps, 1),
                       "acceptance": st.accepted / max(st.drafted, 1),
                       "ms_per_step": {k: 1000 * getattr(st, f"{k}_time_s") / max(st.steps, 1)
                                       for k in ("draft", "verify", "accept", "step")},
                       "prefill_ms": 1000 * st.prefill_time_s}
                row["ms_per_step"]["sched+io"] = row["ms_per_step"]["step"] - sum(
                    row["ms_per_step"][k] for k in ("draft", "verify", "accept"))
                if best is None or row["tok_s"] > best["tok_s"]:
                    best = row
            rows.append(best)
            plain = next(r for r in rows if r["prompt"] == name and r["arm"] == "plain")
            best["ratio"] = best["tok_s"] / plain["tok_s"]
            ms = best["ms_per_step"]
            log(f"  {kind:10s} {name:9s} {best['arm']:10s} {best['tok_s']:6.1f} tok/s  x{best['ratio']:.2f}  "
                f"{best['tokens_per_step']:.2f} tok/step  accept {best['acceptance']:.2f}  step {ms['step']:.1f} ms "
                f"(draft {ms['draft']:.2f}, verify {ms['verify']:.1f}, accept {ms['accept']:.2f}, "
                f"sched+io {ms['sched+io']:.2f})  prefill {best['prefill_ms']:.0f} ms")
    return rows


# -- Part B ------------------------------------------------------------------------------------
def _stream_client(url, prompts, max_tokens, out):
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    for prompt in prompts:
        ins = []
        for name, value, dt, npt in [("text_input", prompt.encode(), "BYTES", object),
                                     ("max_tokens", max_tokens, "INT32", np.int32), ("stream", True, "BOOL", bool),
                                     ("apply_chat_template", True, "BOOL", bool)]:
            t = grpcclient.InferInput(name, [1, 1], dt)
            t.set_data_from_numpy(np.array([[value]], dtype=npt))
            ins.append(t)
        t0 = time.perf_counter()
        client.async_stream_infer("llm", ins, enable_empty_final_response=True)
        tokens = 0
        while True:
            r, e = q.get(timeout=600)
            if e is not None:
                raise RuntimeError(str(e))
            tokens = int(r.as_numpy("num_output_tokens").reshape(-1)[0])
            if r.get_response().parameters["triton_final_response"].bool_param:
                break
        out.append((tokens, time.perf_counter() - t0))
    client.stop_stream()
    client.close()


def _metrics(port):
    import re
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(specserve_\S+) (\S+)$", text, re.M)}


def part_b(max_tokens: int, concurrencies, model_drafters: bool = False) -> list:
    """Arms: plain, static n-gram γ=4, the default composite and (model_drafters) the
    composite with the distilled code and chat drafters too, on a pool that then also
    holds requests for code and chat questions."""
    from backend.launcher import start_server

    pool = list(COPY_HEAVY.values()) + list(FREE_FORM.values())
    arms = [("off", {}), ("static", {"gamma": 4}), ("composite", {})]
    if model_drafters:
        pool += list(CODE_PROMPTS.values()) + list(PROSE_PROMPTS.values())
        arms.append(("composite", {"drafters": MODEL_DRAFTERS}))
    rows = []
    for policy, params in arms:
        label = arm_label(policy, params)
        # An empty SPECSERVE_POLICY_CONFIG clears config.pbtxt's default policy file.
        env = {"SPECSERVE_POLICY": policy, "SPECSERVE_POLICY_CONFIG": "", "SPECSERVE_MAX_BATCH": str(max(concurrencies))}
        if "drafters" in params:
            env["SPECSERVE_DRAFTERS"] = params["drafters"]
        if policy == "static":
            cfg = RESULTS / f"policy_{policy}_{params['gamma']}.yaml"
            cfg.write_text(f"policy: static\nparams:\n  drafter: ngram\n  gamma: {params['gamma']}\n")
            env["SPECSERVE_POLICY_CONFIG"] = str(cfg)
        elif policy == "composite":
            env["SPECSERVE_POLICY_CONFIG"] = str(ROOT / "configs" / "policies" / "composite.yaml")
        log(f"  starting Triton with policy {label}")
        with open(RESULTS / "server.log", "a") as server_log:
            proc, ports = start_server(env=env, log_file=server_log)
        try:
            _stream_client(f"127.0.0.1:{ports.grpc}", pool[:1], 8, [])  # warm-up
            for conc in concurrencies:
                per_client = 2 if conc < 32 else 1
                out, threads = [], []
                before = _metrics(ports.metrics)
                t0 = time.perf_counter()
                for i in range(conc):
                    prompts = [pool[(i + j) % len(pool)] for j in range(per_client)]
                    t = threading.Thread(target=_stream_client, args=(f"127.0.0.1:{ports.grpc}", prompts, max_tokens, out))
                    t.start()
                    threads.append(t)
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                time.sleep(0.5)  # metrics publish a few times a second
                after = _metrics(ports.metrics)
                def phase(p):
                    key = f'specserve_phase_seconds_total{{phase="{p}"}}'
                    return after[key] - before[key]
                steps = after["specserve_steps_total"] - before["specserve_steps_total"]
                seqs = after["specserve_step_sequences_total"] - before["specserve_step_sequences_total"]
                tokens = sum(n for n, _ in out)
                row = {"arm": label, "concurrency": conc, "requests": len(out), "tokens": tokens, "wall_s": wall,
                       "tok_s": tokens / wall, "mean_batch": seqs / max(steps, 1),
                       "io_ms_per_step": 1000 * phase("io") / max(steps, 1),
                       "step_ms": 1000 * phase("step") / max(steps, 1),
                       "prefill_share": phase("prefill") / max(phase("prefill") + phase("step"), 1e-9),
                       "mean_latency_s": statistics.mean(s for _, s in out)}
                rows.append(row)
                log(f"  {label:10s} concurrency {conc:3d}: {row['tok_s']:7.1f} tok/s aggregate, mean batch "
                    f"{row['mean_batch']:.1f}, step {row['step_ms']:.1f} ms of which Triton I/O "
                    f"{row['io_ms_per_step']:.2f} ms, prefill {100 * row['prefill_share']:.0f}% of loop time")
        finally:
            proc.terminate()
            proc.wait(30)
    for row in rows:
        plain = next(r for r in rows if r["arm"] == "plain" and r["concurrency"] == row["concurrency"])
        row["ratio"] = row["tok_s"] / plain["tok_s"]
    return rows


def plot(a_rows, b_rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [rows for rows in (a_rows, b_rows) if rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    axes = list(axes[0])
    if a_rows:
        plot_engine(axes.pop(0), a_rows)
    if b_rows:
        plot_server(axes.pop(0), b_rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_engine(ax, a_rows):
    prompts = list(dict.fromkeys(r["prompt"] for r in a_rows))
    arms = list(dict.fromkeys(r["arm"] for r in a_rows))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        vals = [next(r["tok_s"] for r in a_rows if r["prompt"] == p and r["arm"] == arm) for p in prompts]
        ax.bar([x + i * width for x in range(len(prompts))], vals, width, label=arm)
    ax.set_xticks([x + width * (len(arms) - 1) / 2 for x in range(len(prompts))])
    ax.set_xticklabels([f"{p}\n({next(r['kind'] for r in a_rows if r['prompt'] == p)})" for p in prompts])
    ax.set_ylabel("tokens/s (batch 1, bf16)")
    ax.set_title("Engine loop, batch 1")
    ax.legend()


def plot_server(ax, b_rows):
    for arm in dict.fromkeys(r["arm"] for r in b_rows):
        pts = [(r["concurrency"], r["tok_s"]) for r in b_rows if r["arm"] == arm]
        ax.plot(*zip(*pts), marker="o", label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate output tokens/s")
    ax.set_title("Through Triton (gRPC streaming)")
    ax.legend()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-engine", action="store_true", help="only Part B (through Triton)")
    ap.add_argument("--model-drafters", action="store_true",
                    help=f"Part B also serves the composite with {MODEL_DRAFTERS}, on code and chat prompts too")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    a_rows = []
    if not args.skip_engine:
        log(f"Part A: engine loop in-process, batch 1, bf16, {args.max_tokens} new tokens, best of {args.repeats}")
        a_rows = part_a(args.max_tokens, args.repeats)
    b_rows = []
    if not args.skip_server:
        log(f"Part B: real Triton server, gRPC streaming, {args.max_tokens // 2} new tokens per request")
        b_rows = part_b(args.max_tokens // 2, args.concurrency, args.model_drafters)
    stem = "speculation" + ("_server" if args.skip_engine else "_engine" if args.skip_server else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"part_a": a_rows, "part_b": b_rows}, indent=1))
    plot(a_rows, b_rows, RESULTS / f"{stem}.png")
    log(f"wrote {RESULTS / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
