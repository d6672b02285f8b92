"""Speculative decoding benchmark: plain vs static n-gram speculation, measured side by side.

Part A (engine loop in-process, batch 1, --engine llama.cpp (default) or torch, the latter
on --device cpu or cuda): tokens/s and ratio to plain greedy for static n-gram speculation
and the adaptive composite on copy-heavy and free-form prompts, whether each arm generated
plain's token ids (greedy speculation is lossless), and where a step's time goes (draft,
verify forward, acceptance, scheduling) plus prefill. With llama.cpp, the peers a CPU user would pick
instead run in the same part on the same GGUF and prompts: llama-cpp-python's `Llama`
plain and with its prompt-lookup speculation; every row gets its ratio to llama.cpp's
plain decoding too.
Part B (through the real Triton server, gRPC streaming clients): aggregate output
tokens/s under steady load from 1, 8 and 32 closed-loop streams (the server's token
counter over a measured window), plain vs speculation, mean request latency, and
where the loop's time goes (Triton I/O, prefill).

    .venv/bin/python bench/bench_speculation.py [--max-tokens 128] [--skip-server]
        [--engine torch --device cuda] [--checkpoint DIR] [--prompts N] [--out DIR]

Writes bench/results/speculation.{json,png} (--out: another folder; no .png without matplotlib).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import threading
import time
from pathlib import Path

from prompts import CODE_PROMPTS, COPY_HEAVY, FREE_FORM, PROSE_PROMPTS, distinct_requests  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
MODEL_DRAFTERS = "ngram,suffix,code,chat"  # the distilled drafters too (built on demand)
ARMS = [("off", {}), ("static", {"gamma": 2}), ("static", {"gamma": 4}), ("static", {"gamma": 8}), ("composite", {})]


def log(msg):
    print(msg, flush=True)


def arm_label(policy, params):
    if policy == "composite":
        return "composite + model drafters" if "drafters" in params else "composite"
    return "plain" if policy == "off" else f"ngram γ={params['gamma']}"


def composite_policy(engine: str = "llama.cpp"):
    """Our adaptive policy exactly as the server builds it from its example config (planning
    with the measured cost profile of `engine`)."""
    from backend.server_config import ServerConfig
    from backend.served_policy import load_policy
    return load_policy(ServerConfig(policy="configs/policies/composite.yaml", engine=engine), ROOT)


def bench_prompts(limit: int | None = None):
    """(kind, name, prompt): the copy-heavy prompts, then the free-form ones; the first `limit`."""
    return ([("copy-heavy", n, p) for n, p in COPY_HEAVY.items()]
            + [("free-form", n, p) for n, p in FREE_FORM.items()])[:limit]


# -- Part A ------------------------------------------------------------------------------------
def part_a(max_tokens: int, repeats: int, engine_kind: str = "llama.cpp", device: str = "cpu",
           checkpoint: Path = CHECKPOINT, prompts: int | None = None) -> list:
    from transformers import AutoTokenizer

    from backend.loop.offline import make_loop, run_all
    from backend.generation.request import GenerationRequest

    tok = AutoTokenizer.from_pretrained(checkpoint)
    if engine_kind == "llama.cpp":
        import torch

        from backend.engines.llama_cpp import LlamaCpp, served_gguf
        torch.set_num_threads(1)  # as the server runs torch beside llama.cpp (backend/services/build.py)
        engine = LlamaCpp(served_gguf(checkpoint), max_slots=1, max_context=2048)
        arms = [("off", {}), ("static", {"gamma": 1}), ("static", {"gamma": 2}), ("static", {"gamma": 4}),
                ("composite", {})]
    else:
        from backend.engines.torch_llama import TorchLlama
        engine = TorchLlama(checkpoint, dtype="bf16", max_slots=1, max_context=2048, device=device)
        arms = ARMS
    warm = GenerationRequest(prompt="Hello", max_new_tokens=8, apply_chat_template=True)
    run_all(make_loop(engine, tok, "off", max_batch=1), [warm])  # first calls (CUDA: kernels, cuBLAS) untimed
    rows = []
    for kind, name, prompt in bench_prompts(prompts):
        # best of N, the arms taken in turn within each round: the machine is shared and drifts
        # (an H200 host's batch-1 step moved 16 -> 26 ms between arms minutes apart), so every
        # arm sees the same stretches of it
        runs = [[] for _ in arms]
        for _ in range(repeats):
            for i, (policy, params) in enumerate(arms):
                runs[i].append(_run_once(engine, engine_kind, tok, kind, name, prompt, policy, params, max_tokens))
        for arm_runs in runs:
            best = max(arm_runs, key=lambda r: r["tok_s"])
            best["repeats_agree"] = all(r["ids"] == best["ids"] for r in arm_runs)  # every run the same tokens
            rows.append(best)
            ms = best["ms_per_step"]
            plain = next(r for r in rows if r["prompt"] == name and r["arm"] == "plain")  # arms: plain first
            log(f"  {kind:10s} {name:9s} {best['arm']:10s} {best['tok_s']:6.1f} tok/s  "
                f"{best['tokens_per_step']:.2f} tok/step  accept {best['acceptance']:.2f}  step {ms['step']:.1f} ms "
                f"(draft {ms['draft']:.2f}, verify {ms['verify']:.1f}, accept {ms['accept']:.2f}, "
                f"sched+io {ms['sched+io']:.2f})  prefill {best['prefill_ms']:.0f} ms  "
                f"{'ids = plain' if best['ids'] == plain['ids'] else 'ids DIFFER from plain'}"
                f"{'' if best['repeats_agree'] else ' (repeats DIFFER)'}")
    if engine_kind == "llama.cpp":
        engine.close()
        rows += llama_cpp_peers(tok, max_tokens, repeats, checkpoint, prompts)
    compare_to_plain(rows)
    for row in rows:
        log(f"  {row['prompt']:9s} {row['arm']:28s} {row['tok_s']:6.1f} tok/s  x{row['ratio']:.2f} of our plain"
            + (f"  x{row['ratio_llama_cpp']:.2f} of llama.cpp plain" if "ratio_llama_cpp" in row else "")
            + ("" if "same_as_plain" not in row else "  ids = plain" if row["same_as_plain"]
               else "  ids DIFFER from plain"))
    log(lossless_line(rows))
    return rows


def compare_to_plain(rows: list) -> list:
    """Each row's tokens/s ratio to our plain decoding of the same prompt (and to llama.cpp's
    own plain decoding where that peer ran), and, for rows that recorded their token ids,
    `same_as_plain`: whether they (in every repeat) are plain decoding's for that prompt."""
    for row in rows:
        same = [r for r in rows if r["prompt"] == row["prompt"]]
        plain = next(r for r in same if r["arm"] == "plain")
        row["ratio"] = row["tok_s"] / plain["tok_s"]
        peer = next((r for r in same if r["arm"] == PEER_PLAIN), None)
        if peer:
            row["ratio_llama_cpp"] = row["tok_s"] / peer["tok_s"]
        if "ids" in row:
            row["same_as_plain"] = row["ids"] == plain["ids"] and row.get("repeats_agree", True)
    return rows


def lossless_line(rows: list) -> str:
    """The lossless check's summary: how many rows generated plain's token ids, which did not,
    and where plain decoding itself did not repeat its tokens."""
    checked = [r for r in rows if "same_as_plain" in r and r["arm"] != "plain"]
    bad = [f"{r['prompt']}/{r['arm']}" for r in checked if not r["same_as_plain"]]
    unrepeatable = [r["prompt"] for r in rows if r["arm"] == "plain" and not r.get("repeats_agree", True)]
    return (f"lossless check: {len(checked) - len(bad)} of {len(checked)} speculative rows generated plain's "
            f"token ids, {len(bad)} mismatches" + (f": {', '.join(bad)}" if bad else "")
            + (f"; plain decoding's repeats DIFFER on {', '.join(unrepeatable)}" if unrepeatable else ""))


PEER_PLAIN = "llama.cpp Llama (peer)"
PEER_LOOKUP = "llama.cpp prompt lookup (peer)"


def _run_once(engine, engine_kind: str, tok, kind: str, name: str, prompt: str, policy: str, params: dict,
              max_tokens: int) -> dict:
    """One request of `prompt` through a fresh batch-1 loop of this arm: its row (tok/s, steps, times, ids)."""
    from backend.loop.offline import make_loop, run_all
    from backend.generation.request import GenerationRequest

    loop = make_loop(engine, tok, "off" if policy == "composite" else policy, max_batch=1,
                     **({"drafter": "ngram", **params} if params else {}))
    if policy == "composite":
        loop.policy = composite_policy(engine_kind)
    req = GenerationRequest(prompt=prompt, max_new_tokens=max_tokens, apply_chat_template=True,
                            exclude_input_in_output=True, return_output_ids=True)
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
           "prefill_ms": 1000 * st.prefill_time_s, "ids": c.output_ids}
    row["ms_per_step"]["sched+io"] = row["ms_per_step"]["step"] - sum(
        row["ms_per_step"][k] for k in ("draft", "verify", "accept"))
    return row


def llama_cpp_peers(tok, max_tokens: int, repeats: int, checkpoint: Path = CHECKPOINT,
                    prompts: int | None = None) -> list:
    """What a CPU user would run instead: llama-cpp-python's high-level `Llama` on the same GGUF
    and prompts (chat template applied the same way), greedy, plain and with its prompt-lookup
    speculation (`LlamaPromptLookupDecoding`, its default 10 draft tokens and a short one)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from backend.engines.llama_cpp import served_gguf
    from backend.engines.llama_cpp_cpu import high_level_defaults

    gguf = str(served_gguf(checkpoint))
    peers = [(PEER_PLAIN, None), (PEER_LOOKUP, 10), (PEER_LOOKUP.replace("lookup", "lookup k=2"), 2)]
    rows = []
    for label, k in peers:
        with high_level_defaults():  # no repack, no AMX: as everywhere (backend/engines/llama_cpp_cpu.py)
            llm = Llama(model_path=gguf, n_ctx=2048, n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(),
                        verbose=False, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k) if k else None)
        for kind, name, prompt in bench_prompts(prompts):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            best = None
            for _ in range(repeats):
                llm.reset()
                t0 = time.perf_counter()
                out = llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, top_k=1)
                wall = time.perf_counter() - t0
                n = out["usage"]["completion_tokens"]
                if best is None or n / wall > best["tok_s"]:
                    best = {"kind": kind, "prompt": name, "arm": label, "tokens": n, "wall_s": wall,
                            "tok_s": n / wall}
            rows.append(best)
            log(f"  {kind:10s} {name:9s} {label:28s} {best['tok_s']:6.1f} tok/s")
        del llm
    return rows


# -- Part B ------------------------------------------------------------------------------------
def _stream_client(url, next_prompt, max_tokens, out, stop, limit=None):
    """A closed-loop client: sends next_prompt()'s requests one after the other, each when
    the last one finished, until `stop` is set (or `limit` requests); appends
    (tokens, latency_s, finished_at) per request to `out`."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    i = 0
    while not stop.is_set() and (limit is None or i < limit):
        prompt = next_prompt()
        if prompt is None:
            raise RuntimeError("the benchmark ran out of distinct requests: lower --window")
        i += 1
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
        now = time.perf_counter()
        out.append((tokens, now - t0, now))
    client.stop_stream()
    client.close()


def _metrics(port, host: str = "127.0.0.1"):
    from backend.frontend.prometheus_text import scrape, specserve_series
    return specserve_series(scrape(f"{host}:{port}"))


def _steady_run(ports, requests, conc: int, max_tokens: int, window: float, host: str = "127.0.0.1") -> dict:
    """`conc` closed-loop clients keep the server busy; throughput is read from the server's
    own counters over a window that starts once every client is in flight and ends before
    any stops, so the ramp-up and the last stragglers (which a one-shot batch of requests
    is dominated by) are not measured. `ports` names the server's gRPC and metrics ports on
    `host`; `requests` is any iterable of prompts (an iterator object is consumed as it is)."""
    out, threads, stop = [], [], threading.Event()
    lock, feed = threading.Lock(), iter(requests)

    def next_prompt():
        with lock:
            return next(feed, None)

    errors = []

    def client():
        try:
            _stream_client(f"{host}:{ports.grpc}", next_prompt, max_tokens, out, stop)
        except Exception as e:  # noqa: BLE001 - reported after the run, not lost in a thread
            errors.append(e)
            stop.set()

    for _ in range(conc):
        t = threading.Thread(target=client)
        t.start()
        threads.append(t)
    time.sleep(min(30.0, 2.0 + 0.5 * conc))  # every client's first request admitted and prefilled
    before, t0 = _metrics(ports.metrics, host), time.perf_counter()
    time.sleep(window)
    after, t1 = _metrics(ports.metrics, host), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]

    def delta(key):
        return after[key] - before[key]

    def phase(p):
        return delta(f'specserve_phase_seconds_total{{phase="{p}"}}')

    steps = delta("specserve_steps_total")
    done = [lat for _, lat, end in out if t0 <= end <= t1]
    return {"concurrency": conc, "window_s": t1 - t0, "tokens": delta("specserve_tokens_emitted_total"),
            "tok_s": delta("specserve_tokens_emitted_total") / (t1 - t0),
            "requests": len(done), "mean_latency_s": statistics.mean(done) if done else float("nan"),
            "mean_batch": delta("specserve_step_sequences_total") / max(steps, 1),
            "io_ms_per_step": 1000 * phase("io") / max(steps, 1), "step_ms": 1000 * phase("step") / max(steps, 1),
            "prefill_share": phase("prefill") / max(phase("prefill") + phase("step"), 1e-9)}


def part_b(max_tokens: int, concurrencies, window: float, model_drafters: bool = False,
           repeated: bool = False, rounds: int = 1) -> list:
    """Arms: plain, static n-gram γ=4, the default composite and (model_drafters) the
    composite with the distilled code and chat drafters too (the requests then include
    code requests). Requests are all different (bench/prompts.py distinct_requests) unless
    `repeated`: the four fixed prompts over and over, where the suffix drafter's store of
    recent outputs holds every answer. Each (arm, concurrency) gets a fresh server and
    the same request sequence, so no run drafts from another run's outputs. With `rounds` > 1
    the arms run round-robin that many times and each ratio is taken against plain decoding
    of the same round (the host's speed drifts by 10-20% over minutes on shared machines);
    the rows are then the per-(arm, concurrency) medians, with every round's ratio listed."""
    from backend.frontend.supervisor.launch import start_server

    if repeated:
        pool = list(COPY_HEAVY.values()) + list(FREE_FORM.values())
        if model_drafters:
            pool += list(CODE_PROMPTS.values()) + list(PROSE_PROMPTS.values())
        requests = pool * 200
    else:
        requests = distinct_requests(300, code=model_drafters)
    arms = [("off", {}), ("static", {"gamma": 4}), ("composite", {})]
    if model_drafters:
        from build_engines.on_demand import ensure_drafter
        for name in ("code", "chat"):  # built now (first time only), not while a server waits for them
            ensure_drafter(name)
        arms.append(("composite", {"drafters": MODEL_DRAFTERS}))
    rows = []
    for rnd, (policy, params) in ((r, a) for r in range(rounds) for a in arms):
        label = arm_label(policy, params)
        # SPECSERVE_POLICY, a name or a policy file, replaces config.pbtxt's
        env = {"SPECSERVE_POLICY": policy, "SPECSERVE_MAX_BATCH": str(max(concurrencies))}
        if "drafters" in params:
            env["SPECSERVE_DRAFTERS"] = params["drafters"]
        if policy == "static":
            cfg = RESULTS / f"policy_{policy}_{params['gamma']}.yaml"
            cfg.write_text(f"policy: static\nparams:\n  drafter: ngram\n  gamma: {params['gamma']}\n")
            env["SPECSERVE_POLICY"] = str(cfg)
        elif policy == "composite":
            env["SPECSERVE_POLICY"] = str(ROOT / "configs" / "policies" / "composite.yaml")
        for conc in concurrencies:
            log(f"  starting Triton with policy {label}")
            with open(RESULTS / "server.log", "a") as server_log:
                proc, ports = start_server(env=env, log_file=server_log)
            try:
                _stream_client(f"127.0.0.1:{ports.grpc}", lambda: "Hello", 8, [], threading.Event(), limit=1)  # warm-up
                row = _steady_run(ports, requests, conc, max_tokens, window)
            finally:
                proc.terminate()
                proc.wait(30)
            rows.append(dict(row, arm=label, round=rnd))
            log_server_row(rows[-1], rounds)
    add_ratios(rows)
    return rows if rounds == 1 else median_rows(rows)


def log_server_row(row: dict, rounds: int = 1) -> None:
    """Part B's line for one (arm, concurrency) level, as it is measured."""
    rnd = row.get("round", 0)
    log(f"  {row['arm']:10s} concurrency {row['concurrency']:3d}{f' (round {rnd + 1}/{rounds})' if rounds > 1 else ''}: "
        f"{row['tok_s']:7.1f} tok/s aggregate, mean batch "
        f"{row['mean_batch']:.1f}, step {row['step_ms']:.1f} ms of which Triton I/O "
        f"{row['io_ms_per_step']:.2f} ms, prefill {100 * row['prefill_share']:.0f}% of loop time, "
        f"{row['requests']} requests finished in the window, mean latency {row['mean_latency_s']:.1f} s")


def add_ratios(rows: list) -> list:
    """Each row's tokens/s ratio to plain decoding at the same concurrency in the same round
    (NaN where that plain level is missing or served nothing)."""
    for row in rows:
        plain = next((r for r in rows if r["arm"] == "plain" and r["concurrency"] == row["concurrency"]
                      and r.get("round", 0) == row.get("round", 0)), None)
        row["ratio"] = row["tok_s"] / plain["tok_s"] if plain and plain["tok_s"] else float("nan")
    return rows


def server_table(rows: list) -> str:
    """Part B's summary, one line per concurrency and one column per arm (plain first): aggregate
    tokens/s and the ratio to plain decoding; with rounds, the median ratio and each round's."""
    arms = sorted(dict.fromkeys(r["arm"] for r in rows), key=lambda a: a != "plain")
    concs = sorted(dict.fromkeys(r["concurrency"] for r in rows))
    out = ["| streams | " + " | ".join(f"{a} (tok/s)" if a == "plain" else a for a in arms) + " |",
           "|---" * (len(arms) + 1) + "|"]
    for conc in concs:
        cells = []
        for arm in arms:
            r = next((r for r in rows if r["arm"] == arm and r["concurrency"] == conc), None)
            if r is None:
                cells.append("-")
            elif arm == "plain":
                cells.append(f"{r['tok_s']:.1f}")
            else:
                rounds = (" (" + ", ".join(f"{x:.2f}" for x in r["round_ratios"]) + ")") if "round_ratios" in r else ""
                cells.append(f"{r['tok_s']:.1f} ({r['ratio']:.2f}×{rounds})")
        out.append(f"| {conc} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def median_rows(rows: list) -> list:
    """Per (arm, concurrency): the median round's figures, the median ratio and every round's ratio."""
    out = []
    for key in dict.fromkeys((r["arm"], r["concurrency"]) for r in rows):
        runs = sorted((r for r in rows if (r["arm"], r["concurrency"]) == key), key=lambda r: r["tok_s"])
        ratios = [r["ratio"] for r in sorted(runs, key=lambda r: r["round"])]
        out.append(dict(runs[len(runs) // 2], ratio=statistics.median(ratios), round_ratios=ratios))
        log(f"  median of {len(runs)} rounds: {key[0]:10s} concurrency {key[1]:3d}: ratio to plain "
            f"{statistics.median(ratios):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    return out


def plot(a_rows, b_rows, path):
    try:
        import matplotlib
    except ImportError:  # a bare machine (the GPU device): the .json has it all
        log(f"no matplotlib: {path.name} not drawn")
        return
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
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title("Engine loop, batch 1")
    ax.legend()


def plot_server(ax, b_rows):
    if "round_ratios" in b_rows[0]:
        return plot_server_rounds(ax, b_rows)
    for arm in dict.fromkeys(r["arm"] for r in b_rows):
        pts = [(r["concurrency"], r["tok_s"]) for r in b_rows if r["arm"] == arm]
        ax.plot(*zip(*pts), marker="o", label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate output tokens/s")
    ax.set_title("Through Triton (gRPC streaming)")
    ax.legend()


def plot_server_rounds(ax, b_rows):
    """Ratio to plain decoding per arm: the median as a bar, each round as a dot, per concurrency."""
    arms = list(dict.fromkeys(r["arm"] for r in b_rows))
    concs = list(dict.fromkeys(r["concurrency"] for r in b_rows))
    width = 0.8 / len(concs)
    for j, conc in enumerate(concs):
        rows = [next(r for r in b_rows if r["arm"] == a and r["concurrency"] == conc) for a in arms]
        xs = [i + j * width for i in range(len(arms))]
        ax.bar(xs, [r["ratio"] for r in rows], width, label=f"{conc} stream{'s' * (conc > 1)} (median)")
        for x, r in zip(xs, rows):
            ax.plot([x] * len(r["round_ratios"]), r["round_ratios"], "k.")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + width * (len(concs) - 1) / 2 for i in range(len(arms))])
    ax.set_xticklabels(arms, rotation=15)
    ax.set_ylabel("tokens/s ratio to plain decoding (same round)")
    ax.set_title(f"Through Triton, {len(b_rows[0]['round_ratios'])} rounds (dots)")
    ax.legend()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--window", type=float, default=60.0,
                    help="Part B: seconds of steady load measured per concurrency (after a ramp-up)")
    ap.add_argument("--repeated", action="store_true",
                    help="Part B sends four fixed prompts over and over instead of distinct requests")
    ap.add_argument("--rounds", type=int, default=1,
                    help="Part B: run the arms round-robin this many times; ratios against the same round's plain")
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "torch"],
                    help="Part A's engine (Part B serves the server's default engine unless SPECSERVE_ENGINE says)")
    ap.add_argument("--device", default="cpu", help="Part A with --engine torch: where the engine runs (cpu, cuda)")
    ap.add_argument("--checkpoint", type=Path, default=CHECKPOINT, help="Part A's checkpoint directory")
    ap.add_argument("--prompts", type=int, default=None, help="Part A: only the first N prompts")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results .json and .png go")
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-engine", action="store_true", help="only Part B (through Triton)")
    ap.add_argument("--model-drafters", action="store_true",
                    help=f"Part B also serves the composite with {MODEL_DRAFTERS}, on code and chat prompts too")
    args = ap.parse_args(argv)
    if args.device != "cpu" and args.engine != "torch":
        ap.error("--device needs --engine torch")
    RESULTS.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    a_rows = []
    if not args.skip_engine:
        log(f"Part A: engine loop in-process, batch 1, engine {args.engine}"
            f"{f' on {args.device}' if args.engine == 'torch' else ''}, {args.max_tokens} new tokens, "
            f"best of {args.repeats}")
        a_rows = part_a(args.max_tokens, args.repeats, args.engine, args.device, args.checkpoint, args.prompts)
    b_rows = []
    if not args.skip_server:
        log(f"Part B: real Triton server, gRPC streaming, {args.max_tokens // 2} new tokens per request, "
            f"steady load measured over {args.window:.0f} s per concurrency")
        b_rows = part_b(args.max_tokens // 2, args.concurrency, args.window, args.model_drafters, args.repeated,
                        args.rounds)
        log("Part B, aggregate output tokens/s (× = ratio to plain decoding):\n" + server_table(b_rows))
    stem = "speculation" + ("_server" if args.skip_engine else "_engine" if args.skip_server else "") + (
        "_repeated" if args.repeated and not args.skip_server else "")
    (args.out / f"{stem}.json").write_text(json.dumps({"part_a": a_rows, "part_b": b_rows}, indent=1))
    plot(a_rows, b_rows, args.out / f"{stem}.png")
    log(f"wrote {args.out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
