"""Structured output on TensorRT-LLM. NOT YET RUN ON A GPU.

TensorRT-LLM 1.2's PyTorch backend masks every verified row itself (`GuidedDecoder`, with a
user drafter too: `SpeculativeDecodingMode.support_guided_decoder` is true for
USER_PROVIDED) when the LLM has a `guided_decoding_backend` and a request's SamplingParams
carry `guided_decoding`: row 0 with the grammar after the committed tokens, row i after the
drafts before it, and no mask after a draft the grammar refuses (verification rejects that
draft). Lossless whatever we draft. Two parts here:

* `guided_decoding_fields`: a request's guide as `GuidedDecodingParams` fields that give the
  same language as on the CPU engines (backend/generation/guided.py) with TensorRT-LLM's
  llguidance backend: JSON in json.dumps's layout (llguidance reads it from the schema's
  `x-guidance`, where TensorRT-LLM passes only the schema), a regex as it is, and a GBNF
  grammar converted to Lark (what 1.2's llguidance matcher reads for EBNF_GRAMMAR). Its
  xgrammar backend is not served: it would generate JSON in another layout than our grammar
  states follow.
* `RequestGuides`: the drafter hook's view of each guided request's grammar (our GuideState,
  followed from the committed tokens), so that drafts are cut where they leave the grammar
  before TensorRT-LLM verifies them (1.2 verifies the padded static length anyway, so the cut
  saves no GPU work there; it keeps the policy's view of draft lengths and acceptance true) and
  the grammar drafter proposes the tokens the grammar forces.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, Optional, Sequence

from ...generation import hf_tokenizer
from ...generation.guided import ANY_JSON, JSON_LAYOUT, Guide, GuideCompiler, GuideState

log = logging.getLogger("specserve.trtllm")

BACKEND = "llguidance"  # TensorRT-LLM's guided_decoding_backend we serve with (llm_config.py)
# TensorRT-LLM's GuideType (bindings executor GuidedDecodingParams) -> our guide type
GUIDE_TYPE_NAMES = {"JSON": "json", "JSON_SCHEMA": "json_schema", "REGEX": "regex", "EBNF_GRAMMAR": "ebnf_grammar"}


def guided_decoding_fields(guide: Guide) -> dict:
    """`tensorrt_llm.sampling_params.GuidedDecodingParams(**fields)` for `guide` (a checked one:
    guide_problem found nothing), for TensorRT-LLM's llguidance backend."""
    if guide.type in ("json", "json_schema"):
        schema = ANY_JSON if guide.type == "json" else json.loads(guide.text)
        schema = dict(schema) if isinstance(schema, dict) else {}  # `true`: any JSON value
        # grammar_of's overrides win over the schema's own x-guidance; so they do here
        schema["x-guidance"] = {**(schema.get("x-guidance") or {}), **JSON_LAYOUT}
        return {"json": json.dumps(schema)}
    if guide.type == "regex":
        return {"regex": guide.text}
    import llguidance

    return {"grammar": llguidance.grammar_from("ebnf", guide.text)}  # GBNF -> Lark; Lark stays as it is


def guide_of(params) -> Optional[Guide]:
    """Our Guide for a request's TensorRT-LLM guided-decoding parameters (`guide_type`, `guide`),
    or None for a type we do not follow (a structural tag)."""
    kind = GUIDE_TYPE_NAMES.get(params.guide_type.name)
    return None if kind is None else Guide(kind, params.guide or "")


class RequestGuides:
    """Grammar states of the guided requests TensorRT-LLM schedules, by executor request id: the
    speculator's `trim` and the grammar drafter's `guides`. A state is made when its request is
    first seen generating and follows its committed tokens from there (GuideState.sync); one not
    scheduled in an iteration is dropped and made again, from all its tokens, when it returns."""

    def __init__(self, checkpoint: Path):
        self.checkpoint = Path(checkpoint)  # its tokenizer is loaded at the first guided request
        self._compiler: Optional[GuideCompiler] = None
        self.states: Dict[int, GuideState] = {}
        self._unfollowed: set = set()  # scheduled guided requests we could not follow (drafts not cut)

    @property
    def compiler(self) -> GuideCompiler:
        if self._compiler is None:
            tok = hf_tokenizer.load(self.checkpoint)
            vocab = json.loads((self.checkpoint / "config.json").read_text()).get("vocab_size") or len(tok)
            self._compiler = GuideCompiler(tok, int(vocab))  # the model's vocabulary: the logits' width
        return self._compiler

    def follow(self, requests) -> None:
        """Keep the states of `requests` (this iteration's generation requests), make missing ones."""
        now = {int(r.py_request_id) for r in requests}
        for rid in [rid for rid in self.states if rid not in now]:
            del self.states[rid]
        self._unfollowed &= now
        for r in requests:
            rid = int(r.py_request_id)
            params = getattr(r, "guided_decoding_params", None)
            if params is None or rid in self.states or rid in self._unfollowed:
                continue
            guide = guide_of(params)
            try:
                if guide is None:
                    raise ValueError(f"guide type {params.guide_type} is not followed here")
                # the grammar dict (self.states) is shared with the grammar drafter: same object
                self.states[rid] = self.compiler.compile(guide, int(r.py_orig_prompt_len), {int(r.py_end_id)})
            except Exception as e:  # TensorRT-LLM still masks it; we only neither cut nor propose
                log.warning("request %d: its grammar is not followed by the drafter hook (%s)", rid, e)
                self._unfollowed.add(rid)

    def trim(self, seq_id: int, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """The speculator's trim: how much of a draft the request's grammar allows."""
        state = self.states.get(seq_id)
        return len(draft) if state is None else state.valid_prefix(tokens, draft)

    def __getstate__(self):  # to TensorRT-LLM's worker process (before any request: `states` is empty
        return dict(self.__dict__, _compiler=None)  # and stays shared with the grammar drafter's)


def bind(drafter, guides: RequestGuides) -> None:
    """Give the drafter hook, its speculator's trim and the drafters that want them the grammars."""
    drafter.guides = guides
    spec = drafter.iteration_drafter.spec
    spec.trim = guides.trim
    for d in spec.drafters.values():
        if getattr(d, "wants_guides", False):
            d.guides = guides.states
