"""Model drafters on the GPU beside TensorRT-LLM, and the policy's park/reload actions for them.
Beside TensorRT-LLM NOT YET RUN ON A GPU; tested on the CPU with the device moves recorded
(tests/backend/services/trtllm), and, alone on CUDA, park/reload ran on an H200 (test_gpu_drafter_cuda.py).

A model drafter (build_engines/distill_drafter.py) runs our torch engine on the target's GPU,
in the process TensorRT-LLM's executor runs in. Its weights and its own KV cache are torch
allocations there. The policy's memory actions (`MemoryAction("offload" | "reload")`, e.g.
policy/elastic.py) then mean:

* park: the weights go to host memory, the drafter's KV cache is freed (a parked drafter keeps
  no sequence; they catch up after the reload), and `torch.cuda.empty_cache()` hands the freed
  blocks from torch's caching allocator back to the driver;
* reload: the weights come back to the GPU on a background thread with a fresh KV cache; the
  drafter is used again only once that finished (`resident`, as on the CPU).

What that can and cannot give TensorRT-LLM: its KV pool is sized once, when the LLM starts
(`KvCacheCreator.configure_kv_cache_capacity`: free memory after loading the model and a warm-up,
times `free_gpu_memory_fraction`, capped by `max_tokens`) and never grows. Drafters loaded before
the LLM (build_llm does so) are counted as used memory there. Parking one frees GPU memory but
adds no KV block: the freed memory can serve TensorRT-LLM's activations, CUDA graphs or other
processes, not more sequences. So on this path the policy's drafter_blocks are 0 (residency
costs the pool nothing at run time), and the memory actions only trade drafting for free GPU
memory. Growing the pool needs a restart with the drafter left out.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Optional

import torch

from policy.speculator import Speculator

from ...drafters import DRAFTERS
from ...drafters.artifacts import find_artifact, not_built
from ...drafters.feature import is_feature_drafter
from ...drafters.model import ModelDrafter
from ...engines.torch_llama import TorchLlama
from ...loop.memory import DrafterMemory
from ...server_config import ServerConfig

log = logging.getLogger("specserve.trtllm")


class Placement:
    """Where a model drafter runs (`device`) and where its weights wait while parked (`host`)."""

    def __init__(self, device: str = "cuda", host: str = "cpu"):
        self.device, self.host = torch.device(device), torch.device(host)

    def to_device(self, engine: TorchLlama) -> TorchLlama:
        return engine.to(self.device)  # a fresh, zeroed KV cache

    def to_host(self, engine: TorchLlama) -> TorchLlama:
        return engine.to(self.host, cache=False)

    def release(self) -> None:
        """Give the caching allocator's free blocks back to the driver (the freed weights are
        otherwise kept by torch for its own later allocations)."""
        if self.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()


class GpuModelDrafter(ModelDrafter):
    """A ModelDrafter whose engine lives on `placement.device`; parking moves its weights to host
    memory (not to disk: reloading is a copy back, not a read and a rebuild)."""

    _host: Optional[TorchLlama] = None  # the parked engine (weights in host memory, no KV cache)

    def __init__(self, name: str, checkpoint, *, placement: Placement, **kwargs):
        self.placement = placement
        super().__init__(name, checkpoint, target=None, **kwargs)  # TensorRT-LLM's embedding is not ours to share

    def _load(self) -> None:
        eng, self._host = self._host, None
        if eng is None:
            eng = TorchLlama(self.checkpoint, device=self.placement.device, **self._args)
        else:
            eng = self.placement.to_device(eng)
        self.vocab, self.draft_vocab = eng.shape.vocab, eng.draft_vocab
        self._engine = eng
        self._ready.set()  # last: the drafter is usable only now

    def park(self) -> None:
        eng = self._engine
        super().park()  # not resident from here on; every sequence is forgotten
        if eng is not None:
            self._host = self.placement.to_host(eng)
            self.placement.release()


def load_gpu_drafter(name: str, cfg: ServerConfig, root: Path, placement: Placement) -> GpuModelDrafter:
    """The model drafter `name` from drafter_dir, on the GPU. Feature drafters are refused: they
    read the target's hidden states, which TensorRT-LLM's drafter hook does not hand out."""
    path = find_artifact(cfg.resolve(cfg.drafter_dir, root), name)
    if path is None:
        raise not_built(name, cfg.drafter_dir, DRAFTERS)
    if is_feature_drafter(path):
        raise ValueError(f"drafter {name!r} reads the target's features (hidden states); TensorRT-LLM's drafter "
                         f"hook does not provide them, so it cannot serve there")
    d = GpuModelDrafter(name, path, placement=placement, dtype=cfg.dtype, max_slots=cfg.max_batch,
                        max_context=cfg.max_context)
    log.info("model drafter %s on %s (%.1f MB of weights)", name, placement.device, d.weight_bytes / 2**20)
    return d


class MemorySpeculator(Speculator):
    """A Speculator that applies the policy's memory actions itself: policy.external's
    IterationDrafter calls propose() without `apply_memory` (our own loop passes it)."""

    def __init__(self, *args, memory: Optional[DrafterMemory] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory = memory if memory is not None else DrafterMemory(self.drafters)

    def propose(self, ctx, sequences, *, apply_memory=None, fit=None):
        return super().propose(ctx, sequences, apply_memory=apply_memory or self.memory, fit=fit)
