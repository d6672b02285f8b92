"""Structured output: decoding constrained by a grammar (JSON, JSON Schema, regex, EBNF), with
llguidance's token masks.

Guide types are TensorRT-LLM's (`guided_decoding_guide_type`): `json` (any JSON object or array,
its guide unused), `json_schema`, `regex`, `ebnf_grammar` (GBNF, as llama.cpp and XGrammar write
it; Lark is accepted too). OpenAI's `response_format` maps onto them (json_object ->
json_schema {"type": "object"}).

Why llguidance (`bench/bench_grammar_libs.py`, 2026-11-26, this project's 2-core AVX-512 EPYC,
SmolLM2's 49,152-token vocabulary; docs/results.md): both it (1.9.1) and XGrammar (0.2.8) accept a
valid JSON-schema, regex and EBNF output token by token and refuse an invalid one, and compile a
guide in 0.5-3.6 ms; a token mask computed and applied to a logits row takes a median 36-48 us with
llguidance against 155 us with XGrammar's CPU path. llguidance has no dependencies, where
XGrammar pulls in the `triton` GPU compiler and apache-tvm-ffi; and it reports the tokens the
grammar forces (`compute_ff_tokens`), which the grammar drafter proposes
(backend/drafters/grammar.py). It is MIT-licensed; TensorRT-LLM, vLLM and llama.cpp each offer it
as a backend.

JSON is generated in one layout, `json.dumps`'s (", " and ": ", no other whitespace): with
flexible whitespace a small model can emit newlines without end, and fixed separators make the
keys and punctuation forced, so the grammar drafter can propose them.

Lossless with speculation: the constrained target is the reference. Row j of a verified step is
masked with the grammar's state after the committed tokens and drafts d_1..d_j, exactly the
mask plain decoding would apply there; drafts that leave the grammar are cut before the forward
(`GuideState.valid_prefix`, called by the speculator for every drafter).
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

log = logging.getLogger("specserve.guided")

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON = {"anyOf": [{"type": "object"}, {"type": "array"}]}  # TensorRT-LLM's `json`: XGrammar's builtin
NEG_INF = float("-inf")


class GuideError(ValueError):
    """A guide the library cannot compile (the client's mistake)."""


@dataclass(frozen=True)
class Guide:
    """What a request asks its output to match: a guide type and its text."""

    type: str
    text: str = ""

    def problem(self) -> Optional[str]:
        if self.type not in GUIDE_TYPES:
            return (f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, got {self.type!r}")
        if self.type != "json" and not self.text.strip():
            return f"guided_decoding_guide is required for guided_decoding_guide_type {self.type!r}"
        return None


def grammar_of(guide: Guide) -> str:
    """The llguidance grammar for a guide (GuideError if its text is not even parseable)."""
    import llguidance

    if guide.type in ("json", "json_schema"):
        try:
            schema = ANY_JSON if guide.type == "json" else json.loads(guide.text)
        except json.JSONDecodeError as e:
            raise GuideError(f"guided_decoding_guide is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise GuideError("guided_decoding_guide must be a JSON Schema (an object)")
        return llguidance.LLMatcher.grammar_from_json_schema(schema if isinstance(schema, dict) else {},
                                                            overrides=JSON_LAYOUT)
    if guide.type == "regex":
        return llguidance.LLMatcher.grammar_from_regex(guide.text)
    try:
        return llguidance.grammar_from("ebnf", guide.text)  # GBNF is converted to Lark; Lark passes
    except Exception as e:  # the converter's own parse errors
        raise GuideError(f"guided_decoding_guide is not a valid EBNF grammar: {e}") from None


def guide_problem(guide: Guide) -> Optional[str]:
    """What is wrong with a guide, checked without a tokenizer (the OpenAI layer refuses it
    before it reaches the engine), or None."""
    import llguidance

    problem = guide.problem()
    if problem:
        return problem
    try:
        message = llguidance.LLMatcher.validate_grammar(grammar_of(guide))
    except GuideError as e:
        return str(e)
    return f"the {guide.type} cannot be compiled: {message.strip()}" if message else None


class GuideCompiler:
    """Compiles guides against one tokenizer (llguidance's view of it is built once, ~0.3 s, on
    the first guided request)."""

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer, self.vocab = tokenizer, vocab
        self._ll = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab)
            return self._ll

    def compile(self, guide: Guide, prompt_len: int, eos_ids) -> "GuideState":
        """A fresh state at the start of the output; GuideError naming what is wrong."""
        import llguidance

        problem = guide.problem()
        if problem:
            raise GuideError(problem)
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar_of(guide), log_level=0)
        if matcher.is_error():
            raise GuideError(f"guided_decoding_guide ({guide.type}) cannot be compiled: "
                             f"{matcher.get_error().strip()}")
        return GuideState(matcher, prompt_len, eos_ids, self.ll_tokenizer.eos_token, self.vocab, self.tokenizer)


class GuideState:
    """One sequence's grammar state. It follows the committed tokens lazily (`sync`: every caller
    passes the sequence's committed tokens) and answers for drafts on a copy of itself.

    Never `rollback`: in llguidance 1.9.1, tokens consumed after a rollback that no mask computation
    followed can leave a wrong state (a JSON key's closing `",` allowed where `":` must come:
    found by test_guided's lossless suite under AdaSpec), and a copy costs under a microsecond."""

    def __init__(self, matcher, prompt_len: int, eos_ids, grammar_eos: int, vocab: int, tokenizer=None):
        self.matcher, self.prompt_len, self.vocab, self.tokenizer = matcher, prompt_len, vocab, tokenizer
        self.eos_ids = sorted(int(t) for t in eos_ids if 0 <= int(t) < vocab)
        self.grammar_eos = grammar_eos
        self.consumed = 0  # output tokens the matcher has consumed
        self._last = None  # (key, masks) of the latest `allowed`: the loop asks before the forward, the processor after

    def sync(self, tokens: Sequence[int]) -> None:
        """Consume the output tokens committed since the last call (tokens: prompt + output)."""
        new = list(tokens[self.prompt_len + self.consumed:])
        if new and not self.matcher.is_stopped():  # past the grammar's end only end tokens come (end_id -1)
            if not self.matcher.consume_tokens(new):  # only masked sampling commits tokens: a bug if hit
                log.error("grammar refused committed tokens %s: %s", new, self.matcher.get_error())
            self.consumed += len(new)

    def valid_prefix(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """How many leading draft tokens the grammar allows after the committed `tokens`."""
        self.sync(tokens)
        return self.matcher.validate_tokens([int(t) for t in draft]) if draft else 0

    def forced(self, tokens: Sequence[int], limit: int) -> List[int]:
        """Up to `limit` tokens the grammar forces after `tokens`: its fast-forward tokens, else the
        forced bytes' tokenization but its last token, again while it forces."""
        self.sync(tokens)
        probe, out = self.matcher.deep_copy(), []
        while len(out) < limit and not probe.is_stopped():
            step = list(probe.compute_ff_tokens())
            if not step and self.tokenizer is not None:
                forced = probe.compute_ff_bytes()
                text = forced.decode("utf-8", errors="ignore") if forced else ""
                step = list(self.tokenizer(text, add_special_tokens=False).input_ids)[:-1] if text else []
                # (the last token may merge with what follows)
            step = step[: min(limit - len(out), probe.validate_tokens(step) if step else 0)]
            if not step or not probe.consume_tokens(step):
                break
            out.extend(step)
        return out

    def allowed(self, tokens: Sequence[int], drafts: Sequence[int], rows: int) -> torch.Tensor:
        """[rows, vocab] bool: row j allows what the grammar allows after tokens + drafts[:j]. The
        grammar's end of text allows every one of the sequence's end tokens. Rows after a draft
        the grammar refuses repeat the last row (verification rejects that draft)."""
        drafts = [int(d) for d in drafts[: rows - 1]]
        key = (len(tokens), tuple(drafts), rows)  # the committed tokens only grow: their count names them
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        self.sync(tokens)
        valid = self.matcher.validate_tokens(drafts) if drafts else 0  # consuming a refused token is final
        masks = [self._mask(self.matcher)]
        probe = self.matcher.deep_copy() if valid else None
        for d in drafts[:valid]:
            probe.consume_token(d)
            masks.append(self._mask(probe))
        masks.extend(masks[-1:] * (rows - len(masks)))
        out = torch.from_numpy(np.stack(masks))
        self._last = (key, out)
        return out

    def forced_rows(self, tokens: Sequence[int], drafts: Sequence[int]) -> List[bool]:
        """Per draft token: whether the grammar allows nothing else at its row. The constrained
        target emits such a token whatever that row's logits are (greedy or sampled: all its
        probability is on it), so the loop does not compute them (backend/loop/forced_rows.py)."""
        masks = self.allowed(tokens, drafts, len(drafts) + 1)
        return [bool(masks[j, d]) and int(masks[j].sum()) == 1 for j, d in enumerate(int(t) for t in drafts)]

    def _mask(self, matcher) -> np.ndarray:
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = bits[: self.vocab].astype(bool)
        if 0 <= self.grammar_eos < self.vocab and mask[self.grammar_eos]:
            mask[self.grammar_eos] = False
            mask[self.eos_ids] = True
        if not mask.any():  # a matcher in error, or a grammar that ended where no end token may be
            if matcher.is_error():  # (end_id -1): end with what ends, never sample from nothing
                log.error("grammar allows no token (%s); ending the sequence", matcher.get_error())
            mask[self.eos_ids or [self.grammar_eos]] = True
        return mask


class GuidedProcessor:
    """A sequence's logits processor with a grammar: its penalties' processor (or None), then the
    grammar's mask. Where the two leave a row nothing (min_length forbids the end the grammar
    demands), the grammar wins."""

    def __init__(self, state: GuideState, penalties=None):
        self.state, self.penalties = state, penalties

    def __call__(self, logits: torch.Tensor, context: Sequence[int], drafts: Sequence[int] = (),
                 generated: int = 0) -> torch.Tensor:
        n = logits.shape[0]
        x = self.penalties(logits, context, drafts, generated) if self.penalties is not None else logits.float().clone()
        allowed = self.state.allowed(context, drafts[: n - 1], n)
        x = x.masked_fill(~allowed, NEG_INF)
        dead = torch.isneginf(x).all(dim=-1)
        if bool(dead.any()):
            x[dead] = logits[dead].float().masked_fill(~allowed[dead], NEG_INF)
        return x
