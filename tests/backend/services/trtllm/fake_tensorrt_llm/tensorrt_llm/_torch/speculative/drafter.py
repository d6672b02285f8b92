"""tensorrt_llm/_torch/speculative/drafter.py (fake): the 1.2-era Drafter base, as upstream
(index id 4409156300: constructor, abstract prepare_draft_tokens, should_use_spec_decode, the
dynamic draft length's get_draft_len_for_batch_size / update_max_total_draft_tokens, and the
padding the executor applies after the hook, to the *static* max_total_draft_tokens)."""
from __future__ import annotations

from bisect import bisect_right
from abc import ABC, abstractmethod
from typing import Dict, List, Optional, final

from ..pyexecutor.llm_request import LlmRequest, get_draft_token_length
from ..pyexecutor.resource_manager import ResourceManager
from ..pyexecutor.scheduler import ScheduledRequests


class Drafter(ABC):
    def __init__(self, max_draft_len: int = None, max_total_draft_tokens: int = None,
                 max_concurrency: Optional[int] = None, draft_len_schedule: Optional[Dict[int, int]] = None) -> None:
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_total_draft_tokens
        self._static_max_total_draft_tokens = max_total_draft_tokens
        self.max_concurrency = max_concurrency
        self.draft_len_schedule = draft_len_schedule

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests: ScheduledRequests,
                             resource_manager: Optional[ResourceManager] = None) -> None:
        raise NotImplementedError

    @final
    def should_use_spec_decode(self, requests: List[LlmRequest], max_batch_size: int, max_num_tokens: int,
                               max_total_draft_tokens: int) -> bool:
        if self.max_concurrency is None:
            return True
        if not requests or max_batch_size <= 0 or max_num_tokens <= 0:
            return False
        token_cap = max_num_tokens // (1 + max_total_draft_tokens)
        if token_cap <= 0:
            return False
        return min(len(requests), max_batch_size, token_cap) <= self.max_concurrency

    def get_draft_len_for_batch_size(self, batch_size: int) -> int:
        # upstream: the schedule's value at the largest threshold <= batch_size (0 below the first)
        if self.draft_len_schedule is None:
            return self.max_total_draft_tokens
        thresholds = list(self.draft_len_schedule.keys())
        idx = bisect_right(thresholds, batch_size)
        if idx == 0:
            return 0
        return self.draft_len_schedule[thresholds[idx - 1]]

    def update_max_total_draft_tokens(self, new_max_total_draft_tokens: int) -> None:
        self.max_total_draft_tokens = new_max_total_draft_tokens
        self.max_draft_len = new_max_total_draft_tokens

    @final
    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests: ScheduledRequests) -> None:
        for req in scheduled_requests.generation_requests:
            num_draft_tokens = get_draft_token_length(req)
            req.py_draft_tokens.extend(0 for _ in range(self._static_max_total_draft_tokens - num_draft_tokens))
