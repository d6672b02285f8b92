"""Server configuration: config.pbtxt parameters, overridable by SPECSERVE_* env vars.

Every key below can be set in model_repository/llm/config.pbtxt `parameters` or as
an environment variable SPECSERVE_<KEY upper-case> (env wins), so tests and users
change the served model, dtype or policy without editing files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping


ENGINES = ("llama.cpp", "torch", "trtllm")


@dataclass(frozen=True)
class ServerConfig:
    checkpoint: str = ".cache/models/smollm2-135m-instruct"  # any local HF Llama-family dir
    engine: str = "llama.cpp"  # llama.cpp (CPU default) | torch (exact reference, hosts model drafters) | trtllm (GPU; not yet run on one)
    dtype: str = "bf16"  # torch engine: bf16 | fp32
    batch_invariant: bool = True  # torch engine, bf16: logits bit-identical whatever the batch (1.3-2.4x slower steps)
    gguf: str = ""  # llama.cpp engine: the GGUF file; "" = the one the checkpoint's manifest names (build_engines/prepare_gguf.py)
    kv_type: str = "q8_0"  # llama.cpp engine's KV cache type: q8_0 | bf16 (batch-invariant) | f16 (not batch-invariant)
    max_batch: int = 32  # running sequences per model instance
    max_context: int = 2048  # prompt + output tokens per sequence
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 64  # when a request does not send max_tokens
    threads: int = 0  # engine threads (torch intra-op, llama.cpp); 0 = all cores
    policy: str = "composite"  # a registered policy name (see policy/)
    policy_config: str = ""  # optional YAML file with the policy's parameters
    drafters: str = "ngram,suffix"  # comma-separated: registered drafters, or model drafters found in drafter_dir
    drafter_dir: str = ".cache/drafters"  # model drafter <name> is <drafter_dir>/<name>-drafter[-quick]
    kv_budget_mb: int = 0  # target KV cache + resident model drafters; 0 = room for max_batch full contexts
    chat_template_default: bool = False  # apply the chat template when the request does not say
    tpot_slo_ms: int = 0  # time-per-output-token target given to SLO-aware policies; 0 = none
    trace_file: str = ""  # append every StepOutcome as a JSON line (replay: python -m policy.simulator)
    # admission control (issue 20): waiting requests beyond which new ones get "overloaded, retry later"
    max_queue: int = 0  # 0 = 4 x max_batch
    # chunked prefill (issue 20): prompt tokens prefilled per iteration, between decode steps; 0 = whole prompts
    prefill_chunk: int = 128
    async_send: bool = True  # send responses from a thread of their own, overlapping the next step
    # llama.cpp: copy the chat template's shared first tokens instead of prefilling them. Off by default:
    # each copy writes a whole 2,048-cell stream, so RSS grows towards the full KV allocation
    # (+57 MiB in the 60 s soak test, bounded, but indistinguishable from a leak there).
    reuse_prefix: bool = False
    # engine trtllm (GPU; not yet run on one): TensorRT-LLM's tensor parallelism over this many GPUs
    tensor_parallel_size: int = 1
    # engine trtllm: the LLM-API settings file (build_engines/prepare_trtllm.py writes it);
    # "" = <checkpoint>/trtllm/llm_api.yaml when it exists, else settings derived from this config
    trtllm_config: str = ""

    @classmethod
    def load(cls, params: Mapping[str, str], env: Mapping[str, str] = os.environ) -> "ServerConfig":
        values = {}
        for f in fields(cls):
            raw = env.get("SPECSERVE_" + f.name.upper(), params.get(f.name))
            if raw is None or raw == "":
                continue
            if f.type in ("int", int):
                values[f.name] = int(raw)
            elif f.type in ("bool", bool):
                values[f.name] = str(raw).lower() in ("1", "true", "yes", "on")
            else:
                values[f.name] = str(raw)
        unknown = set(params) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown config parameters: {', '.join(sorted(unknown))}")
        cfg = cls(**values)
        if cfg.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {cfg.engine!r}")
        if cfg.dtype not in ("bf16", "fp32"):
            raise ValueError(f"dtype must be bf16 or fp32, got {cfg.dtype!r}")
        if cfg.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {cfg.tensor_parallel_size}")
        if cfg.tensor_parallel_size > 1 and cfg.engine != "trtllm":
            raise ValueError(f"tensor_parallel_size {cfg.tensor_parallel_size} needs engine trtllm "
                             f"(the {cfg.engine} engine runs on one device)")
        return cfg

    def resolve(self, path: str, root: Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else root / p
