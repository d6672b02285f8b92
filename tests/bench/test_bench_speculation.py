"""bench/bench_speculation.py's Part A lossless check: each row's ratio to plain decoding of the same
prompt and whether it generated plain's token ids (in every repeat), the summary line that counts
the mismatches, and Part A run end to end on a tiny random-weight checkpoint (the real tokenizer)
into a folder of our choosing: every arm's ids recorded and equal to plain's."""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from backend.engines.torch_llama import LlamaShape, random_weights

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # bench/ scripts import their siblings

from bench_speculation import bench_prompts, compare_to_plain, lossless_line, main  # noqa: E402


def row(prompt, arm, tok_s, ids=None, **kw):
    return {"prompt": prompt, "arm": arm, "tok_s": tok_s, **({"ids": ids} if ids is not None else {}), **kw}


def test_each_row_is_compared_with_plain_decoding_of_its_prompt():
    rows = compare_to_plain([row("a", "plain", 10.0, [1, 2, 3]), row("a", "ngram γ=4", 15.0, [1, 2, 3]),
                             row("b", "plain", 20.0, [4, 5]), row("b", "ngram γ=4", 10.0, [4, 6]),
                             row("b", "composite", 30.0, [4, 5], repeats_agree=False),
                             row("b", "llama.cpp Llama (peer)", 40.0)])
    assert [r["ratio"] for r in rows] == [1.0, 1.5, 1.0, 0.5, 1.5, 2.0]
    assert [r.get("same_as_plain") for r in rows] == [True, True, True, False, False, None]
    assert lossless_line(rows) == ("lossless check: 1 of 3 speculative rows generated plain's token ids, "
                                   "2 mismatches: b/ngram γ=4, b/composite")


def test_without_mismatches_the_summary_lists_none():
    rows = compare_to_plain([row("a", "plain", 10.0, [1]), row("a", "composite", 12.0, [1])])
    assert lossless_line(rows) == "lossless check: 1 of 1 speculative rows generated plain's token ids, 0 mismatches"


def test_the_summary_names_prompts_where_plain_decoding_did_not_repeat_itself():
    rows = compare_to_plain([row("a", "plain", 10.0, [1], repeats_agree=False), row("a", "composite", 12.0, [1]),
                             row("b", "plain", 10.0, [2], repeats_agree=True)])
    assert lossless_line(rows).endswith("0 mismatches; plain decoding's repeats DIFFER on a")


def test_bench_prompts_takes_the_first_n():
    assert bench_prompts(1) == bench_prompts()[:1] and len(bench_prompts()) == 4


def test_part_a_on_a_tiny_torch_checkpoint_records_ids_equal_to_plain(tmp_path, checkpoint):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    ckpt.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(checkpoint / f, ckpt / f)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, head_dim=16)
    (ckpt / "config.json").write_text(json.dumps(config))
    shape = LlamaShape.from_config(config)
    save_file({"model." + k: v.contiguous() for k, v in random_weights(shape, torch.bfloat16, "cpu", seed=4).items()},
              str(ckpt / "model.safetensors"))
    assert main(["--engine", "torch", "--device", "cpu", "--checkpoint", str(ckpt), "--skip-server",
                 "--max-tokens", "12", "--repeats", "1", "--prompts", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "speculation_engine.json").read_text())["part_a"]
    assert [r["arm"] for r in rows] == ["plain", "ngram γ=2", "ngram γ=4", "ngram γ=8", "composite"]
    assert all(len(r["ids"]) == r["tokens"] > 0 and r["same_as_plain"] for r in rows)
