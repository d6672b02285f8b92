"""tensorrt_llm/_torch/pyexecutor/llm_request.py (fake): LlmRequestState, LlmRequest (upstream a
Python subclass of the C++ binding; here only the attributes the adapter reads), and the
binding's SamplingConfig (optional per-beam vectors)."""
from __future__ import annotations

import enum
from typing import List, Optional

from ... import _fake


class LlmRequestState(enum.Enum):  # upstream: tensorrt_llm.bindings.LlmRequestState
    UNKNOWN = 0
    ENCODER_INIT = 1
    CONTEXT_INIT = 2
    GENERATION_IN_PROGRESS = 3
    GENERATION_TO_COMPLETE = 4
    GENERATION_COMPLETE = 5


@_fake.stands_for("tensorrt_llm.bindings.SamplingConfig")
class SamplingConfig:
    def __init__(self, temperature: Optional[float] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, beam_width: int = 1):
        self.temperature = None if temperature is None else [temperature]
        self.top_k = None if top_k is None else [top_k]
        self.top_p = None if top_p is None else [top_p]
        self.beam_width = beam_width


@_fake.stands_for("tensorrt_llm._torch.pyexecutor.llm_request.LlmRequest")
class LlmRequest:
    def __init__(self, request_id: int, input_tokens: List[int], max_new_tokens: int,
                 sampling_config: SamplingConfig, client_id: Optional[int] = None, end_id: int = -1,
                 guided_decoding_params=None):
        self._tokens = list(input_tokens)  # beam 0
        self.py_request_id = request_id
        self.py_client_id = client_id
        self.py_end_id = end_id
        self.guided_decoding_params = guided_decoding_params  # the binding's property (bindings GuidedDecodingParams)
        self.py_prompt_len = self.py_orig_prompt_len = len(input_tokens)
        self.py_max_new_tokens = max_new_tokens
        self.py_draft_tokens: List[int] = []
        self.py_batch_idx = None
        self.state = LlmRequestState.CONTEXT_INIT
        self.sampling_config = sampling_config
        self.is_attention_dp_dummy = False
        self.is_cuda_graph_dummy = False

    def get_tokens(self, beam: int) -> List[int]:
        assert beam == 0
        return list(self._tokens)


def get_draft_token_length(request: LlmRequest) -> int:
    return len(request.py_draft_tokens) if request.py_draft_tokens is not None else 0
