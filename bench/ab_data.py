"""Shared set-up of the chat-drafter A/B scripts: a seeded subset of the chat drafter's
cached training labels, its held-out answers (answer positions only), the target's
config and weights, and the draft vocabulary of that subset."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from build_engines.distill_drafter import PRESETS, Sample, answer_mask, assistant_header, label_cache, replace
from build_engines.student import draft_vocabulary

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / ".cache/models/smollm2-135m-instruct"


def chat_ab_data(train_labels: Path | None, samples: int, steps: int, target: Path = TARGET):
    """(preset with `steps`, train samples, held-out samples, target config, target weights, draft vocabulary)."""
    from safetensors.torch import load_file
    p = replace(PRESETS["full"], steps=steps, chat_steps=steps)
    cache = ROOT / ".cache" / "distill"
    files = [train_labels or label_cache(cache, "chat", "train", "full", 0), label_cache(cache, "chat", "heldout", "full", 0)]
    if not all(f.exists() for f in files):
        sys.exit(f"missing {files}: build the chat drafter first (python -m build_engines.distill_drafter --domain chat)")
    train_set, held = ([Sample(**d) for d in torch.load(f)] for f in files)
    random.Random(0).shuffle(train_set)
    header = assistant_header(target)
    held = [replace(s, mask=answer_mask(s, header)) for s in held]
    cfg = json.loads((target / "config.json").read_text())
    weights = {k.removeprefix("model."): v for k, v in load_file(str(target / "model.safetensors")).items()}
    train_set = train_set[:samples]
    vocab = draft_vocabulary(train_set, p.draft_vocab, always=[cfg.get("eos_token_id", 2)])
    return p, train_set, held, cfg, weights, vocab


def parse_ab_args(ap, argv=None):
    """Parse `argv` with the A/B scripts' common options added to `ap`."""
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--target", type=Path, default=TARGET)
    ap.add_argument("--train-labels", type=Path, help="a cached chat label file (default: the full preset's)")
    return ap.parse_args(argv)
