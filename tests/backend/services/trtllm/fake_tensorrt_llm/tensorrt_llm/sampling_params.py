"""tensorrt_llm/sampling_params.py: SamplingParams (only the fields the adapter sets, plus defaults)
and GuidedDecodingParams; `executor_guide` is what the LLM API hands the executor for it
(SamplingParams._get_guided_decoding_params upstream: one bindings GuidedDecodingParams)."""
from __future__ import annotations

import enum
import json as _json
from dataclasses import dataclass
from typing import List, Optional, Union

from . import _fake


@dataclass(kw_only=True)
class GuidedDecodingParams:
    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None


@dataclass(kw_only=True)
class SamplingParams:
    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    stop: Optional[Union[str, List[str]]] = None
    include_stop_str_in_output: bool = False
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    exclude_input_from_output: bool = True
    detokenize: bool = True
    ignore_eos: bool = False
    guided_decoding: Optional[GuidedDecodingParams] = None


class GuideType(enum.Enum):  # upstream: tensorrt_llm.bindings.executor.GuidedDecodingParams.GuideType
    JSON = 0
    JSON_SCHEMA = 1
    REGEX = 2
    EBNF_GRAMMAR = 3
    STRUCTURAL_TAG = 4


@_fake.stands_for("tensorrt_llm.bindings.executor.GuidedDecodingParams")
class ExecutorGuidedDecodingParams:
    GuideType = GuideType

    def __init__(self, guide_type: GuideType, guide: Optional[str] = None):
        self.guide_type, self.guide = guide_type, guide


def executor_guide(sp: SamplingParams) -> Optional[ExecutorGuidedDecodingParams]:
    g = sp.guided_decoding
    if g is None:
        return None
    if g.json_object:
        return ExecutorGuidedDecodingParams(GuideType.JSON)
    if g.json is not None:
        return ExecutorGuidedDecodingParams(GuideType.JSON_SCHEMA, g.json if isinstance(g.json, str) else _json.dumps(g.json))
    if g.regex is not None:
        return ExecutorGuidedDecodingParams(GuideType.REGEX, g.regex)
    if g.grammar is not None:
        return ExecutorGuidedDecodingParams(GuideType.EBNF_GRAMMAR, g.grammar)
    if g.structural_tag is not None:
        return ExecutorGuidedDecodingParams(GuideType.STRUCTURAL_TAG, g.structural_tag)
    return None
