"""TensorRT-LLM serving path (PyTorch backend, `tensorrt_llm.LLM`). NOT YET RUN ON A GPU.

TensorRT-LLM owns its loop (scheduler, paged KV cache, verification, streaming), so it
does not implement our engine contract: it is a second Service (backend/services/contract.py)
beside our EngineLoop, and our speculation component runs inside its per-iteration drafter
hook:

  _api.py          the only importer of `tensorrt_llm` (lazily, inside functions)
  drafter.py       AdaptiveDrafter: TensorRT-LLM `Drafter` subclass wrapping policy.external.IterationDrafter
  serving.py       build_llm (LLM + UserProvidedDecodingConfig from our ServerConfig and the settings
                   file) and TrtllmService (GenerationRequest in, Chunks out, as on the CPU)
  llm_config.py    the LLM-API settings file build_engines/prepare_trtllm.py writes and build_llm reads
  gpu_drafters.py  model drafters on the GPU; the policy's park/reload moves their weights off and on it
  observe.py       what the service reports to the metrics (the Service contract's stats, pool, running)

Written against TensorRT-LLM 1.2.x; see docs/trtllm.md. Importing this package never
imports `tensorrt_llm`.
"""
from ._api import available

__all__ = ["available"]
