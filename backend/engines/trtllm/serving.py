"""Serving on TensorRT-LLM's PyTorch backend (`tensorrt_llm.LLM`). NOT YET RUN ON A GPU.

Written against TensorRT-LLM 1.2.x; exercised here only with a fake `tensorrt_llm`
(tests/backend/trtllm/). Two parts:

* `build_llm(cfg, root)`: the `LLM(...)` from our ServerConfig, with our speculation
  component as its drafter (`UserProvidedDecodingConfig(max_draft_len, drafter=
  AdaptiveDrafter(...))`), the KV cache sized like ours (room for max_batch full contexts,
  or kv_budget_mb), the overlap scheduler off (the drafter infers acceptance from the
  tokens committed since the previous iteration) and TensorRT-LLM's tokenizer skipped.
* `TrtllmService`: what the Triton adapter drives (`submit(GenerationRequest, sink)`,
  `start()`, `stop()`, like EngineLoop). Requests are tokenized, checked, stopped and
  detokenized by the same code as on the CPU (`backend.request`, `backend.sequence`:
  EOS, max_tokens, context limit, stop words with held-back text, incremental UTF-8
  detokenizing, finish_reason, exclude_input_in_output), so clients cannot tell which
  engine serves them. TensorRT-LLM only generates token ids (`detokenize=False`); stop
  words are matched on our text, and the request is aborted when one appears.

Not done here (issue 18, later rounds): containers, the offline preparation, model
drafters' GPU memory (only model-free drafters are accepted), multi-node.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import random
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from policy.external import IterationDrafter
from policy.speculator import Speculator

from ...detokenizer import IncrementalDetokenizer
from ...request import GenerationRequest, Limits, RequestError, prompt_ids, validate
from ...sequence import Sequence
from ...server_config import ServerConfig
from . import _api
from .drafter import adaptive_drafter_class

log = logging.getLogger("specserve.trtllm")

DEFAULT_MAX_DRAFT_LEN = 8


# -- building the LLM ----------------------------------------------------------------------------
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


def build_speculator(cfg: ServerConfig, root: Path) -> Speculator:
    """The policy and drafters of the config. Only model-free drafters so far: a model
    drafter would need its own GPU memory beside TensorRT-LLM's KV pool (not done yet)."""
    from ...drafters import DRAFTERS, make_drafter
    from ...service import load_policy

    names = [n.strip() for n in cfg.drafters.split(",") if n.strip()]
    unknown = [n for n in names if n not in DRAFTERS or DRAFTERS[n].is_model]
    if unknown:
        raise ValueError(f"drafters {unknown} are not supported on TensorRT-LLM yet (model-free only: "
                         f"{', '.join(sorted(n for n, c in DRAFTERS.items() if not c.is_model))})")
    return Speculator(load_policy(cfg, root), {n: make_drafter(n) for n in names}, lookahead=True)


def build_llm(cfg: ServerConfig, root: Path, *, speculator: Optional[Speculator] = None,
              max_draft_len: int = DEFAULT_MAX_DRAFT_LEN, free_gpu_memory_fraction: float = 0.9,
              single_process: bool = True, **llm_kwargs) -> Tuple[Any, Any]:
    """-> (tensorrt_llm.LLM, AdaptiveDrafter). `single_process`: keep TensorRT-LLM's executor in
    this process (TLLM_WORKER_USE_SINGLE_PROCESS=1, as upstream's own tests do to reach it), so
    the drafter's per-request counters and the policy's trace live where we serve."""
    ckpt = cfg.resolve(cfg.checkpoint, root)
    spec = speculator if speculator is not None else build_speculator(cfg, root)
    drafter = adaptive_drafter_class()(IterationDrafter(spec, max_draft_len=max_draft_len), max_draft_len)
    if single_process:
        os.environ.setdefault("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    else:  # TensorRT-LLM pickles the speculative config to its worker process
        try:
            pickle.dumps(drafter)
        except Exception as e:
            raise ValueError(f"the drafter cannot be shipped to TensorRT-LLM's worker process ({e}); "
                             f"serve with single_process=True") from None
    kv = _api.kv_cache_config()(max_tokens=kv_cache_tokens(cfg, ckpt),
                                free_gpu_memory_fraction=free_gpu_memory_fraction, enable_block_reuse=True)
    spec_cfg = _api.user_provided_decoding_config()(max_draft_len=max_draft_len, drafter=drafter)
    args = dict(model=str(ckpt), backend="pytorch", skip_tokenizer_init=True, speculative_config=spec_cfg,
                kv_cache_config=kv, max_batch_size=cfg.max_batch, max_seq_len=cfg.max_context,
                disable_overlap_scheduler=True)
    args.update(llm_kwargs)
    return _api.llm_class()(**args), drafter


def sampling_params(req: GenerationRequest, end_id: int):
    """Our request as TensorRT-LLM SamplingParams. Greedy is top_k=1; stop words are ours
    (matched on our detokenized text), so none are passed; TensorRT-LLM does not detokenize."""
    s = req.sampling
    kw: Dict[str, Any] = dict(max_tokens=req.max_tokens, end_id=end_id, pad_id=end_id, seed=req.seed,
                              detokenize=False)
    if s.greedy:
        kw["top_k"] = 1
    else:
        kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    return _api.sampling_params_class()(**kw)


def _finish_reason(upstream: Optional[str]) -> str:
    return upstream if upstream in ("stop", "length", "cancelled") else "length"


# -- serving -------------------------------------------------------------------------------------
class TrtllmService:
    """Serves GenerationRequests on a `tensorrt_llm.LLM` from an asyncio loop in its own thread."""

    def __init__(self, llm, drafter, tokenizer, limits: Limits, eos_ids: frozenset, *,
                 cancel_poll_s: float = 0.05):
        self.llm, self.drafter, self.tok, self.limits = llm, drafter, tokenizer, limits
        self.default_eos, self.cancel_poll_s = frozenset(eos_ids), cancel_poll_s
        self.vocab = len(tokenizer)
        self.finished = self.cancelled = 0
        self._ids = iter(range(1, 1 << 62))
        self._aloop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._tasks: set = set()

    @classmethod
    def from_config(cls, cfg: ServerConfig, root: Path, **build_kwargs) -> "TrtllmService":
        from transformers import AutoTokenizer

        ckpt = cfg.resolve(cfg.checkpoint, root)
        tok = AutoTokenizer.from_pretrained(ckpt)
        eos = json.loads((ckpt / "config.json").read_text()).get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tok.eos_token_id is not None:
            eos_ids.add(tok.eos_token_id)
        llm, drafter = build_llm(cfg, root, **build_kwargs)
        return cls(llm, drafter, tok, Limits(max_tokens=cfg.max_tokens_limit, max_context=cfg.max_context),
                   frozenset(eos_ids))

    # -- the EngineLoop surface -------------------------------------------------------------
    def start(self) -> None:
        self._aloop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._aloop.run_forever, name="trtllm-serving", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._aloop is not None:
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self._aloop).result(timeout)
            self._aloop.call_soon_threadsafe(self._aloop.stop)
            self._thread.join(timeout)
        self.drafter.finish()
        self.llm.shutdown()

    def tokenize(self, req: GenerationRequest) -> List[int]:
        return prompt_ids(self.tok, req)

    def submit(self, req: GenerationRequest, sink) -> int:
        """Validate, tokenize and start serving; raises RequestError for a bad request."""
        validate(req, self.limits)
        ids = self.tokenize(req)
        if len(ids) >= self.limits.max_context:
            raise RequestError(f"prompt has {len(ids)} tokens; the context window is {self.limits.max_context} "
                               f"(prompt + output must fit)")
        if req.end_id is not None and not 0 <= req.end_id < self.vocab:
            raise RequestError(f"end_id {req.end_id} is outside the vocabulary [0, {self.vocab})")
        if req.seed is None and not req.sampling.greedy:
            req.seed = random.getrandbits(63)
        seq = Sequence(seq_id=next(self._ids), request=req, sink=sink, prompt_ids=ids, tokens=list(ids),
                       detok=IncrementalDetokenizer(self.tok, ids),
                       eos_ids=frozenset({req.end_id}) if req.end_id is not None else self.default_eos,
                       seed=req.seed or 0, arrival_s=time.perf_counter())
        if self._aloop is None:
            raise RuntimeError("TrtllmService.start() was not called")
        self._aloop.call_soon_threadsafe(self._spawn, seq)
        return seq.seq_id

    # -- one request ---------------------------------------------------------------------------
    def _spawn(self, seq: Sequence) -> None:
        task = self._aloop.create_task(self.serve(seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    async def serve(self, seq: Sequence) -> None:
        end_id = seq.request.end_id if seq.request.end_id is not None else min(self.default_eos)
        result = self.llm.generate_async(seq.prompt_ids, sampling_params=sampling_params(seq.request, end_id),
                                         streaming=True)
        last_poll = float("-inf")
        try:
            async for out in result:
                now = time.perf_counter()
                if now - last_poll >= self.cancel_poll_s:
                    last_poll = now
                    if seq.sink.cancelled():
                        result.abort()
                        seq.finish_reason = "cancelled"
                        self.cancelled += 1
                        break
                c = out.outputs[0]
                seq.append([int(t) for t in c.token_ids_diff], self.limits.max_context)
                seq.drafted, seq.accepted = self.drafter.request_stats(result.request_id)
                if not seq.finished and out.finished:
                    seq.finish_reason = _finish_reason(c.finish_reason)
                    seq.detok.flush()
                if seq.finished:
                    if not out.finished:
                        result.abort()  # our stop word, EOS or context limit came first
                    break
                if seq.request.stream:
                    seq.respond(final=False)
            if not seq.finished:  # the stream ended without a finished output
                seq.finish_reason = "length"
                seq.detok.flush()
            if seq.finish_reason != "cancelled":
                self.finished += 1
            seq.respond(final=True)
        except asyncio.CancelledError:
            result.abort()
            seq.sink.error("the server is shutting down")
            raise
        except Exception as e:  # one failing request never takes the others down
            log.exception("request %d failed on TensorRT-LLM", seq.seq_id)
            try:
                result.abort()
            except Exception:
                pass
            seq.sink.error(f"internal error: {e}")
        finally:
            self.drafter.forget(result.request_id)
