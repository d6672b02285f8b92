"""A stand-in for an engine that owns its loop (TensorRT-LLM's PyTorch backend), on the torch
engine: its own scheduler, greedy verification, commits. Shared by
tests/backend/services/test_external_loop.py (hook: policy.external.IterationDrafter) and the fake
TensorRT-LLM executor in tests/backend/services/trtllm/ (hook: our TensorRT-LLM Drafter), which
overrides `propose` / `on_finish` / `on_cancel`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from policy.external import Generating


@dataclass
class Running:
    """One request inside the stand-in engine."""

    rid: int
    tokens: List[int]  # prompt + committed tokens
    prompt_len: int
    max_new: int
    end_id: Optional[int] = None  # stop after committing this token (None: only max_new stops)
    finish_reason: Optional[str] = None  # "length" | "stop" | "cancelled" once done

    @property
    def generated(self) -> List[int]:
        return self.tokens[self.prompt_len:]

    def as_generating(self) -> Generating:
        return Generating(self.rid, list(self.tokens), self.prompt_len, self.max_new)


def commit_tokens(r, new: Sequence[int]) -> bool:
    """Append the verified tokens `new` to request r (`tokens`, `generated`, `max_new`, `end_id`,
    `finish_reason`) up to its max_new, stopping at its end_id; True when r has finished."""
    for t in new[: r.max_new - len(r.generated)]:
        r.tokens.append(t)
        if t == r.end_id:
            r.finish_reason = "stop"
            break
    if r.finish_reason is None and len(r.generated) >= r.max_new:
        r.finish_reason = "length"
    return r.finish_reason is not None


class OwnLoopEngine:
    """Admits requests into free slots, prefills them, and each iteration asks the hook for
    drafts (`propose`), verifies them greedily with one ragged forward and commits the
    accepted tokens plus one."""

    def __init__(self, engine, hook=None):
        self.engine, self.hook = engine, hook
        self.iterations = self.drafted = self.accepted = 0
        self.waiting: List[Running] = []
        self.running: Dict[int, Running] = {}  # slot -> request
        self.done: Dict[int, Running] = {}  # rid -> finished (or cancelled) request
        self._finished: List[Running] = []  # finished since the hook last ran

    # -- requests --------------------------------------------------------------------------
    def add(self, rid: int, prompt_ids: Sequence[int], max_new: int, end_id: Optional[int] = None) -> Running:
        r = Running(rid, list(prompt_ids), len(prompt_ids), max_new, end_id)
        self.waiting.append(r)
        return r

    def cancel(self, rid: int) -> None:
        """Remove a request mid-generation (the client went away)."""
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                r.finish_reason = "cancelled"
                self.done[rid] = r
        for slot, r in list(self.running.items()):
            if r.rid == rid:
                del self.running[slot]
                self.engine.truncate(slot, 0)
                r.finish_reason = "cancelled"
                self.done[rid] = r
                self.on_cancel(r)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- hook points (the fake TensorRT-LLM executor overrides these) ----------------------------
    def propose(self, running: List[Running], finished: List[Running]) -> Dict[int, List[int]]:
        if self.hook is None:
            return {}
        return self.hook.step([r.as_generating() for r in running], finished=[r.as_generating() for r in finished],
                              kv_free_blocks=10, kv_total_blocks=20)

    def on_finish(self, r: Running) -> None:
        pass

    def on_cancel(self, r: Running) -> None:
        pass

    def close(self) -> None:
        if self.hook is not None:
            self.hook.finish([r.as_generating() for r in self._finished])
        self._finished = []

    # -- one iteration -------------------------------------------------------------------------
    def step(self) -> bool:
        """Admit, propose, verify, commit. False when there is nothing to run."""
        while True:  # (a request can finish at its prefill: admit until something runs)
            for slot in range(self.engine.max_slots):
                if slot not in self.running and self.waiting:
                    r = self.waiting.pop(0)
                    logits = self.engine.forward([slot], [0], [r.tokens], logit_rows=[[len(r.tokens) - 1]])
                    self.running[slot] = r
                    self._commit(slot, [int(logits[0].argmax())])
            if self.running or not self.waiting:
                break
        if not self.running:
            return False
        finished, self._finished = self._finished, []
        drafts = self.propose(list(self.running.values()), finished)
        slots = list(self.running)
        inputs = [[self.running[s].tokens[-1]] + list(drafts.get(self.running[s].rid, [])) for s in slots]
        logits = self.engine.forward(slots, [len(self.running[s].tokens) - 1 for s in slots], inputs)
        argmax, row = logits.argmax(-1).tolist(), 0
        self.iterations += 1
        for s, inp in zip(slots, inputs):
            draft, n = inp[1:], len(inp)
            out = argmax[row: row + n]
            row += n
            k = 0
            while k < len(draft) and draft[k] == out[k]:
                k += 1
            self.drafted += len(draft)
            self.accepted += k
            self._commit(s, out[: k + 1])
        return True

    def _commit(self, slot: int, new: List[int]) -> None:
        r = self.running[slot]
        if commit_tokens(r, new):
            self.done[r.rid] = r
            self._finished.append(r)
            del self.running[slot]
            self.on_finish(r)

    def generate(self, prompts, max_new) -> List[List[int]]:
        """Run every prompt to completion; max_new is one limit or one per prompt."""
        for i, p in enumerate(prompts):
            self.add(i, p, max_new[i] if isinstance(max_new, (list, tuple)) else max_new)
        while self.step():
            pass
        self.close()
        return [self.done[i].generated for i in range(len(prompts))]
