"""The LLM-API settings of the TensorRT-LLM path, as a file the server reads. NOT YET RUN ON A GPU.

`build_engines/prepare_trtllm.py` writes `<checkpoint>/trtllm/llm_api.yaml`; `serving.build_llm`
reads it (or the file `trtllm_config` names). Its form is that of trtllm-serve's
`--extra_llm_api_options` YAML and of the `model.yaml` of TensorRT-LLM's own Triton LLM-API
model: keys are `tensorrt_llm.LLM(...)` arguments, nested configs as mappings, e.g.

    backend: pytorch
    guided_decoding_backend: llguidance
    max_batch_size: 32
    max_seq_len: 2048
    tensor_parallel_size: 1
    enable_iter_perf_stats: true
    kv_cache_config: {free_gpu_memory_fraction: 0.9, enable_block_reuse: true, max_tokens: 65536}

What wins where: the model and the speculative config are the server's and may not be in the
file; `max_batch_size`, `max_seq_len` and `tensor_parallel_size` follow the server config
(`max_batch`, `max_context`, `tensor_parallel_size`), since our request limits are built from
the same numbers (a file that disagrees is logged and overridden); everything else comes from
the file, over the defaults below.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional, Tuple

import yaml

from ...server_config import ServerConfig
from . import _api

log = logging.getLogger("specserve.trtllm")

FILE = Path("trtllm") / "llm_api.yaml"
MANIFEST = Path("trtllm") / "manifest.json"
# Set by build_llm, never by the file: the checkpoint it serves, and our drafter.
SERVER_ONLY = ("model", "speculative_config")
# Values the adapter needs (why: docs/trtllm.md); the file may repeat them, not change them.
REQUIRED = {"backend": "pytorch",  # the user drafter hook exists only in the PyTorch backend
            "disable_overlap_scheduler": True}  # acceptance is read from tokens committed since the last iteration
# Structured output: TensorRT-LLM masks with llguidance (guides.py); its guided decoder needs its
# tokenizer (1.2 asserts one), though we still tokenize and detokenize ourselves. A file may set
# `guided_decoding_backend: null` (structured output then refused) and `skip_tokenizer_init: true`.
GUIDED = {"guided_decoding_backend": "llguidance", "skip_tokenizer_init": False}
# LLM argument -> the ServerConfig key it must equal.
FROM_SERVER_CONFIG = {"max_batch_size": "max_batch", "max_seq_len": "max_context",
                      "tensor_parallel_size": "tensor_parallel_size"}
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9  # TensorRT-LLM's own default


def kv_bytes_per_token(checkpoint: Path, dtype_bytes: int = 2) -> int:
    """Target KV bytes per token from the Hugging Face config (K and V, every layer)."""
    cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * dtype_bytes


def kv_cache_tokens(cfg: ServerConfig, checkpoint: Path) -> int:
    """Our KV budget in tokens: kv_budget_mb if set, else room for max_batch full contexts."""
    if cfg.kv_budget_mb > 0:
        return max(1, cfg.kv_budget_mb * 2**20 // kv_bytes_per_token(checkpoint))
    return cfg.max_batch * cfg.max_context


def default_settings(cfg: ServerConfig, checkpoint: Path, *,
                     free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                     enable_block_reuse: bool = True) -> dict:
    """The LLM arguments our config implies. The KV cache holds what ours would (TensorRT-LLM takes
    the smaller of kv_cache_config's max_tokens, TensorRT-LLM's name for our kv_cache_tokens, and
    the memory fraction); iteration statistics are on."""
    return {**REQUIRED, **GUIDED,
            "max_batch_size": cfg.max_batch, "max_seq_len": cfg.max_context,
            "tensor_parallel_size": cfg.tensor_parallel_size, "enable_iter_perf_stats": True,
            "kv_cache_config": {"free_gpu_memory_fraction": free_gpu_memory_fraction,
                                "enable_block_reuse": enable_block_reuse,
                                "max_tokens": kv_cache_tokens(cfg, checkpoint)}}  # the KV size, not a length


def load(path: Path) -> dict:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of LLM(...) arguments, got {type(data).__name__}")
    bad = [k for k in SERVER_ONLY if k in data]
    if bad:
        raise ValueError(f"{path}: {bad} are set by the server (the checkpoint it serves, our drafter), not here")
    wrong = {k: data[k] for k, v in REQUIRED.items() if k in data and data[k] != v}
    if wrong:
        raise ValueError(f"{path}: {wrong} would break the adapter; it needs {REQUIRED} (docs/trtllm.md)")
    backend = data.get("guided_decoding_backend", GUIDED["guided_decoding_backend"])
    if backend not in (None, GUIDED["guided_decoding_backend"]):
        raise ValueError(f"{path}: guided_decoding_backend {backend!r}: only llguidance (or null: no structured "
                         f"output) is served; our drafts and JSON layout follow llguidance's grammar (docs/trtllm.md)")
    if backend is not None and data.get("skip_tokenizer_init"):
        raise ValueError(f"{path}: skip_tokenizer_init: true leaves TensorRT-LLM's guided decoder without the "
                         f"tokenizer it needs; set guided_decoding_backend: null as well, or drop it")
    if not isinstance(data.get("kv_cache_config", {}), dict):
        raise ValueError(f"{path}: kv_cache_config must be a mapping of KvCacheConfig fields")
    return data


def write(path: Path, settings: dict, header: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(lines + yaml.safe_dump(settings, sort_keys=False))


def config_path(cfg: ServerConfig, root: Path, checkpoint: Path) -> Optional[Path]:
    """The file to read: the one `trtllm_config` names (it must exist), else the prepared one, if any."""
    if cfg.trtllm_config:
        path = cfg.resolve(cfg.trtllm_config, root)
        if not path.exists():
            raise FileNotFoundError(f"trtllm_config {path} does not exist (write it: python -m "
                                    f"build_engines.prepare_trtllm --checkpoint {checkpoint})")
        return path
    prepared = Path(checkpoint) / FILE
    return prepared if prepared.exists() else None


def resolve(cfg: ServerConfig, root: Path, checkpoint: Path, *,
            free_gpu_memory_fraction: Optional[float] = None) -> Tuple[dict, Optional[Path]]:
    """(LLM arguments, the file they came from or None): defaults, then the file, then the server
    config's own numbers; an explicit free_gpu_memory_fraction (tests) wins over both."""
    settings = default_settings(cfg, checkpoint)
    path = config_path(cfg, root, checkpoint)
    if path is not None:
        data = load(path)
        kv = {**settings["kv_cache_config"], **data.pop("kv_cache_config", {})}
        settings.update(data)
        settings["kv_cache_config"] = kv
        for arg, key in FROM_SERVER_CONFIG.items():
            if settings[arg] != getattr(cfg, key):
                log.warning("%s: %s=%s, but the server config has %s=%s: serving with %s", path, arg,
                            settings[arg], key, getattr(cfg, key), getattr(cfg, key))
                settings[arg] = getattr(cfg, key)
    if free_gpu_memory_fraction is not None:
        settings["kv_cache_config"]["free_gpu_memory_fraction"] = free_gpu_memory_fraction
    return settings, path


def check_manifest(checkpoint: Path) -> Optional[dict]:
    """The preparation's manifest, if any; warns when the TensorRT-LLM installed here is another
    minor line than the one the adapter (and the preparation) was written for."""
    f = Path(checkpoint) / MANIFEST
    if not f.exists():
        return None
    manifest = json.loads(f.read_text())
    written = manifest.get(_api.PACKAGE, {}).get("written_for", _api.WRITTEN_FOR)  # prepare_trtllm's key
    installed = _api.installed_version()
    if installed and installed.split(".")[:2] != written.split(".")[:2]:
        log.warning("TensorRT-LLM %s is installed; %s was prepared for %s (docs/trtllm.md)", installed, f, written)
    return manifest
