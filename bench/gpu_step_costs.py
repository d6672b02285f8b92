"""Step time of our torch engine on a GPU, by batch size x tokens per sequence: the first GPU
cost curve the policies' simulator can read (issue 31, item 6).

A GPU machine here has torch with CUDA but no TensorRT-LLM and no model download, so this
times `backend/engines/torch_llama.TorchLlama` with random weights of a real model's layout
(default: Llama-3-8B, bf16; weights and a KV cache of max_slots x (ctx + tokens) on the GPU).
The engine runs eagerly and without batch invariance (TensorRT-LLM is not batch-invariant
either); every forward asks logits of every new position, as verification does. Each point:

  * eager_s: wall time of one synchronised forward (lower median): what our engine pays,
    Python and kernel launches included;
  * gpu_s: the kernels' own time, summed by torch's profiler over the same forward: what an
    engine that replays CUDA graphs (TensorRT-LLM does, per batch size) pays for the same
    arithmetic and memory traffic, the launch gaps taken out.

A speculative iteration on TensorRT-LLM 1.2 verifies every sequence at the iteration's draft
length (it pads), so tokens per sequence t = 1 + the iteration's gamma and the table reads
T(B, t) directly. The draft model's table (default layout Llama-3.2-1B) is the same at t = 1.

    python bench/gpu_step_costs.py --out docs/results/gpu_step_costs_h200.json   (on a GPU machine)
    python bench/gpu_step_costs.py --from docs/results/gpu_step_costs_h200.json --plot docs/results/gpu_step_costs_h200.png
    python bench/gpu_step_costs.py --layout tiny --device cpu --batches 1,2 --tokens 1,2 --ctx 32

Progress goes to stderr, the table to stdout, the figures to --out (JSON).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backend.engines.torch_llama import LlamaShape, TorchLlama, random_weights  # noqa: E402

# Hugging Face config.json fields of the layouts timed (the published configs' shapes).
LAYOUTS = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, rope_theta=500000.0,
                      max_position_embeddings=8192, tie_word_embeddings=False),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=64, intermediate_size=8192, rope_theta=500000.0,
                        max_position_embeddings=8192, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, max_position_embeddings=4096, tie_word_embeddings=True),
}


def log(msg: str) -> None:
    print(f"[gpu_step_costs] {msg}", file=sys.stderr, flush=True)


def shape_of(layout: str) -> LlamaShape:
    return LlamaShape.from_config({"model_type": "llama", "rms_norm_eps": 1e-5, **LAYOUTS[layout]})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_s(fn, device: torch.device, repeats: int) -> float:
    """Lower median of `repeats` synchronised calls after two warm-ups."""
    samples = []
    for i in range(repeats + 2):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= 2:
            samples.append(time.perf_counter() - t0)
    return statistics.median_low(samples)


def kernel_s(fn, device: torch.device, repeats: int) -> float | None:
    """The kernels' own time per call, summed by torch's profiler (None off CUDA)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        sync(device)
    total_us = sum(getattr(ev, "self_device_time_total", 0.0) for ev in prof.key_averages())
    if not total_us:  # another torch's names: the device-side events themselves
        total_us = sum(e.time_range.elapsed_us() for e in prof.events() if str(e.device_type).endswith("CUDA"))
    return total_us / repeats / 1e6


def time_grid(engine: TorchLlama, ctxs, batches, tokens, repeats: int) -> dict:
    """{"eager_s": [ctx][B][t], "gpu_s": ...}: every sequence at `ctx` cached tokens appends t."""
    dev = engine.device
    eager = [[[None] * len(tokens) for _ in batches] for _ in ctxs]
    gpu = [[[None] * len(tokens) for _ in batches] for _ in ctxs]
    for ci, ctx in enumerate(ctxs):
        for bi, b in enumerate(batches):
            for ti, t in enumerate(tokens):
                slots, starts, toks = list(range(b)), [ctx] * b, [[7] * t for _ in range(b)]
                fn = lambda: engine.forward(slots, starts, toks)  # noqa: E731
                eager[ci][bi][ti] = wall_s(fn, dev, repeats)
                gpu[ci][bi][ti] = kernel_s(fn, dev, max(2, repeats // 3))
                g = gpu[ci][bi][ti]
                log(f"ctx {ctx:5d}  B {b:4d}  t {t}: eager {eager[ci][bi][ti] * 1e3:8.2f} ms"
                    + (f"  kernels {g * 1e3:8.2f} ms" if g is not None else ""))
    return {"eager_s": eager, "gpu_s": gpu}


def prefill_points(engine: TorchLlama, lengths, repeats: int) -> dict:
    """One sequence prefilling n tokens from position 0, logits of its last position only."""
    dev, out = engine.device, {"tokens": list(lengths), "eager_s": [], "gpu_s": []}
    for n in lengths:
        fn = lambda: engine.forward([0], [0], [[7] * n], logit_rows=[[n - 1]])  # noqa: E731
        out["eager_s"].append(wall_s(fn, dev, repeats))
        out["gpu_s"].append(kernel_s(fn, dev, max(2, repeats // 3)))
        log(f"prefill {n:5d} tokens: eager {out['eager_s'][-1] * 1e3:8.2f} ms")
    return out


def build(layout: str, device: str, max_slots: int, max_context: int) -> TorchLlama:
    shape = shape_of(layout)
    t0 = time.perf_counter()
    eng = TorchLlama(None, dtype="bf16", device=device, max_slots=max_slots, max_context=max_context,
                     batch_invariant=False, weights=(shape, random_weights(shape, torch.bfloat16, device)))
    log(f"{layout}: random bf16 weights and a {max_slots} x {max_context} KV cache on {device} "
        f"in {time.perf_counter() - t0:.1f} s")
    return eng


def plot(info: dict, png: Path) -> None:
    """Kernel time (else eager time) by tokens per sequence, one line per batch size, a panel per
    context length; relative to the same batch's plain step (t = 1), as the policy reads it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kind = "gpu_s" if info["target"]["gpu_s"][0][0][0] is not None else "eager_s"
    grid, tokens = info["target"][kind], info["tokens_per_seq"]
    fig, axes = plt.subplots(1, len(info["ctx"]), figsize=(5.5 * len(info["ctx"]), 4.2), squeeze=False)
    for ax, ctx, rows in zip(axes[0], info["ctx"], grid):
        for b, row in zip(info["batch"], rows):
            ax.plot(tokens, [v / row[0] for v in row], marker="o", ms=3, label=f"B={b}")
        ax.set_title(f"{info['layout']} bf16, {ctx} cached tokens")
        ax.set_xlabel("tokens verified per sequence (1 + gamma)")
        ax.set_ylabel("step time / plain step (t = 1)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, ncol=2)
    fig.suptitle(f"torch engine on {info['device']}, {'kernel' if kind == 'gpu_s' else 'wall'} time "
                 f"(bench/gpu_step_costs.py, {info['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    log(f"wrote {png}")


def ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def table(title: str, ctxs, batches, tokens, grid) -> str:
    lines = [title]
    for ci, ctx in enumerate(ctxs):
        lines.append(f"  ctx {ctx}: ms by B (rows) x tokens per sequence (columns)")
        lines.append("    B    " + "".join(f"{t:>9d}" for t in tokens))
        for bi, b in enumerate(batches):
            lines.append(f"    {b:<5d}" + "".join(f"{v * 1e3:9.2f}" if v is not None else "        -"
                                               for v in grid[ci][bi]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="llama3-8b", choices=sorted(LAYOUTS))
    ap.add_argument("--draft-layout", default="llama3.2-1b", choices=sorted(LAYOUTS) + ["none"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=ints, default=ints("1,2,4,8,16,32,64,128"))
    ap.add_argument("--tokens", type=ints, default=ints("1,2,3,4,5,6,7,8"), help="tokens per sequence (1 + gamma)")
    ap.add_argument("--ctx", type=ints, default=ints("512,2048"), help="cached tokens per sequence")
    ap.add_argument("--prefill", type=ints, default=ints("128,512,2048"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path, help="write a PNG of the figures (with --from: of a saved run)")
    ap.add_argument("--from", dest="saved", type=Path, help="a saved --out JSON: print and plot it, measure nothing")
    args = ap.parse_args(argv)
    if args.saved:
        info = json.loads(args.saved.read_text())
        print(table(f"target {info['layout']}, kernels only (ms)", info["ctx"], info["batch"], info["tokens_per_seq"],
                    info["target"]["gpu_s"]))
        if args.plot:
            plot(info, args.plot)
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("no CUDA device")
        return 2
    dev = torch.device(args.device)
    max_context = max(args.ctx) + max(args.tokens) + 1
    max_context = max(max_context, max(args.prefill) + 1)
    info = {"layout": args.layout, "dtype": "bf16", "engine": "torch eager, batch_invariant=False",
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "ctx": args.ctx,
            "batch": args.batches, "tokens_per_seq": args.tokens}
    log(f"{info['device']}, torch {torch.__version__}")
    eng = build(args.layout, args.device, max(args.batches), max_context)
    # warm the clocks and the kernels' heuristics before the first point counts
    for _ in range(3):
        eng.forward(list(range(max(args.batches))), [0] * max(args.batches), [[7] * max(args.tokens)] * max(args.batches))
    sync(dev)
    info["target"] = time_grid(eng, args.ctx, args.batches, args.tokens, args.repeats)
    info["prefill"] = prefill_points(eng, args.prefill, args.repeats)
    del eng
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    print(table(f"target {args.layout}, eager (ms)", args.ctx, args.batches, args.tokens, info["target"]["eager_s"]))
    if dev.type == "cuda":
        print(table(f"target {args.layout}, kernels only (ms)", args.ctx, args.batches, args.tokens,
                    info["target"]["gpu_s"]))
    if args.draft_layout != "none":
        info["draft_layout"] = args.draft_layout
        d = build(args.draft_layout, args.device, max(args.batches), max_context)
        info["draft"] = time_grid(d, args.ctx, args.batches, [1], args.repeats)
        for kind in ("eager_s", "gpu_s") if dev.type == "cuda" else ("eager_s",):
            print(table(f"draft {args.draft_layout}, one token, {kind[:-2]} (ms)", args.ctx, args.batches, [1],
                        info["draft"][kind]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(info, indent=1))
        log(f"wrote {args.out}")
    if args.plot:
        plot(info, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
