"""The speculation component inside TensorRT-LLM's per-iteration drafter hook.

NOT YET RUN ON A GPU. Written against TensorRT-LLM 1.2.x (the release/1.2 line,
PyTorch backend) and tested only against a fake `tensorrt_llm` shaped after those
sources (tests/backend/services/trtllm/, which records the upstream names it relies on).

TensorRT-LLM's PyExecutor owns scheduling, the paged KV cache, verification and
streaming. With `speculative_config=UserProvidedDecodingConfig(max_draft_len=N,
drafter=AdaptiveDrafter(...))` each iteration runs (1.2's py_executor.py, see
tests/backend/services/trtllm/upstream_api.json):

    n = drafter.get_draft_len_for_batch_size(len(active_requests))   # before scheduling
    drafter.update_max_total_draft_tokens(n); speculation is off this iteration if n == 0
    schedule; generation requests get py_draft_tokens = [0] * n placeholders
    if on: drafter.prepare_draft_tokens(scheduled_requests, resource_manager)
           drafter.pad_draft_tokens_for_cuda_graph(scheduled_requests)   # pads to N with 0s
    forward (N + 1 positions per generation request when on, 1 when off), sample, commit

`get_draft_len_for_batch_size` is 1.2's dynamic draft length lookup (read only when the
drafter has a `draft_len_schedule`, so ours has one). Ours answers it with the policy: it
first closes the previous iteration (its tokens are committed by now), then asks
`policy.speculates_at(batch size, waiting requests, KV headroom)`; no means 0, an iteration
without speculation: no drafts, no padding, a plain decoding step on the GPU. Yes means N:
1.2 pads every draft to the static N (`_static_max_total_draft_tokens`) and its model engine
verifies N + 1 positions (`runtime_draft_len`) whatever the schedule says, so a length
between 1 and N - 1 would change nothing on the GPU but the drafter's placeholders (and
could under-allocate their KV), and the iteration verifies N.

What `prepare_draft_tokens` reads and sets:
  reads   scheduled_requests.generation_requests (context requests are not drafted for),
          per request `py_request_id`, `py_client_id`, `get_tokens(0)` (prompt + committed
          tokens), `py_orig_prompt_len`, `py_max_new_tokens`, `sampling_config`
          (temperature / top_k / top_p), `state`; the KV cache manager's
          `get_kv_cache_stats()` (`free_num_blocks`, `max_num_blocks`);
  runs    `policy.external.IterationDrafter.step`: asks the policy for (drafter, gamma)
          per request and drafts with our drafters, cut where a guided request's grammar
          (`guided_decoding_params`, followed by guides.RequestGuides) refuses them;
  sets    `request.py_draft_tokens` = the draft (0..N tokens; shorter drafts are padded
          with token 0, which the target accepts only where it predicts 0: still lossless).
The waiting requests the policy sees are the serving layer's count (`in_flight`, set by
TrtllmService: requests submitted and not finished) minus the executor's active ones.

Requests that finished or were cancelled are not scheduled again; the requests seen the
previous iteration are kept by reference, and those now in state GENERATION_COMPLETE are
handed to the speculator as finished (their final tokens close their last step), so the
drafters and the policy forget them. A request that is merely not scheduled (paused for
lack of KV blocks) is treated as gone and rejoins when it comes back.

Run TensorRT-LLM with `disable_overlap_scheduler=True`: with the overlap scheduler the
hook runs before the previous iteration's tokens are committed, which breaks the
"committed since the last iteration" inference (upstream tests the user-provided drafter
only without it).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from policy.external import Generating, IterationDrafter
from policy.types import StepOutcome

from . import _api

log = logging.getLogger("specserve.trtllm")

_MAX_STATS = 4096  # per-request counters kept for the serving layer (oldest dropped beyond this)


def _first(value):
    """Sampling-config fields are optional vectors in the bindings (one value per beam)."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def request_temperature(sampling_config) -> float:
    """The request's sampling temperature as the policy sees it; 0.0 means greedy.
    TensorRT-LLM samples greedily when top_k is 1, temperature is 0, or nothing is set."""
    if sampling_config is None:
        return 0.0
    t, k, p = _first(sampling_config.temperature), _first(sampling_config.top_k), _first(sampling_config.top_p)
    if k == 1 or t == 0 or (t is None and not k and p is None):
        return 0.0
    return float(t) if t is not None else 1.0


def _is_dummy(request) -> bool:
    """Padding requests TensorRT-LLM adds itself (attention DP, CUDA graphs): not ours to draft for."""
    return bool(getattr(request, "is_attention_dp_dummy", False) or getattr(request, "is_cuda_graph_dummy", False))


def _generating(request) -> Generating:
    return Generating(request_id=int(request.py_request_id), tokens=[int(t) for t in request.get_tokens(0)],
                      prompt_len=int(request.py_orig_prompt_len), max_new_tokens=int(request.py_max_new_tokens),
                      temperature=request_temperature(request.sampling_config))


def kv_blocks(resource_manager) -> Tuple[int, int, int]:
    """(free, total, tokens per block) of the target's KV cache; zeros when TensorRT-LLM shows none."""
    if resource_manager is None:
        return 0, 0, 0
    manager = resource_manager.get_resource_manager(_api.kv_cache_manager_type())
    if manager is None:
        return 0, 0, 0
    stats = manager.get_kv_cache_stats()
    return int(stats.free_num_blocks), int(stats.max_num_blocks), int(stats.tokens_per_block)


class Iteration(NamedTuple):
    """What the hook saw of the latest iteration (read by the serving layer's metrics)."""
    context: int = 0  # context (prefill) requests scheduled
    generation: int = 0  # generation requests scheduled (dummies excluded)
    kv_free: int = 0
    kv_total: int = 0
    tokens_per_block: int = 0
    at_s: float = 0.0  # time.monotonic() of the hook call


class _Tee:
    """Outcome callback chain (a class, not a closure: the drafter must pickle, since
    TensorRT-LLM ships the speculative config to its worker process unless
    TLLM_WORKER_USE_SINGLE_PROCESS=1)."""

    def __init__(self, first, then):
        self.first, self.then = first, then

    def __call__(self, outcome: StepOutcome) -> None:
        self.first(outcome)
        if self.then is not None:
            self.then(outcome)


class AdaptiveDrafterLogic:
    """The hook's logic; `AdaptiveDrafter` is this on top of TensorRT-LLM's `Drafter` base
    (built when first asked for, since the base is only importable in the container).

    NOT YET RUN ON A GPU. Inside the TensorRT-LLM container (serving.build_llm does this):

        drafter = AdaptiveDrafter(IterationDrafter(Speculator(policy, drafters, lookahead=True), max_draft_len=8))
        LLM(model, speculative_config=UserProvidedDecodingConfig(max_draft_len=8, drafter=drafter),
            disable_overlap_scheduler=True)
    """

    def __init__(self, iteration_drafter: IterationDrafter, max_draft_len: Optional[int] = None, *,
                 max_concurrency: Optional[int] = None):
        n = iteration_drafter.max_draft_len if max_draft_len is None else int(max_draft_len)
        if n <= 0:
            raise ValueError(f"max_draft_len must be positive, got {n}")
        # Upstream 1.2: pad_draft_tokens_for_cuda_graph pads to max_total_draft_tokens, so both are set;
        # a draft_len_schedule makes the executor ask get_draft_len_for_batch_size every iteration.
        super().__init__(max_draft_len=n, max_total_draft_tokens=n, max_concurrency=max_concurrency,
                         draft_len_schedule={1: n})
        self.iteration_drafter = iteration_drafter
        self.static_len = n
        self.draft_cap = min(n, iteration_drafter.max_draft_len)
        self.in_flight: Optional[Callable[[], int]] = None  # the serving layer's requests in flight
        self.iteration_lengths: "collections.Counter[int]" = collections.Counter()  # length answered -> count
        self._waiting = 0  # requests waiting, as counted at the latest iteration's start
        self._fresh: Dict[int, Generating] = {}  # request id -> its Generating view read at this iteration's start
        self.hook_errors = 0
        self.last = Iteration()
        self._seen: Dict[int, object] = {}  # request id -> the LlmRequest scheduled last iteration
        self._lock = threading.Lock()
        self._stats: "collections.OrderedDict[int, List[int]]" = collections.OrderedDict()  # id -> [drafted, accepted]
        self._client_ids: Dict[int, int] = {}  # LLM API request id (client id) -> executor request id
        self.guides = None  # guides.RequestGuides when structured output is served (guides.bind)
        spec = iteration_drafter.spec
        spec.on_outcome = _Tee(self._count, spec.on_outcome)

    # -- the hooks ---------------------------------------------------------------------------
    def get_draft_len_for_batch_size(self, batch_size: int) -> int:
        """The iteration's draft length, asked before TensorRT-LLM schedules or pads anything:
        0 (no speculation: a plain decoding step) or the static length it verifies."""
        try:
            self._close_previous()
            self._waiting = max(0, self.in_flight() - batch_size) if self.in_flight is not None else 0
            last = self.last
            on = self.iteration_drafter.spec.policy.speculates_at(
                batch_size, queue_len=self._waiting, kv_free_blocks=last.kv_free, kv_total_blocks=last.kv_total)
        except Exception:  # never take the executor loop down: no speculation this iteration
            self.hook_errors += 1
            log.exception("the speculation component failed; no speculation this iteration")
            on = False
        n = self.static_len if on else 0
        self.iteration_lengths[n] += 1
        return n

    def _close_previous(self) -> None:
        """Learn from the previous iteration now that its tokens are committed: the next one may
        run without the hook (speculation off), and its plain tokens are not the drafts' verdict.
        Requests that completed leave now (and `_seen`). Reading a request's tokens copies them
        all, so it is done only where needed, once an iteration: the generating requests' views
        are kept for `prepare_draft_tokens` in the same iteration (nothing commits in between)."""
        done = _api.generation_complete_state()
        finished = [rid for rid, r in self._seen.items() if r.state == done]
        if not finished and not self.iteration_drafter.pending:
            return
        self._fresh = {rid: _generating(r) for rid, r in self._seen.items() if r.state != done}
        self.iteration_drafter.close(list(self._fresh.values()), [_generating(self._seen.pop(rid)) for rid in finished])

    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None:
        requests = [r for r in scheduled_requests.generation_requests if not _is_dummy(r)]
        try:
            drafts = self._drafts(scheduled_requests, requests, resource_manager)
        except Exception:  # never take TensorRT-LLM's executor loop down: no speculation this iteration
            self.hook_errors += 1
            log.exception("the speculation component failed; no drafts this iteration")
            drafts = {}
        for r in requests:
            r.py_draft_tokens = [int(t) for t in drafts.get(int(r.py_request_id), ())][: self.draft_cap]

    def _drafts(self, scheduled_requests, requests, resource_manager) -> Dict[int, List[int]]:
        fresh, self._fresh = self._fresh, {}
        generating = [fresh.get(int(r.py_request_id)) or _generating(r) for r in requests]
        now = {g.request_id for g in generating}
        done = _api.generation_complete_state()
        finished = [_generating(r) for rid, r in self._seen.items() if rid not in now and r.state == done]
        self._seen = {g.request_id: r for g, r in zip(generating, requests)}
        for g, r in zip(generating, requests):
            client = getattr(r, "py_client_id", None)
            if client is not None:
                self._client_ids[int(client)] = g.request_id
        if self.guides is not None:  # the guided requests' grammars, for the speculator's trim and the grammar drafter
            self.guides.follow(requests)
        free, total, per_block = kv_blocks(resource_manager)
        n_context = len(scheduled_requests.context_requests)
        self.last = Iteration(n_context, len(requests), free, total, per_block, time.monotonic())
        return self.iteration_drafter.step(generating, finished=finished, kv_free_blocks=free, kv_total_blocks=total,
                                           queue_len=self._waiting)

    def finish(self) -> Optional[StepOutcome]:
        """Close the last iteration (at shutdown): requests seen last that have since completed
        close their last step from their final tokens."""
        done = _api.generation_complete_state()
        finished = [_generating(r) for r in self._seen.values() if r.state == done]
        self._seen = {}
        return self.iteration_drafter.finish(finished)

    def __getstate__(self):  # the lock does not pickle; everything else must (see _Tee)
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["in_flight"] = None  # the serving layer's count stays in its process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- per-request counters for the serving layer ---------------------------------------------
    def _count(self, outcome: StepOutcome) -> None:
        with self._lock:
            for s in outcome.sequences:
                st = self._stats.get(s.seq_id)
                if st is None:
                    st = self._stats[s.seq_id] = [0, 0]
                    while len(self._stats) > _MAX_STATS:
                        old, _ = self._stats.popitem(last=False)
                        self._client_ids = {c: r for c, r in self._client_ids.items() if r != old}
                st[0] += s.gamma
                st[1] += s.accepted

    def request_stats(self, client_id: int) -> Tuple[int, int]:
        """(draft tokens proposed, accepted) so far for the LLM API request `client_id`; (0, 0)
        when unknown (e.g. the drafter runs in TensorRT-LLM's worker process)."""
        with self._lock:
            rid = self._client_ids.get(int(client_id))
            st = self._stats.get(rid) if rid is not None else None
            return (st[0], st[1]) if st else (0, 0)

    def forget(self, client_id: int) -> None:
        with self._lock:
            rid = self._client_ids.pop(int(client_id), None)
            if rid is not None:
                self._stats.pop(rid, None)


_CLASSES: Dict[type, type] = {}


def adaptive_drafter_class() -> type:
    """`AdaptiveDrafter(AdaptiveDrafterLogic, tensorrt_llm...Drafter)`, built once per base class."""
    base = _api.drafter_base()
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("AdaptiveDrafter", (AdaptiveDrafterLogic, base),
                   {"__module__": __name__, "__qualname__": "AdaptiveDrafter", "__doc__": AdaptiveDrafterLogic.__doc__})
        _CLASSES[base] = cls
    return cls


def __getattr__(name: str):
    # `from backend.services.trtllm.drafter import AdaptiveDrafter` (and unpickling in TensorRT-LLM's
    # worker process) resolve the class lazily, against whichever `tensorrt_llm` is importable.
    if name == "AdaptiveDrafter":
        return adaptive_drafter_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
