"""Does reading the target's features help a chat drafter? An A/B at equal training.

    .venv/bin/python bench/ab_feature_drafter.py [--samples 400 --steps 200]   # ~25 min (native bf16)

Both arms are build_engines/feature_student.FeatureStudent (4 layers from the target,
same seed, data, optimiser and steps); arm "token" keeps fc frozen at zero, so it is
the token student and its features are never read; arm "feature" learns fc. Training
samples: a seeded subset of the chat drafter's cached training labels (built by
`python -m build_engines.distill_drafter --domain chat`); the target's features are
computed here. Prints held-out greedy agreement with the target for the first draft
token (true features) and the second (the drafter's own output as the feature).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ab_data import chat_ab_data, parse_ab_args  # bench/ (the script's own folder)
from build_engines.distill_drafter import agreement, feature_batch_loss, replace, train
from build_engines.feature_student import FeatureStudent


def with_features(engine, samples, batch=8):
    """The samples with the target's features of every position (one prefill per batch)."""
    out = []
    for i in range(0, len(samples), batch):
        chunk = samples[i: i + batch]
        _, f = engine.forward(list(range(len(chunk))), [0] * len(chunk), [s.ids.tolist() for s in chunk],
                              logit_rows=[[len(s.ids) - 1] for s in chunk], return_hidden=True)
        row = 0
        for s in chunk:
            out.append(replace(s, feats=f[row: row + len(s.ids)].clone()))
            row += len(s.ids)
        print(f"[ab] features {min(i + batch, len(samples))}/{len(samples)}", flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = parse_ab_args(ap, argv)
    from backend.engines.torch_llama import TorchLlama
    p, train_set, held, cfg, weights, vocab = chat_ab_data(a.train_labels, a.samples, a.steps, a.target)
    engine = TorchLlama(a.target, dtype="bf16", max_slots=8, max_context=512)
    train_set, held = with_features(engine, train_set), with_features(engine, held)
    results = {}
    for arm in ("token", "feature"):
        torch.manual_seed(0)
        student = FeatureStudent(cfg, weights, vocab, layers=p.layers)
        student.fc.requires_grad_(arm == "feature")
        t0 = time.monotonic()
        train(student, train_set, p, 0, a.steps, feature_batch_loss)
        results[arm] = agreement(student, held, feature_batch_loss)
        print(f"[ab] {arm}: held-out agreement first/second draft token "
              f"{results[arm][0]:.3f}/{results[arm][1]:.3f} ({time.monotonic() - t0:.0f} s)", flush=True)
    print(json.dumps({k: [round(x, 4) for x in v] for k, v in results.items()}))


if __name__ == "__main__":
    main()
