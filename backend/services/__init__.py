"""What serves the requests. Every service implements the contract in `contract.py` (`Service`),
the one surface the Triton adapter and the metrics publisher use:

  contract.py  the Service protocol (submit, start/stop/drain/idle, limits, what the metrics read)
  build.py     build_service: our EngineLoop (backend/loop/) on an engine of backend/engines/, or
               the TensorRT-LLM service, as the ServerConfig names
  trtllm/      TrtllmService: TensorRT-LLM's PyTorch backend with our speculation in its drafter hook

Importing this package imports neither torch nor `tensorrt_llm`.
"""
from .contract import Service

__all__ = ["Service"]
