"""The peer benchmark's workloads (bench/bench_peer.py), as sessions a closed-loop stream runs:

  chat       distinct chat prompts (ShareGPT first user turns), one request each;
  multiturn  ShareGPT conversations with real follow-ups: each next request is the previous
             prompt + the server's own answer + the next recorded user turn, as chat clients
             resend their history (where a server's KV reuse across requests pays);
  copy       copy-heavy: summarise or rewrite a recorded answer given in the prompt.

All come from the held-out split the drafter builds never train on, in the order
bench/prompts.py's distinct_requests draws them (its chat half is the start of ours), but as many
as there are: distinct_requests stops at 164 pairs, fewer than 32 streams finish in a level. A
session's keys are the same at every load, so its texts can be compared across loads (greedy
identity)."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
DOWNLOADS = ROOT / ".cache" / "downloads"
WORKLOADS = ("chat", "multiturn", "copy")
TURN_CHARS = (20, 600)  # a user turn's length, as drafter_data.sharegpt_turns keeps first turns
MAX_TURNS = 4  # ~4 x (150 + 64) tokens: well inside both servers' 2048 per sequence
DOCUMENT_CHARS = (200, 3000)  # copy-heavy: a recorded answer up to ~750 tokens, + 64 out < 2048


def mostly_ascii(text: str) -> bool:
    """At least 95% ASCII: 2.5+ characters a token, so the char limits above bound the tokens
    (3000 characters of Chinese would be ~3000 tokens, past both servers' context)."""
    return sum(c.isascii() for c in text) >= 0.95 * len(text)


class Session:
    """A conversation a stream runs turn by turn; a one-turn session is a single prompt."""

    def __init__(self, key: str, user_turns: List[str]):
        self.key, self.user_turns, self.history = key, list(user_turns), []

    def next_request(self) -> Optional[Tuple[str, list]]:
        """(request key, chat messages) of the next turn; None when the conversation is over."""
        turn = len(self.history) // 2
        if turn >= len(self.user_turns):
            return None
        key = self.key if len(self.user_turns) == 1 else f"{self.key}#{turn}"
        return key, self.history + [{"role": "user", "content": self.user_turns[turn]}]

    def answered(self, text: str) -> None:
        """The server's answer to the turn just sent: it joins the history the next turn resends."""
        turn = len(self.history) // 2
        self.history += [{"role": "user", "content": self.user_turns[turn]}, {"role": "assistant", "content": text}]


class Feed:
    """The sessions of a load level in a fixed order (the same at every load and for both servers);
    after the last it starts over, counting the repeats (a repeated greedy prompt flatters a server
    that drafts from its own recent outputs, so a run that repeats says so)."""

    def __init__(self, specs: List[Tuple[str, List[str]]]):
        if not specs:
            raise ValueError("no sessions")
        self.specs, self.i, self.repeats = specs, 0, 0

    def next(self) -> Session:
        if self.i >= len(self.specs):
            self.repeats += 1
        key, turns = self.specs[self.i % len(self.specs)]
        self.i += 1
        return Session(key, turns)


def conversations(records: Iterable[dict], limit: int, max_turns: int = MAX_TURNS,
                  keep=lambda key: True) -> List[Tuple[str, List[str]]]:
    """(key, user turns) of ShareGPT records with at least two user turns, each of TURN_CHARS:
    the leading run of such turns, at most max_turns; `keep(key)` picks the split."""
    out = []
    for i, rec in enumerate(records):
        key = str(rec.get("id", i))
        if not keep(key):
            continue
        turns = []
        for t in rec.get("conversations") or []:
            if t.get("from") != "human":
                continue
            text = (t.get("value") or "").strip()
            if not TURN_CHARS[0] <= len(text) <= TURN_CHARS[1] or not mostly_ascii(text) or len(turns) == max_turns:
                break
            turns.append(text)
        if len(turns) >= 2:
            out.append((f"multiturn/{key}", turns))
            if len(out) == limit:
                break
    return out


def sharegpt_records(download_dir: Path = DOWNLOADS) -> Iterator[dict]:
    """The ShareGPT V3 records of the wheel the set-up downloads (drafter_data reads them)."""
    from build_engines.drafter_data import sharegpt_records as records
    return records(download_dir)


def sessions(workload: str, n: int, seed: int = 0) -> List[Tuple[str, List[str]]]:
    """(key, user turns) of up to `n` sessions of a workload (fewer where the split has fewer)."""
    from build_engines.drafter_data import held_out, sharegpt_turns
    if workload == "multiturn":
        return conversations(sharegpt_records(), n, keep=lambda key: held_out(key, seed, 0.05))
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    turns = [t for t in sharegpt_turns(DOWNLOADS) if held_out(t[0], seed, 0.05)]
    random.Random(seed).shuffle(turns)  # as distinct_requests
    if workload == "chat":
        return [(f"chat/{key}", [question]) for key, question, _ in turns][:n]
    docs = [(key, a) for key, _, a in turns if DOCUMENT_CHARS[0] <= len(a) <= DOCUMENT_CHARS[1] and mostly_ascii(a)][:n]
    return [(f"copy/{key}", [f"Summarise the following text in a few sentences, reusing its wording.\n\n{a}" if i % 2
                             else f"Rewrite the following text, fixing any mistakes. Keep everything else.\n\n{a}"])
            for i, (key, a) in enumerate(docs)]
