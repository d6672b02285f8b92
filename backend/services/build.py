"""Build what serves a ServerConfig (no Triton here): our EngineLoop (build_loop), or the
TensorRT-LLM service (build_service picks by cfg.engine)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..drafters import DRAFTERS, Drafter, make_drafter
from ..drafters.feature import load_model_drafter
from ..drafters.artifacts import find_artifact, not_built
from ..loop.config import LoopConfig
from ..loop.engine_loop import EngineLoop
from ..engines import Engine
from ..engines.torch_llama import TorchLlama
from ..generation import hf_tokenizer
from ..served_policy import load_policy
from ..server_config import ServerConfig
from .contract import Service

log = logging.getLogger("specserve")


def build_loop(cfg: ServerConfig, root: Path) -> EngineLoop:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    elif cfg.engine == "llama.cpp":
        # llama.cpp's threads take every core during a step; torch only samples (and runs model
        # drafters) between steps: a second full-width thread pool would contend with llama.cpp's
        # spinning workers, so torch gets one thread.
        torch.set_num_threads(1)
    ckpt = cfg.resolve(cfg.checkpoint, root)
    if not (ckpt / "config.json").exists():
        raise FileNotFoundError(f"no checkpoint at {ckpt}: run the set-up (scripts/setup.sh) or set "
                                f"SPECSERVE_CHECKPOINT to a local Hugging Face Llama-family directory")
    manifest = ckpt / "manifest.json"
    if manifest.exists():
        log.info("serving %s", json.loads(manifest.read_text()).get("name", ckpt.name))
    tokenizer = hf_tokenizer.load(ckpt)
    engine = build_engine(cfg, root, ckpt)
    log.info("target engine %s", engine.name)
    drafters = {name: build_drafter(name, cfg, root, engine)
                for name in filter(None, (n.strip() for n in cfg.drafters.split(",")))}
    loop_cfg = LoopConfig.from_server(cfg)
    on_outcome = trace_writer(cfg.resolve(cfg.trace_file, root)) if cfg.trace_file else None
    return EngineLoop(engine, tokenizer, drafters, load_policy(cfg, root), loop_cfg, on_outcome=on_outcome)


def build_engine(cfg: ServerConfig, root: Path, ckpt: Path) -> Engine:
    """The target engine the config names: llama.cpp on the checkpoint's prepared GGUF (or
    cfg.gguf), or the torch engine on the checkpoint itself."""
    if cfg.engine == "llama.cpp":
        from ..engines.llama_cpp import LlamaCpp, served_gguf
        gguf = cfg.resolve(cfg.gguf, root) if cfg.gguf else served_gguf(ckpt)
        return LlamaCpp(gguf, max_slots=cfg.max_batch, max_context=cfg.max_context, threads=cfg.threads,
                        kv_type=cfg.kv_type, prefix_stream=cfg.reuse_prefix,
                        retain_streams=cfg.kv_reuse_streams)
    return TorchLlama(ckpt, dtype=cfg.dtype, max_slots=cfg.max_batch, max_context=cfg.max_context,
                      batch_invariant=cfg.batch_invariant)


def build_service(cfg: ServerConfig, root: Path) -> Service:
    """What serves the requests: our EngineLoop, or (engine=trtllm) TensorRT-LLM's PyTorch
    backend with our speculation in its drafter hook. Both are a Service (contract.py)."""
    if cfg.engine == "trtllm":
        from .trtllm.serving import TrtllmService
        return TrtllmService.from_config(cfg, root)
    return build_loop(cfg, root)


def build_drafter(name: str, cfg: ServerConfig, root: Path, engine: Engine) -> Drafter:
    """A registered drafter by name, else a model drafter built by build_engines/distill_drafter.py."""
    if name in DRAFTERS:
        return make_drafter(name)
    path = find_artifact(cfg.resolve(cfg.drafter_dir, root), name)
    if path is None:
        raise not_built(name, cfg.drafter_dir, DRAFTERS)
    d = load_model_drafter(name, path, dtype=cfg.dtype, max_slots=cfg.max_batch, max_context=cfg.max_context,
                           target=engine if isinstance(engine, TorchLlama) else None)
    log.info("model drafter %s from %s (%.1f MB resident)", name, path, d.weight_bytes / 2**20)
    return d


def trace_writer(path: Path):
    """Append each StepOutcome as one JSON line (the simulator replays these files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)  # line-buffered: a crash loses no recorded step

    def write(outcome) -> None:
        f.write(json.dumps(outcome.to_dict()) + "\n")

    return write
