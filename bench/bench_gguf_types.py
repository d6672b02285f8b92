"""Which GGUF type the llama.cpp engine serves: speed of plain decoding and of verification,
and agreement with the exact reference, for Q4_1 (as shipped), Q4_0 and Q8_0 (requantized
from it with llama.cpp's own llama_model_quantize), measured side by side in one run.

  * decode: one token of one sequence after a 256-token context (ms, lower median of N);
  * verify k: k tokens of one sequence in one forward, as a ratio to decode (what a
    speculative step costs relative to a plain one);
  * batch 8: one token each of 8 sequences, as a ratio to decode;
  * agreement: on the bench prompts teacher-forced through 64 tokens of the reference's
    own greedy continuation, the fraction of positions whose argmax equals the torch fp32
    engine's (the reference is the shipped Q4_1 weights dequantized, so Q4_1 is closest by
    construction; what matters is how much requantizing costs).

    .venv/bin/python bench/bench_gguf_types.py [--repeats 7]

Writes bench/results/gguf_types.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from prompts import COPY_HEAVY, FREE_FORM  # bench/ (the script's own folder)

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
SOURCE = ROOT / ".cache" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
RESULTS = ROOT / "bench" / "results"


def log(msg):
    print(msg, flush=True)


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median_low(sorted(samples)[: repeats // 2 + 1])


def reference_runs(tok, n_new: int):
    """Per prompt: (token ids of prompt + the fp32 reference's greedy continuation, its argmax per
    position of the continuation)."""
    import torch

    from backend.engines.torch_llama import TorchLlama
    ref = TorchLlama(CHECKPOINT, dtype="fp32", max_slots=1, max_context=2048)
    runs = []
    for prompt in list(COPY_HEAVY.values()) + list(FREE_FORM.values()):
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        out = ref.forward([0], [0], [ids], logit_rows=[[len(ids) - 1]])
        cont = [int(out.argmax(-1)[0])]
        for i in range(n_new - 1):
            cont.append(int(ref.forward([0], [len(ids) + i], [[cont[-1]]]).argmax(-1)[0]))
        full = ids + cont
        logits = ref.forward([0], [0], [full], logit_rows=[list(range(len(ids) - 1, len(full) - 1))])
        runs.append((full, len(ids), torch.argmax(logits, -1)))
    return runs


def measure(gguf: Path, runs, repeats: int) -> dict:
    from backend.engines.llama_cpp import LlamaCpp
    eng = LlamaCpp(gguf, max_slots=8, max_context=1024)
    ctx = [11 + (i * 7919) % 30000 for i in range(256)]
    for s in range(8):
        eng.forward([s], [0], [ctx], logit_rows=[[255]])
    decode = timed(lambda: eng.forward([0], [256], [[5]]), repeats)
    row = {"type": eng.shape.weight_type, "file_mib": gguf.stat().st_size / 2**20, "decode_ms": 1000 * decode}
    for k in (2, 4, 8):
        row[f"verify{k}_x"] = timed(lambda: eng.forward([0], [256], [[5] * k]), repeats) / decode
    row["batch8_x"] = timed(lambda: eng.forward(list(range(8)), [256] * 8, [[5]] * 8), repeats) / decode
    agree = total = 0
    for full, n_prompt, want in runs:
        got = eng.forward([0], [0], [full], logit_rows=[list(range(n_prompt - 1, len(full) - 1))]).argmax(-1)
        agree += int((got == want).sum())
        total += len(want)
    row["agreement"] = agree / total
    eng.close()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from build_engines.prepare_gguf import quantize
    tok = AutoTokenizer.from_pretrained(CHECKPOINT)
    log("reference: torch fp32 greedy continuations")
    runs = reference_runs(tok, args.new_tokens)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for qtype in ("Q4_1", "Q4_0", "Q8_0"):
            path = SOURCE if qtype == "Q4_1" else Path(tmp) / f"model-{qtype}.gguf"
            if qtype != "Q4_1":
                quantize(SOURCE, path, qtype)
            rows.append(measure(path, runs, args.repeats))
            r = rows[-1]
            log(f"{qtype}: {r['file_mib']:.0f} MiB, decode {r['decode_ms']:.1f} ms, verify k=2/4/8 "
                f"{r['verify2_x']:.2f}x/{r['verify4_x']:.2f}x/{r['verify8_x']:.2f}x, batch 8 {r['batch8_x']:.2f}x, "
                f"argmax agreement with torch fp32 {100 * r['agreement']:.1f}%")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gguf_types.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
