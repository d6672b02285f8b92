"""What coarser int8 scales cost the model: perplexity and next-token agreement against Q8_0.

bench/bench_coarse_scales.py measures what a weight format with one scale a row, or one every 192
weights, would save a verification step; this measures what it would cost the model's quality,
so that the choice is a product decision made on numbers. The served model's checkpoint
(SmolLM2-135M-Instruct) runs in fp32 (torch, CPU) with every matmul's weights and input
activations rounded as the format would store them (symmetric int8, scale = max |x| / 127 over a
block; Q8_0's block is 32 with a half-precision scale, as llama.cpp's quantize_row_q8_0; the
tied output matrix and token embeddings too), on held-out ShareGPT answers (the set-up's download,
the split bench/peer_workloads.py uses), in windows of --window tokens:
  bf16      the checkpoint as trained (no int8 anywhere)
  q8_0      a scale every 32, weights and activations (what we serve)
  b192      a scale every 192 (576 and 1536, the model's depths, are multiples of 192, not of 128)
  row       one scale a weight row and one an activation row
Prints perplexity, its change against q8_0, and how often each format's most likely next token is
Q8_0's. Attention and the KV cache are left in fp32 for all (the same for every format).

    .venv/bin/python bench/bench_format_quality.py [--tokens 32768] [--window 1024]

Writes bench/results/format_quality.{json,png}. ~1-2 minutes a format on two cores at 32k tokens.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
FORMATS = {"bf16": None, "q8_0": 32, "b192": 192, "row": 0}  # block of one scale; 0: the whole row


def fake_int8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded as symmetric int8 with one scale per `block` of its last dimension (0: per row);
    blocks of 32 and 192 keep their scale in half precision, as GGUF does."""
    shape = x.shape
    b = shape[-1] if block == 0 else block
    v = x.reshape(-1, shape[-1] // b, b).float()
    d = v.abs().amax(dim=-1, keepdim=True) / 127
    if block:
        d = d.half().float()
    q = torch.where(d > 0, torch.round(v / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(v)).clamp(-127, 127)
    return (q * d).reshape(shape).to(x.dtype)


def heldout_ids(tokenizer, n_tokens: int) -> list:
    from build_engines.drafter_data import held_out, sharegpt_turns
    from peer_workloads import DOWNLOADS  # bench/ (the script's own folder)
    ids: list = []
    for key, _, answer in sharegpt_turns(DOWNLOADS):
        if held_out(key, 0, 0.05):
            ids.extend(tokenizer(answer + "\n\n")["input_ids"])
            if len(ids) >= n_tokens:
                break
    return ids[:n_tokens]


def evaluate(block, ids: list, window: int):
    """(perplexity, argmax of every scored position) of the checkpoint in one format."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    hooks = []
    if block is not None:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(fake_int8(module.weight, block))  # lm_head: the tied embeddings too
                    hooks.append(module.register_forward_pre_hook(lambda m, args: (fake_int8(args[0], block),)))
    nll, count, tops = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[start: start + window + 1]])
            logits = model(chunk[:, :-1]).logits[0]
            target = chunk[0, 1:]
            nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            count += target.numel()
            tops.append(logits.argmax(dim=-1))
    for h in hooks:
        h.remove()
    return math.exp(nll / count), torch.cat(tops)


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(r["formats"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.5))
    a.bar(names, [r["formats"][n]["perplexity"] for n in names], color="tab:blue")
    a.set_ylim(min(r["formats"][n]["perplexity"] for n in names) * 0.98, None)
    a.set_title("perplexity (held-out ShareGPT answers)", fontsize=9)
    b.bar(names, [100 * r["formats"][n]["top1_agrees_with_q8_0"] for n in names], color="tab:orange")
    b.set_ylim(80, 100)
    b.set_title("most likely next token = Q8_0's (%)", fontsize=9)
    fig.suptitle(f"SmolLM2-135M-Instruct, {r['tokens']} tokens: int8 scale every 32 (q8_0), 192, or a row", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768, help="held-out tokens scored")
    ap.add_argument("--window", type=int, default=1024, help="tokens a forward (each window starts fresh)")
    ap.add_argument("--out", type=Path, default=RESULTS / "format_quality.json")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer
    ids = heldout_ids(AutoTokenizer.from_pretrained(CHECKPOINT), args.tokens)
    print(f"{len(ids)} held-out tokens, windows of {args.window}", flush=True)
    results, tops = {}, {}
    for name, block in FORMATS.items():
        t0 = time.perf_counter()
        ppl, tops[name] = evaluate(block, ids, args.window)
        results[name] = {"perplexity": ppl}
        print(f"  {name:5s} perplexity {ppl:8.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    base = results["q8_0"]["perplexity"]
    print(f"\n  {'format':6s} {'perplexity':>10s} {'vs q8_0':>9s} {'top-1 = q8_0':>13s}")
    for name, r in results.items():
        r["vs_q8_0"] = r["perplexity"] / base - 1
        r["top1_agrees_with_q8_0"] = (tops[name] == tops["q8_0"]).float().mean().item()
        print(f"  {name:6s} {r['perplexity']:10.4f} {100 * r['vs_q8_0']:+8.2f}% {100 * r['top1_agrees_with_q8_0']:12.2f}%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"tokens": len(ids), "window": args.window, "formats": results}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
