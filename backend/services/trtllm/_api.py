"""The only module that imports `tensorrt_llm`, and only inside functions.

Every upstream name the TensorRT-LLM path uses is fetched here through `_get(module,
name)`, so the set of names is visible in one place (tests/backend/services/trtllm checks it
against a record of the real 1.2.x sources: upstream_api.json). TensorRT-LLM lives in
its container (Python 3.10/3.12 wheels from NVIDIA's index), never in our venv; nothing
here is imported at module load, so the package imports on any machine.

Upstream (release/1.2 line, read for this adapter; file and line in upstream_api.json):
  tensorrt_llm._torch.speculative.drafter.Drafter           the per-iteration hook's base class
  tensorrt_llm._torch.pyexecutor.llm_request.LlmRequestState GENERATION_COMPLETE
  tensorrt_llm._torch.pyexecutor.resource_manager.ResourceManagerType  KV_CACHE_MANAGER
  tensorrt_llm.LLM, tensorrt_llm.SamplingParams              the LLM API (PyTorch backend)
  tensorrt_llm.sampling_params.GuidedDecodingParams          structured output (SamplingParams.guided_decoding)
  tensorrt_llm.llmapi.UserProvidedDecodingConfig, KvCacheConfig
"""
from __future__ import annotations

import importlib
import importlib.util

PACKAGE = "tensorrt_llm"


def available() -> bool:
    """Whether a `tensorrt_llm` can be imported here (only inside the TensorRT-LLM container)."""
    try:
        return importlib.util.find_spec(PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def _get(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def version() -> str:
    return str(_get("tensorrt_llm", "__version__"))


def installed_version():
    """The installed distribution's version, or None; read from its metadata, never imported
    (importing TensorRT-LLM needs a GPU driver, which an image build or this machine lacks)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


WRITTEN_FOR = "1.2.1"  # the TensorRT-LLM this adapter was written against (docs/trtllm.md)


# -- the drafter hook (PyTorch backend internals) -------------------------------------------
def drafter_base() -> type:
    """`Drafter(ABC)`: `__init__(max_draft_len, max_total_draft_tokens, max_concurrency,
    draft_len_schedule)`, abstract `prepare_draft_tokens(scheduled_requests, resource_manager)`."""
    return _get("tensorrt_llm._torch.speculative.drafter", "Drafter")


def generation_complete_state():
    """`LlmRequestState.GENERATION_COMPLETE`: a request that finished (or was cancelled)."""
    return _get("tensorrt_llm._torch.pyexecutor.llm_request", "LlmRequestState").GENERATION_COMPLETE


def kv_cache_manager_type():
    """`ResourceManagerType.KV_CACHE_MANAGER`: the key of the target's KV cache manager."""
    return _get("tensorrt_llm._torch.pyexecutor.resource_manager", "ResourceManagerType").KV_CACHE_MANAGER


# -- the LLM API -------------------------------------------------------------------------------
def llm_class() -> type:
    return _get("tensorrt_llm", "LLM")


def sampling_params_class() -> type:
    return _get("tensorrt_llm", "SamplingParams")


def guided_decoding_params_class() -> type:
    """`GuidedDecodingParams(json=, regex=, grammar=, json_object=, structural_tag=)`: one guide a
    request (SamplingParams.guided_decoding)."""
    return _get("tensorrt_llm.sampling_params", "GuidedDecodingParams")


def user_provided_decoding_config() -> type:
    return _get("tensorrt_llm.llmapi", "UserProvidedDecodingConfig")


def kv_cache_config() -> type:
    return _get("tensorrt_llm.llmapi", "KvCacheConfig")
