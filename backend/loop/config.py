"""The engine loop's settings (backend/loop/engine_loop.py), and those a ServerConfig serves."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..generation.request import Limits
from ..server_config import ServerConfig


@dataclass(frozen=True)
class LoopConfig:
    """The loop's settings. The server builds them from its ServerConfig (from_server); the
    defaults shared with it are ServerConfig's own, so tests and benchmarks that build a loop
    directly run what the server runs."""
    max_batch: int = 8  # running sequences (engine slots)
    limits: Limits = Limits()
    trace_len: int = 0  # StepOutcomes kept in memory for inspection (tests and benchmarks ask for some)
    tpot_slo_s: Optional[float] = None  # time-per-output-token target handed to the policy
    cancel_poll_s: float = 0.05  # how often to ask the sinks whether their clients cancelled
    kv_budget_bytes: Optional[int] = None  # target KV + resident drafters; None = room for every slot
    max_queue: int = 0  # waiting requests beyond which submit refuses new ones (Overloaded); 0 = no bound
    # Prompt tokens prefilled per iteration, between decode steps; 0 = whole prompts at once.
    # 128: on the 2-core EPYC, llama.cpp Q8_0, a 2,040-token prompt costs about the same in chunks
    # of 128 as whole, and running streams wait at most 1.1 s instead of 11 s (0.6 s at 64, for
    # 5% more time to the long prompt's first token): bench/bench_chunked_prefill.py.
    prefill_chunk: int = ServerConfig.prefill_chunk
    # Chunks an iteration may prefill when that many prompts are prefilling (one chunk a prompt):
    # copy-heavy prompts at 32 streams 1.35-1.45x tokens/s, TTFT 12 s -> ~2.7 s (docs/results.md).
    prefill_chunks: int = ServerConfig.prefill_chunks
    # Prompts that start with the chat template's shared tokens copy them from a stream the engine
    # keeps (llama.cpp's prefix_stream) instead of prefilling them: bit-identical, ~17% of a prompt.
    reuse_prefix: bool = ServerConfig.reuse_prefix
    # Finished sequences' cells are kept in the engine's retained streams (llama.cpp's retain_streams)
    # for later prompts that start with the same tokens (backend/loop/retained.py).
    reuse_kv: bool = True

    @classmethod
    def from_server(cls, cfg: ServerConfig) -> "LoopConfig":
        """The loop a ServerConfig serves. Nothing in the server reads an in-memory trace
        (trace_file writes one out; at 64 streams 10,000 outcomes held ~100 MiB after 10 minutes)."""
        return cls(max_batch=cfg.max_batch, limits=Limits(max_new_tokens_limit=cfg.max_tokens_limit, max_context=cfg.max_context),
                   tpot_slo_s=cfg.tpot_slo_ms / 1000 if cfg.tpot_slo_ms > 0 else None,
                   kv_budget_bytes=cfg.kv_budget_mb * 2**20 if cfg.kv_budget_mb > 0 else None,
                   max_queue=cfg.max_queue or 4 * cfg.max_batch, prefill_chunk=cfg.prefill_chunk,
                   prefill_chunks=cfg.prefill_chunks, trace_len=0,
                   reuse_prefix=cfg.reuse_prefix, reuse_kv=cfg.kv_reuse_streams > 0)
