"""tensorrt_llm/_torch/pyexecutor/resource_manager.py (fake): ResourceManagerType,
ResourceManager (a dict of managers), KVCacheManager.get_kv_cache_stats() -> the binding's
KvCacheStats."""
from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Callable

from ... import _fake


class ResourceManagerType(enum.Enum):
    KV_CACHE_MANAGER = "KV_CACHE_MANAGER"
    DRAFT_KV_CACHE_MANAGER = "DRAFT_KV_CACHE_MANAGER"
    PEFT_CACHE_MANAGER = "PEFT_CACHE_MANAGER"
    SEQ_SLOT_MANAGER = "SEQ_SLOT_MANAGER"
    SPEC_RESOURCE_MANAGER = "SPEC_RESOURCE_MANAGER"


@_fake.stands_for("tensorrt_llm.bindings.internal.batch_manager.KvCacheStats")
class KvCacheStats:
    def __init__(self, max_num_blocks: int, free_num_blocks: int, used_num_blocks: int, tokens_per_block: int):
        self.max_num_blocks, self.free_num_blocks = max_num_blocks, free_num_blocks
        self.used_num_blocks, self.tokens_per_block = used_num_blocks, tokens_per_block


@_fake.stands_for("tensorrt_llm._torch.pyexecutor.resource_manager.KVCacheManager")
class KVCacheManager:
    def __init__(self, stats: Callable[[], KvCacheStats]):
        self._stats = stats

    def get_kv_cache_stats(self) -> KvCacheStats:
        return self._stats()


@_fake.stands_for("tensorrt_llm._torch.pyexecutor.resource_manager.ResourceManager")
class ResourceManager:
    def __init__(self, resource_managers: dict):
        self.resource_managers = OrderedDict(resource_managers)

    def __call__(self, name):
        return self.resource_managers[name]

    def get_resource_manager(self, name):
        return self.resource_managers.get(name)
