"""Which of the target's layers should a chat token student start from? An A/B at equal training.

    .venv/bin/python bench/ab_student_layers.py --train-labels <chat label file> \
        [--arms 0,1,2,3 0,1,2,29 0,1,2,3,4,5] [--samples 400 --steps 200]   # ~6 min per 4-layer arm

Each arm is build_engines/student.StudentLlama (trainable draft head, as builds use)
initialised from the listed target layers in that order, trained with the same seed,
data, optimiser and steps on a seeded subset of the chat drafter's cached labels.
Prints held-out greedy agreement with the target before and after training.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ab_data import chat_ab_data, parse_ab_args  # bench/ (the script's own folder)
from build_engines.distill_drafter import agreement, train
from build_engines.student import LAYER_TENSORS, StudentLlama


def with_layers(weights: dict, source: list) -> dict:
    """The target's weights with layer i replaced by layer source[i] (StudentLlama takes the first layers)."""
    out = dict(weights)
    for i, s in enumerate(source):
        for name in LAYER_TENSORS:
            out[f"layers.{i}.{name}.weight"] = weights[f"layers.{s}.{name}.weight"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=["0,1,2,3", "0,1,2,29", "0,1,2,3,4,5"],
                    help="comma-separated target layer indices per arm")
    a = parse_ab_args(ap, argv)
    p, train_set, held, cfg, weights, vocab = chat_ab_data(a.train_labels, a.samples, a.steps, a.target)
    results = {}
    for arm in a.arms:
        source = [int(x) for x in arm.split(",")]
        torch.manual_seed(0)
        student = StudentLlama(cfg, with_layers(weights, source), len(source), vocab, train_head=p.train_head)
        before = agreement(student, held)[0]
        t0 = time.monotonic()
        train(student, train_set, p, 0, a.steps)
        results[arm] = [before, agreement(student, held)[0]]
        print(f"[ab] layers {arm}: held-out agreement untrained {before:.3f}, trained {results[arm][1]:.3f} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    print(json.dumps({k: [round(x, 4) for x in v] for k, v in results.items()}))


if __name__ == "__main__":
    main()
