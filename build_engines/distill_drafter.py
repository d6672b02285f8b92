"""Build a domain-specialised model drafter by distillation from the target, on the CPU.

    python -m build_engines.distill_drafter --domain code            # ~20-27 min (native bf16), ~55 (AVX2)
    python -m build_engines.distill_drafter --domain chat --preset quick   # CI: ~1-2 min
    python -m build_engines.distill_drafter --domain chat --kind feature   # EAGLE-style (feature_student.py)

Steps (each prints progress):
  1. label: the target (bf16 engine) labels domain text with its top-k next-token
     distributions (see build_engines/drafter_data.py); train and held-out splits are
     cached under .cache/distill/ so rebuilding or benchmarking does not relabel;
  2. train: a student with the target's first `layers` decoder layers, its frozen
     embedding and a draft head initialised from the target's tied rows, trained
     with AdamW on the soft labels (bf16 autocast where the CPU has native bf16, else
     fp32: emulated bf16 trains ~25x slower; fixed number of steps, everything seeded:
     the same seed on the same kind of CPU gives the same drafter);
  3. evaluate greedy next-token agreement with the target on held-out text;
  4. write <out>/<name>/ (config.json, model.safetensors, tokenizer, manifest.json).
     The directory is versioned by `ARTIFACT_VERSION` and the preset; a build whose
     manifest matches the request is not redone (pass --force to rebuild).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import List

import torch

from .drafter_data import DOMAINS, Sample, answer_mask, assistant_header_ids, build_labels
from .feature_student import FeatureStudent, feature_losses
from .student import StudentLlama, draft_vocabulary, soft_label_loss

ARTIFACT_VERSION = 2  # of the drafter directory layout (2: draft-vocabulary head)
LABEL_VERSION = 2  # of the cached labels (.cache/distill); 2: chat answers only
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Preset:
    layers: int  # decoder layers of the student (copied from the target's first layers)
    train_samples: int  # code windows to label for training
    code_answers: int  # code: requests the target answers (its own code), for training
    chat_prompts: int  # chat prompts the target answers for training
    chat_forced: int  # chat: recorded answers labelled teacher-forced, for training
    heldout_samples: int
    window: int  # code window tokens; chat: max prompt tokens
    max_new: int  # chat: tokens of each target answer
    steps: int
    chat_steps: int  # chat samples are longer: fewer steps keep the build under 30 minutes
    batch: int  # samples per optimiser step
    lr: float
    draft_vocab: int = 16384  # tokens the draft head can propose (most-predicted by the target)
    top_k: int = 16  # soft-label support kept per position
    train_head: bool = True  # the draft head learns too (+2 points of agreement for +5% time, measured)
    length_pool: int = 16  # batches drawn from a pool of this many sorted by length (chat: padding 28% -> 3% of tokens)
    feature_layers: int = 4  # --kind feature: decoder layers of the feature drafter
    feature_steps: int = 400  # --kind feature: optimiser steps (each trains two passes: ~2.5x a token step)


PRESETS = {
    "full": Preset(layers=4, train_samples=2000, code_answers=480, chat_prompts=640, chat_forced=1000, heldout_samples=64,
                   window=192, max_new=96, steps=1200, chat_steps=900, batch=8, lr=6e-4),
    "quick": Preset(layers=1, train_samples=48, code_answers=8, chat_prompts=32, chat_forced=16, heldout_samples=8, window=96,
                    max_new=32, steps=40, chat_steps=40, batch=4, lr=1e-3, feature_layers=1, feature_steps=12),
}


def hyperparameters(p: Preset, domain: str) -> dict:
    """The preset's fields that shape this domain's drafter (the manifest records these)."""
    unused = (("chat_prompts", "chat_forced", "chat_steps") if domain == "code"
              else ("train_samples", "code_answers", "steps"))
    unused += ("feature_layers", "feature_steps")  # a feature build copies them into layers/steps
    return {k: v for k, v in asdict(p).items() if k not in unused}


def log(msg: str) -> None:
    print(f"[distill] {msg}", flush=True)


def progress_printer(what: str):
    t0, last = time.monotonic(), [0.0]

    def show(i: int, n: int) -> None:
        now = time.monotonic()
        if i == n or now - last[0] > 10:
            last[0] = now
            el = now - t0
            eta = el / max(i, 1) * (n - i)
            log(f"{what}: {i}/{n} ({el:.0f}s elapsed, ~{eta:.0f}s left)")
    return show


def load_target(ckpt: Path, max_slots: int, max_context: int):
    from backend.engines.torch_llama import TorchLlama
    return TorchLlama(ckpt, dtype="bf16", max_slots=max_slots, max_context=max_context,
                      batch_invariant=False)  # labels only: the faster kernels


def train_precision():
    """bf16 autocast where the CPU multiplies bf16 natively; fp32 elsewhere (AVX2 only: a
    4-layer student's step took 15 s under emulated-bf16 autocast, 0.6 s in fp32)."""
    from backend.engines.torch_llama import native_bf16
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())


def sample_count(p: Preset, domain: str, split: str) -> int:
    """Splits: train / heldout (code: stdlib windows; chat: answers), and for code also
    train-answers / heldout-answers (the target's answers to requests for code)."""
    if split.startswith("heldout"):
        return p.heldout_samples
    if split == "train-answers":
        return p.code_answers
    return p.train_samples if domain == "code" else p.chat_prompts


def label_cache(cache: Path, domain: str, split: str, preset: str, seed: int, features: bool = False) -> Path:
    p = PRESETS[preset]
    n = sample_count(p, domain, split)
    answers = domain == "chat" or split.endswith("answers")
    gen = f"-g{p.max_new}" + (f"-t{p.chat_forced}" if domain == "chat" and split == "train" else "") if answers else ""
    return cache / f"{domain}-{split}-{preset}-n{n}-w{p.window}{gen}-s{seed}{'-f' if features else ''}-v{LABEL_VERSION}.pt"


def assistant_header(target_ckpt: Path) -> list:
    """Token ids the chat template puts before an answer ("<|im_start|>assistant\n" here)."""
    from transformers import AutoTokenizer
    return assistant_header_ids(AutoTokenizer.from_pretrained(str(target_ckpt)))


def labels(domain: str, split: str, p: Preset, seed: int, target_ckpt: Path, cache: Path, preset: str,
           features: bool = False) -> List[Sample]:
    """Labelled samples of a split (with the target's features if asked), from the cache or made now."""
    n = sample_count(p, domain, split)
    f = label_cache(cache, domain, split, preset, seed, features)
    if f.exists():
        return [Sample(**d) for d in torch.load(f)]
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(target_ckpt))
    decodes = domain == "chat" or split.endswith("answers")
    batch = 32 if decodes else 8  # decoding answers: a wide batch amortises the weights
    ctx = p.window + p.max_new + 8
    teacher = load_target(target_ckpt, max_slots=batch, max_context=ctx)
    forced = p.chat_forced if domain == "chat" and split == "train" else 0
    log(f"labelling {n} {domain} samples ({split}){f' + {forced} teacher-forced answers' if forced else ''} with the target")
    t0 = time.monotonic()
    samples = build_labels(domain, teacher, tok, split=split, n=n, seed=seed, k=p.top_k, batch=batch,
                           window=p.window, max_new=p.max_new, download_dir=ROOT / ".cache" / "downloads",
                           teacher_forced=forced, features=features,
                           progress=progress_printer(f"label {domain}/{split}"))
    log(f"labelled {sum(int(s.mask.sum()) for s in samples)} positions in {time.monotonic() - t0:.0f}s")
    cache.mkdir(parents=True, exist_ok=True)
    torch.save([asdict(s) for s in samples], f)
    return samples


def collate(batch: List[Sample]):
    L = max(len(s.ids) for s in batch)
    k = batch[0].top_ids.shape[1]
    ids = torch.zeros(len(batch), L, dtype=torch.long)
    mask = torch.zeros(len(batch), L, dtype=torch.bool)
    top_ids = torch.zeros(len(batch), L, k, dtype=torch.long)
    top_p = torch.zeros(len(batch), L, k)
    for b, s in enumerate(batch):  # right padding: causal attention keeps real positions unaffected
        n = len(s.ids)
        ids[b, :n], mask[b, :n], top_ids[b, :n], top_p[b, :n] = s.ids, s.mask, s.top_ids, s.top_p
    return ids, mask, top_ids, top_p


def collate_features(batch: List[Sample]) -> torch.Tensor:
    """The samples' target features, right-padded with zeros: [B, L, H]."""
    L = max(len(s.ids) for s in batch)
    feats = torch.zeros(len(batch), L, batch[0].feats.shape[1])
    for b, s in enumerate(batch):
        feats[b, : len(s.ids)] = s.feats.float()
    return feats


def token_batch_loss(student: StudentLlama, batch: List[Sample]):
    """(loss, [agreeing positions], labelled positions) of a token student on a batch."""
    ids, mask, top_ids, top_p = collate(batch)
    loss, a = soft_label_loss(student, student.hidden_states(ids), mask, top_ids, top_p)
    return loss, [a], int(mask.sum())


def feature_batch_loss(student: FeatureStudent, batch: List[Sample]):
    """(loss, [agreeing positions with true features, with its own], labelled positions)."""
    ids, mask, top_ids, top_p = collate(batch)
    return feature_losses(student, ids, collate_features(batch), mask, top_ids, top_p)


def _summed(total, counts):
    """Element-wise running sum of per-batch agreement counts (None: nothing yet)."""
    return counts if total is None else [x + y for x, y in zip(total, counts)]


@torch.no_grad()
def agreement(student, samples: List[Sample], batch_loss=token_batch_loss, batch: int = 8) -> List[float]:
    """Fraction of labelled positions where the student's greedy token equals the target's
    (a feature student: [first draft token, second draft token])."""
    agree, total = None, 0
    for i in range(0, len(samples), batch):
        with train_precision():
            _, a, n = batch_loss(student, samples[i: i + batch])
        agree, total = _summed(agree, a), total + n
    return [x / max(1, total) for x in agree]


def epoch_batches(lengths: List[int], batch: int, pool: int, rng: random.Random) -> List[List[int]]:
    """One epoch of batches over every sample once: shuffled, then each run of `pool`
    batches sorted by length before it is cut, so a batch pads to similar lengths
    (padding is computed and back-propagated for nothing), and the batches shuffled."""
    order = rng.sample(range(len(lengths)), len(lengths))
    size = batch * max(1, pool)
    batches = []
    for i in range(0, len(order), size):
        chunk = sorted(order[i: i + size], key=lambda j: lengths[j])
        batches += [chunk[j: j + batch] for j in range(0, len(chunk), batch)]
    rng.shuffle(batches)
    return batches


def train(student, data: List[Sample], p: Preset, seed: int, steps: int, batch_loss=token_batch_loss) -> List[float]:
    rng = random.Random(seed)
    opt = torch.optim.AdamW([q for q in student.parameters() if q.requires_grad], lr=p.lr, weight_decay=0.0,
                            betas=(0.9, 0.98))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    order: List[List[int]] = []
    lengths = [len(s.ids) for s in data]
    losses, agree, seen = [], None, 0
    show = progress_printer("train")
    for step in range(steps):
        if not order:
            order = epoch_batches(lengths, p.batch, p.length_pool, rng)
        with train_precision():
            loss, a, n = batch_loss(student, [data[i] for i in order.pop()])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        agree, seen = _summed(agree, a), seen + n
        if (step + 1) % 25 == 0 or step + 1 == steps:
            log(f"step {step + 1}/{steps} loss {sum(losses[-25:]) / len(losses[-25:]):.3f} "
                f"train agreement {'/'.join(f'{x / max(1, seen):.3f}' for x in agree)}")
            agree, seen = None, 0
        show(step + 1, steps)
    return losses


def artifact_name(domain: str, kind: str, preset: str) -> str:
    """<domain>[-feature]-drafter[-<preset>]: the server's drafter "<domain>[-feature]" finds it."""
    base = f"{domain}-drafter" if kind == "token" else f"{domain}-{kind}-drafter"
    return base if preset == "full" else f"{base}-{preset}"


def build(domain: str, preset: str, seed: int, target_ckpt: Path, out_root: Path, force: bool = False,
          kind: str = "token") -> Path:
    p = PRESETS[preset]
    if kind == "feature":
        p = replace(p, layers=p.feature_layers, steps=p.feature_steps, chat_steps=p.feature_steps)
    name = artifact_name(domain, kind, preset)
    out = out_root / name
    want = {"artifact_version": ARTIFACT_VERSION, "domain": domain, "preset": preset, "seed": seed,
            "hyperparameters": hyperparameters(p, domain)}
    if kind != "token":  # token manifests predate kinds: built ones stay up to date
        want["kind"] = kind
    mf = out / "manifest.json"
    if mf.exists() and not force:
        have = json.loads(mf.read_text())
        if all(have.get(k) == v for k, v in want.items()):
            log(f"{out} is up to date (manifest matches); --force rebuilds")
            return out
    t0 = time.monotonic()
    torch.manual_seed(seed)
    cache = ROOT / ".cache" / "distill"
    features = kind == "feature"
    train_set = labels(domain, "train", p, seed, target_ckpt, cache, preset, features)
    held = labels(domain, "heldout", p, seed, target_ckpt, cache, preset, features)
    held_answers = []  # code: also where serving drafts, the target's own code
    if domain == "code" and p.code_answers:
        train_set = train_set + labels(domain, "train-answers", p, seed, target_ckpt, cache, preset, features)
        held_answers = labels(domain, "heldout-answers", p, seed, target_ckpt, cache, preset, features)
    if domain == "chat":  # agreement where drafting happens: the answers
        header = assistant_header(target_ckpt)
        held = [replace(s, mask=answer_mask(s, header)) for s in held]
    t_label = time.monotonic() - t0

    from safetensors.torch import load_file
    cfg = json.loads((target_ckpt / "config.json").read_text())
    target_w = {k.removeprefix("model."): v for k, v in load_file(str(target_ckpt / "model.safetensors")).items()}
    vocab = draft_vocabulary(train_set, p.draft_vocab, always=[cfg.get("eos_token_id", 2)])
    coverage = sum(int(torch.isin(s.top_ids[s.mask, 0], vocab).sum()) for s in held) / max(
        1, sum(int(s.mask.sum()) for s in held))
    log(f"draft vocabulary: {len(vocab)} tokens, covering {coverage:.3f} of the target's held-out top-1")
    if features:
        student, batch_loss = FeatureStudent(cfg, target_w, vocab, layers=p.layers), feature_batch_loss
    else:
        student, batch_loss = StudentLlama(cfg, target_w, p.layers, vocab, train_head=p.train_head), token_batch_loss
    del target_w
    before = agreement(student, held, batch_loss)[0]
    log(f"held-out agreement before training (target's first {p.layers} layers): {before:.3f}")
    losses = train(student, train_set, p, seed, p.chat_steps if domain == "chat" else p.steps, batch_loss)
    after, *more = agreement(student, held, batch_loss)
    extra = {}
    if more:  # a feature drafter's second draft token reads its own output, not the target's feature
        extra["heldout_agreement_second_token"] = round(more[0], 4)
    log(f"held-out agreement after training: {after:.3f}"
        + (f" (second draft token: {more[0]:.3f})" if more else ""))
    if held_answers:
        extra["heldout_agreement_answers"] = round(agreement(student, held_answers, batch_loss)[0], 4)
        log(f"held-out agreement on the target's own code answers: {extra['heldout_agreement_answers']:.3f}")

    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    sizes = student.save(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (target_ckpt / f).exists():
            shutil.copy(target_ckpt / f, tmp / f)
    manifest = dict(want, name=name, target=str(target_ckpt.name),
                    target_manifest=json.loads((target_ckpt / "manifest.json").read_text()).get("weights_sha256")
                    if (target_ckpt / "manifest.json").exists() else None,
                    train_positions=sum(int(s.mask.sum()) for s in train_set),
                    heldout_positions=sum(int(s.mask.sum()) for s in held),
                    heldout_agreement=round(after, 4), heldout_agreement_untrained=round(before, 4), **extra,
                    draft_vocab_size=len(vocab), draft_vocab_heldout_coverage=round(coverage, 4),
                    final_loss=round(sum(losses[-25:]) / len(losses[-25:]), 4),
                    label_seconds=round(t_label), build_seconds=round(time.monotonic() - t0),
                    weight_bytes=sizes["layer_bytes"], file_bytes=sizes["total_bytes"],
                    built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"wrote {out} in {time.monotonic() - t0:.0f}s (held-out agreement {after:.3f})")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", choices=DOMAINS, action="append", help="repeatable; default: all domains")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--kind", choices=("token", "feature"), default="token",
                    help="token: a small Llama reading tokens; feature: also reads the target's features (EAGLE-style)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=Path, default=ROOT / ".cache/models/smollm2-135m-instruct")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache/drafters")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = all cores")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    for d in a.domain or DOMAINS:
        build(d, a.preset, a.seed, a.target, a.out, a.force, a.kind)


if __name__ == "__main__":
    main()
