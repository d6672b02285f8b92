"""Serving on TensorRT-LLM's PyTorch backend (`tensorrt_llm.LLM`). NOT YET RUN ON A GPU.

Written against TensorRT-LLM 1.2.x; exercised here only with a fake `tensorrt_llm`
(tests/backend/services/trtllm/). Two parts:

* `build_llm(cfg, root)`: the `LLM(...)` from our ServerConfig and the LLM-API settings file
  (llm_config.py: KV cache, block reuse, batch, sequence length, tensor parallelism, iteration
  statistics), with our speculation component as its drafter (`UserProvidedDecodingConfig(
  max_draft_len, drafter=AdaptiveDrafter(...))`), the overlap scheduler off (the drafter infers
  acceptance from the tokens committed since the previous iteration) and TensorRT-LLM's
  tokenizer skipped. Model drafters are loaded onto the GPU first (gpu_drafters.py), so the
  KV pool TensorRT-LLM sizes at start leaves their memory alone.
* `TrtllmService`: a Service (backend/services/contract.py), as our EngineLoop is: what the
  Triton adapter drives (`submit(GenerationRequest, sink)`, `limits`, `start()`, `stop()`,
  `drain()`, `idle`) and what the metrics publisher reads (observe.py). Requests are taken in by our
  loop's intake (`backend.loop.intake`: refusals, tokenizing, checks), then stopped and detokenized by
  the same code as on the CPU (`backend.generation.sequence`: EOS, max_tokens, context limit, stop
  words with held-back text, incremental UTF-8 detokenizing, finish_reason, exclude_input_in_output),
  so clients cannot tell which engine serves them. TensorRT-LLM only generates token ids
  (`detokenize=False`); stop words are matched on our text, and the request is aborted when one
  appears.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from policy.external import IterationDrafter
from policy.speculator import Speculator
from policy.types import StepOutcome

from ...generation import hf_tokenizer
from ...generation.guided import guide_problem
from ...generation.request import GenerationRequest, Limits, RequestError, prompt_ids
from ...generation.sequence import Sequence
from ...loop.intake import Intake, end_tokens
from ...loop.stats import LoopStats
from ...server_config import ServerConfig
from ...wire import ErrorKind
from . import _api, guides, llm_config
from .drafter import _Tee, adaptive_drafter_class
from .gpu_drafters import MemorySpeculator, Placement, load_gpu_drafter
from .observe import KvPool, ServiceStats, running_and_waiting

log = logging.getLogger("specserve.trtllm")

DEFAULT_MAX_DRAFT_LEN = 8
# With tensor parallelism every rank runs its own copy of the drafter and all must draft the same
# tokens; policies that read wall-clock step times would decide differently per rank.
RANK_SAFE_POLICIES = ("off", "static")


# -- building the LLM ----------------------------------------------------------------------------
def build_speculator(cfg: ServerConfig, root: Path, placement: Optional[Placement] = None) -> Speculator:
    """The policy and drafters of the config: registered (model-free) drafters, and model drafters
    from drafter_dir on the GPU (`placement`), whose park/reload the policy drives."""
    from ...drafters import DRAFTERS, make_drafter
    from ...served_policy import load_policy

    names = [n.strip() for n in cfg.drafters.split(",") if n.strip()]
    drafters = {}
    for n in names:
        if n in DRAFTERS and not DRAFTERS[n].is_model:
            drafters[n] = make_drafter(n)
        else:
            drafters[n] = load_gpu_drafter(n, cfg, root, placement or Placement())
    return MemorySpeculator(load_policy(cfg, root), drafters, lookahead=True)


def check_tensor_parallel(cfg: ServerConfig, spec: Speculator) -> None:
    """Refuse what would let TensorRT-LLM's ranks draft different tokens (docs/deploy.md)."""
    models = [n for n, d in spec.drafters.items() if d.is_model]
    policy = getattr(spec.policy, "name", "")  # the one served (cfg.policy may name its file)
    if policy not in RANK_SAFE_POLICIES or models:
        raise ValueError(f"tensor_parallel_size {cfg.tensor_parallel_size}: every rank runs its own drafter and all "
                         f"must draft the same tokens; policy {policy!r} and model drafters {models} can decide "
                         f"differently per rank. Serve with policy {' or '.join(RANK_SAFE_POLICIES)} and model-free "
                         f"drafters, or tensor_parallel_size 1 (docs/deploy.md, Tensor parallelism)")


def build_llm(cfg: ServerConfig, root: Path, *, speculator: Optional[Speculator] = None,
              max_draft_len: int = DEFAULT_MAX_DRAFT_LEN, free_gpu_memory_fraction: Optional[float] = None,
              single_process: Optional[bool] = None, placement: Optional[Placement] = None,
              **llm_kwargs) -> Tuple[Any, Any]:
    """-> (tensorrt_llm.LLM, AdaptiveDrafter). `single_process` (default: when tensor_parallel_size
    is 1) keeps TensorRT-LLM's executor in this process (TLLM_WORKER_USE_SINGLE_PROCESS=1, as
    upstream's own tests do to reach it), so the drafter's counters and the policy's trace live
    where we serve; tensor parallelism needs its worker processes (one per rank)."""
    ckpt = cfg.resolve(cfg.checkpoint, root)
    settings, source = llm_config.resolve(cfg, root, ckpt, free_gpu_memory_fraction=free_gpu_memory_fraction)
    if source is not None:
        log.info("TensorRT-LLM settings from %s", source)
    llm_config.check_manifest(ckpt)
    tp = settings["tensor_parallel_size"]
    single_process = tp == 1 if single_process is None else single_process
    if single_process and tp > 1:
        raise ValueError(f"tensor_parallel_size {tp} needs TensorRT-LLM's worker processes; "
                         f"serve with single_process=False")
    # the drafters before the LLM: TensorRT-LLM sizes its KV pool from the memory left (gpu_drafters.py)
    spec = speculator if speculator is not None else build_speculator(cfg, root, placement)
    if tp > 1:
        check_tensor_parallel(cfg, spec)
    drafter = adaptive_drafter_class()(IterationDrafter(spec, max_draft_len=max_draft_len), max_draft_len)
    if settings.get("guided_decoding_backend") == guides.BACKEND:  # structured output served (guides.py)
        guides.bind(drafter, guides.RequestGuides(ckpt))
    if single_process:
        os.environ.setdefault("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    else:  # TensorRT-LLM pickles the speculative config to its worker process(es)
        try:
            pickle.dumps(drafter)
        except Exception as e:
            raise ValueError(f"the drafter cannot be shipped to TensorRT-LLM's worker process ({e}); "
                             f"serve with single_process=True and tensor_parallel_size 1, or with "
                             f"drafters that pickle (ngram; not suffix, not model drafters)") from None
        if os.environ.get("TLLM_WORKER_USE_SINGLE_PROCESS") == "1":
            raise ValueError("TLLM_WORKER_USE_SINGLE_PROCESS=1 is set, but this LLM needs TensorRT-LLM's worker "
                             "processes (single_process=False): unset it")
    kv = _api.kv_cache_config()(**settings.pop("kv_cache_config"))
    # max_concurrency on the config (not on the drafter, whose should_use_spec_decode then always
    # agrees) makes 1.2's warm-up capture CUDA graphs without drafts too (model_engine.py): the
    # iterations our policy runs without speculation then replay a graph instead of running eagerly.
    spec_cfg = _api.user_provided_decoding_config()(max_draft_len=max_draft_len, drafter=drafter,
                                                    max_concurrency=settings.get("max_batch_size") or cfg.max_batch)
    args = dict(model=str(ckpt), speculative_config=spec_cfg, kv_cache_config=kv, **settings)
    args.update(llm_kwargs)
    return _api.llm_class()(**args), drafter


def sampling_params(req: GenerationRequest, end_id: int):
    """Our request as TensorRT-LLM SamplingParams. Greedy is top_k=1; stop words are ours
    (matched on our detokenized text), so none are passed; TensorRT-LLM does not detokenize.
    A guide becomes TensorRT-LLM's guided decoding (guides.py)."""
    s = req.sampling
    kw: Dict[str, Any] = dict(max_tokens=req.max_new_tokens, end_id=end_id, pad_id=end_id, seed=req.seed,
                              detokenize=False)
    if s.greedy:
        kw["top_k"] = 1
    else:
        kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    if req.guide is not None:
        kw["guided_decoding"] = _api.guided_decoding_params_class()(**guides.guided_decoding_fields(req.guide))
    return _api.sampling_params_class()(**kw)


def _finish_reason(upstream: Optional[str]) -> str:
    return upstream if upstream in ("stop", "length", "cancelled") else "length"


# -- serving -------------------------------------------------------------------------------------
class TrtllmService:
    """Serves GenerationRequests on a `tensorrt_llm.LLM` from an asyncio loop in its own thread."""

    def __init__(self, llm, drafter, tokenizer, limits: Limits, eos_ids: frozenset, *, max_batch: int = 1,
                 max_queue: int = 0, cancel_poll_s: float = 0.05):
        self.llm, self.drafter, self.tok = llm, drafter, tokenizer
        self.limits, self.max_batch, self.max_queue = limits, max_batch, max_queue  # max_queue: 0 = no bound
        self.default_eos, self.cancel_poll_s = frozenset(eos_ids), cancel_poll_s
        self.vocab = len(tokenizer)
        # our intake; TensorRT-LLM samples and masks (guided decoding) itself
        self.intake = Intake(tokenizer, limits, self.vocab, self.default_eos, own_sampling=False)
        self._listeners: List[Callable[[StepOutcome], None]] = []  # add_outcome_listener: the metrics publisher
        self._counts = ServiceStats()
        self.spec = drafter.iteration_drafter.spec
        self.spec.on_outcome = _Tee(self.spec.on_outcome, self._outcome)
        drafter.in_flight = self._in_flight  # the policy's queue length: in flight minus TensorRT-LLM's active
        self._aloop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._tasks: set = set()
        self._draining = False
        self._stop_message = "the server is shutting down"

    @classmethod
    def from_config(cls, cfg: ServerConfig, root: Path, **build_kwargs) -> "TrtllmService":
        ckpt = cfg.resolve(cfg.checkpoint, root)
        tok = hf_tokenizer.load(ckpt)
        eos_ids = end_tokens(json.loads((ckpt / "config.json").read_text()).get("eos_token_id"), tok)
        llm, drafter = build_llm(cfg, root, **build_kwargs)
        return cls(llm, drafter, tok, Limits(max_new_tokens_limit=cfg.max_tokens_limit, max_context=cfg.max_context),
                   eos_ids, max_batch=cfg.max_batch, max_queue=cfg.max_queue or 4 * cfg.max_batch)

    def _in_flight(self) -> int:
        return len(self._tasks)

    # -- what the metrics publisher reads (backend/frontend/metrics.py; observe.py) ------------------------
    def _outcome(self, outcome: StepOutcome) -> None:  # TensorRT-LLM's executor thread, once per iteration
        self._counts.outcome(outcome)
        for listener in self._listeners:
            listener(outcome)

    def add_outcome_listener(self, listener: Callable[[StepOutcome], None]) -> None:
        """Call `listener(outcome)` after every closed iteration (on the executor thread)."""
        self._listeners.append(listener)

    @property
    def stats(self) -> LoopStats:
        st = self._counts.stats
        st.drafter_errors = self.drafter.hook_errors + self.spec.drafter_errors
        memory = getattr(self.spec, "memory", None)  # MemorySpeculator (build_speculator) applies park/reload
        if memory is not None:
            st.drafter_parks, st.drafter_reloads = memory.parks, memory.reloads
        return st

    @property
    def running(self) -> range:
        """Requests TensorRT-LLM scheduled in its latest iteration (only the length means anything)."""
        return range(running_and_waiting(len(self._tasks), self.drafter.last)[0])

    @property
    def queue_depth(self) -> int:
        return running_and_waiting(len(self._tasks), self.drafter.last)[1]

    @property
    def pool(self) -> KvPool:
        last = self.drafter.last
        return KvPool(last.kv_total, last.kv_free, last.tokens_per_block)

    @property
    def drafters(self) -> dict:
        return self.spec.drafters

    @property
    def finished(self) -> int:
        return self._counts.stats.finished

    @property
    def cancelled(self) -> int:
        return self._counts.stats.cancelled

    # -- serving (the Triton adapter) ---------------------------------------------------------
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

    @property
    def idle(self) -> bool:
        return not self._tasks

    def drain(self, seconds: float) -> None:
        """Shutdown begins (backend/frontend/triton_models/drain.py DrainWatcher): refuse new requests at once, let
        those in flight run for `seconds`, then end them with a final error."""
        if self._draining:
            return
        self._draining = True
        self._stop_message = ErrorKind.SHUTTING_DOWN.message("the request was stopped before it finished; retry")
        if self._aloop is not None:
            self._aloop.call_soon_threadsafe(self._aloop.call_later, max(0.0, seconds), self._cancel_tasks)

    def tokenize(self, req: GenerationRequest) -> List[int]:
        return prompt_ids(self.tok, req)

    def submit(self, req: GenerationRequest, sink) -> int:
        """Admit (backend/loop/intake.py: ShuttingDown, Overloaded or RequestError if refused) and
        start serving."""
        if req.guide is not None:  # TensorRT-LLM masks with the grammar; ours only cuts and proposes drafts
            if self.drafter.guides is None:
                raise RequestError("structured output is off on this server: its TensorRT-LLM settings have "
                                   "guided_decoding_backend null (docs/trtllm.md)")
            problem = guide_problem(req.guide)
            if problem:
                raise RequestError(problem)
        seq = self.intake.sequence(req, sink, draining=self._draining, queue_depth=self.queue_depth,
                                   max_queue=self.max_queue)
        if req.bad_words_ids:  # our logits processors run in our loop only
            raise RequestError("bad_words_list is not served by the TensorRT-LLM service yet")
        if not req.sampling.greedy:
            req.seed = seq.seed  # TensorRT-LLM samples with the request's seed (sampling_params)
        if self._aloop is None:
            raise RuntimeError("TrtllmService.start() was not called")
        self._counts.admitted(len(seq.prompt_ids))
        self._aloop.call_soon_threadsafe(self._spawn, seq)
        return seq.seq_id

    # -- one request ---------------------------------------------------------------------------
    def _spawn(self, seq: Sequence) -> None:
        task = self._aloop.create_task(self.serve(seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_tasks(self) -> None:
        if self._tasks:
            log.warning("drain time is up: ending %d requests still in flight", len(self._tasks))
        for t in list(self._tasks):
            t.cancel()

    async def _cancel_all(self) -> None:
        self._cancel_tasks()

    async def serve(self, seq: Sequence) -> None:
        end_id = seq.request.end_id if seq.request.end_id is not None else min(self.default_eos)
        result = self.llm.generate_async(seq.prompt_ids, sampling_params=sampling_params(seq.request, end_id),
                                         streaming=True)
        counts = self._counts.stats
        last_poll = float("-inf")
        try:
            async for out in result:
                now = time.perf_counter()
                if now - last_poll >= self.cancel_poll_s:
                    last_poll = now
                    if seq.sink.cancelled():
                        result.abort()
                        seq.finish_reason = "cancelled"
                        counts.cancelled += 1
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
                counts.finished += 1
            seq.respond(final=True)
        except asyncio.CancelledError:
            result.abort()
            seq.sink.error(self._stop_message)
            raise
        except Exception as e:  # one failing request never takes the others down
            log.exception("request %d failed on TensorRT-LLM", seq.seq_id)
            try:
                result.abort()
            except Exception:
                pass
            # no internals to the client (the log has them), as our loop does
            seq.sink.error(f"{ErrorKind.INTERNAL.prefix} while running this request; see the server log")
        finally:
            self.drafter.forget(result.request_id)
