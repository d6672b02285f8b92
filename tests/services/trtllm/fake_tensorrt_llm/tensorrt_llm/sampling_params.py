"""tensorrt_llm/sampling_params.py: SamplingParams (only the fields the adapter sets, plus defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union


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
