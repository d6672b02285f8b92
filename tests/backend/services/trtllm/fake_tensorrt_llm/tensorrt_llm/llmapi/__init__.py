"""tensorrt_llm.llmapi (fake): LLM, RequestOutput, KvCacheConfig, UserProvidedDecodingConfig, SamplingParams."""
from ..sampling_params import SamplingParams
from .llm import LLM, CompletionOutput, RequestOutput
from .llm_args import KvCacheConfig, UserProvidedDecodingConfig

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "KvCacheConfig", "UserProvidedDecodingConfig", "SamplingParams"]
