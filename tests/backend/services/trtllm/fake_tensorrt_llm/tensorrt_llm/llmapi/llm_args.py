"""tensorrt_llm/llmapi/llm_args.py (fake): the two configs the adapter builds."""
from __future__ import annotations

from typing import Dict, Optional


class KvCacheConfig:
    def __init__(self, *, free_gpu_memory_fraction: Optional[float] = None, max_tokens: Optional[int] = None,
                 enable_block_reuse: bool = True):
        self.free_gpu_memory_fraction, self.max_tokens = free_gpu_memory_fraction, max_tokens
        self.enable_block_reuse = enable_block_reuse


class UserProvidedDecodingConfig:
    """Upstream: DecodingBaseConfig fields + drafter + resource_manager; a validator sets
    max_total_draft_tokens = max_draft_len ("Current UserProvided only supports linear tree")."""

    decoding_type = "User_Provided"

    def __init__(self, *, max_draft_len: Optional[int] = None, max_concurrency: Optional[int] = None,
                 draft_len_schedule: Optional[Dict[int, int]] = None, drafter: object,
                 resource_manager: object = None):
        self.max_draft_len, self.max_concurrency, self.draft_len_schedule = max_draft_len, max_concurrency, draft_len_schedule
        self.drafter, self.resource_manager = drafter, resource_manager
        self.max_total_draft_tokens = max_draft_len
