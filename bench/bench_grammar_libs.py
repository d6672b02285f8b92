"""Grammar libraries for structured output, side by side on the served tokenizer (issue 32): the cost
of compiling a guide, of one token mask (compute + apply to a logits row), and whether each
library accepts a valid output token by token and refuses an invalid one, for a JSON schema, a
regex and an EBNF grammar.

llguidance is the project's (requirements.txt). XGrammar (what TensorRT-LLM, vLLM and SGLang use by
default) is measured when importable; it is not a dependency (it pulls in the `triton` GPU
compiler), so install it beside the venv for this script:

    .venv/bin/pip install --target /tmp/xgr --no-deps xgrammar==0.2.8 apache-tvm-ffi pydantic pydantic-core \\
        typing-inspection annotated-types
    PYTHONPATH=/tmp/xgr .venv/bin/python bench/bench_grammar_libs.py
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"street": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "zip"]}},
    "required": ["name", "age", "city", "tags", "address"], "additionalProperties": False}
CASES = {  # (guide, a valid output, an invalid one)
    "json_schema": (json.dumps(SCHEMA), json.dumps({"name": "Ada", "age": 36, "city": "London", "tags": ["math"],
                                                    "address": {"street": "12 St James Square", "zip": "10001"}}),
                    json.dumps({"name": "Ada", "age": 36, "city": "Rome"})),
    "regex": (r"\(\d{3}\) \d{3}-\d{4}", "(202) 555-0143", "202-555-0143"),
    "ebnf": ('root ::= "yes" | "no" | "maybe " [0-9]+', "maybe 42", "perhaps"),
}


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab):
        import llguidance
        import llguidance.hf
        self.llg, self.tok = llguidance, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)

    def compile(self, kind, guide):
        g = {"json_schema": lambda: self.llg.LLMatcher.grammar_from_json_schema(guide),
             "regex": lambda: self.llg.LLMatcher.grammar_from_regex(guide),
             "ebnf": lambda: self.llg.grammar_from("ebnf", guide)}[kind]()
        return self.llg.LLMatcher(self.tok, g, log_level=0)

    def mask(self, m, logits):
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")[: logits.shape[-1]]
        logits.masked_fill_(torch.from_numpy(bits == 0), float("-inf"))

    def accept(self, m, token):
        return m.consume_token(token)


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab):
        import xgrammar
        self.xgr = xgrammar
        self.compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def compile(self, kind, guide):
        g = {"json_schema": lambda: self.compiler.compile_json_schema(guide),
             "regex": lambda: self.compiler.compile_regex(guide),
             "ebnf": lambda: self.compiler.compile_grammar(guide)}[kind]()
        return self.xgr.GrammarMatcher(g)

    def mask(self, m, logits):
        m.fill_next_token_bitmask(self.bitmask)
        self.xgr.apply_token_bitmask_inplace(logits, self.bitmask)

    def accept(self, m, token):
        return m.accept_token(token)


def measure(lib, tokenizer, vocab) -> dict:
    out = {}
    logits = torch.randn(1, vocab)
    for kind, (guide, good, bad) in CASES.items():
        t = time.perf_counter()
        lib.compile(kind, guide)
        compile_ms = (time.perf_counter() - t) * 1e3
        m, masks, ok = lib.compile(kind, guide), [], True
        for token in tokenizer(good, add_special_tokens=False).input_ids:
            row = logits.clone()
            t = time.perf_counter()
            lib.mask(m, row)
            masks.append(time.perf_counter() - t)
            ok = ok and bool(torch.isfinite(row[0, token])) and lib.accept(m, token)
        m, refused = lib.compile(kind, guide), False
        for token in tokenizer(bad, add_special_tokens=False).input_ids:
            if not lib.accept(m, token):
                refused = True
                break
        out[kind] = {"compile_ms": compile_ms, "mask_us_median": statistics.median(masks) * 1e6,
                     "mask_us_max": max(masks) * 1e6, "accepts_valid": ok, "refuses_invalid": refused}
    return out


def main() -> int:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    vocab = len(tokenizer)
    for cls in (Llguidance, Xgrammar):
        try:
            t = time.perf_counter()
            lib = cls(tokenizer, vocab)
            setup = time.perf_counter() - t
        except ImportError as e:
            print(f"{cls.name}: not importable ({e}); see this script's docstring")
            continue
        print(f"{cls.name}: tokenizer set-up {setup * 1e3:.0f} ms")
        for kind, r in measure(lib, tokenizer, vocab).items():
            print(f"  {kind:11s} compile {r['compile_ms']:6.2f} ms  mask+apply median {r['mask_us_median']:6.1f} us "
                  f"(max {r['mask_us_max']:7.1f})  accepts valid {r['accepts_valid']}  refuses invalid "
                  f"{r['refuses_invalid']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
