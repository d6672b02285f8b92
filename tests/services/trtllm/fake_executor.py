"""A fake TensorRT-LLM PyExecutor: the shared own-loop stand-in (tests/own_loop.py) with the
1.2 executor's drafter protocol around it, per iteration (upstream py_executor.py):

    _prepare_draft_requests      py_draft_tokens = [0] * max_total_draft_tokens (placeholders)
    drafter.prepare_draft_tokens(scheduled_batch, resource_manager)    <- our AdaptiveDrafter
    drafter.pad_draft_tokens_for_cuda_graph(scheduled_batch)            pads to max with 0s
    forward + greedy verification (torch engine, fp32), commit, finished / cancelled requests
    get state GENERATION_COMPLETE and leave the batch.

Objects handed to the hook pass through the fake's attribute recorder. Requests come from
the fake LLM (`submit`, `abort`) or directly (`add_request`)."""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional

from own_loop import OwnLoopEngine, Running


class FakePyExecutor(OwnLoopEngine):
    def __init__(self, engine, drafter, max_draft_len: int, *, tokens_per_block: int = 8, dummy: bool = False):
        super().__init__(engine)
        from tensorrt_llm import _fake
        from tensorrt_llm._torch.pyexecutor import llm_request, resource_manager, scheduler

        self._fake, self._req, self._rm, self._sched = _fake, llm_request, resource_manager, scheduler
        self.drafter, self.max_draft_len, self.tokens_per_block = drafter, max_draft_len, tokens_per_block
        self.dummy = dummy  # add a CUDA-graph dummy request to every batch (the hook must leave it alone)
        self.llm_requests: Dict[int, object] = {}
        self.set_lengths: List[List[int]] = []  # per iteration: draft length the hook set per request
        self.verified_lengths: List[List[int]] = []  # per iteration: draft length verified (after padding)
        self.kv_reported: List[tuple] = []
        self._next_id = itertools.count(1)

    # -- requests -----------------------------------------------------------------------------
    def add_request(self, prompt_ids, max_new: int, end_id: Optional[int] = None, client_id: Optional[int] = None,
                    temperature: Optional[float] = None, top_k: Optional[int] = None) -> int:
        rid = next(self._next_id)
        r = self.add(rid, prompt_ids, max_new, end_id)
        q = self._req.LlmRequest(rid, list(prompt_ids), max_new, self._req.SamplingConfig(temperature, top_k),
                                 client_id=rid if client_id is None else client_id)
        q._tokens = r.tokens  # one token list: the executor commits, the request shows it
        self.llm_requests[rid] = q
        return rid

    def submit(self, prompt_ids, sampling_params) -> int:
        """From the fake LLM.generate_async (the LLM API's client id is the executor's id here)."""
        if sampling_params.top_k != 1 and sampling_params.temperature not in (None, 0):
            raise NotImplementedError("the fake verifies greedily only")
        return self.add_request(prompt_ids, sampling_params.max_tokens, end_id=sampling_params.end_id,
                                top_k=sampling_params.top_k, temperature=sampling_params.temperature)

    def abort(self, rid: int) -> None:
        self.cancel(rid)

    def request(self, rid: int) -> Running:
        if rid in self.done:
            return self.done[rid]
        for r in list(self.running.values()) + self.waiting:
            if r.rid == rid:
                return r
        raise KeyError(rid)

    # -- the drafter protocol -------------------------------------------------------------------
    def kv_stats(self):
        total = self.engine.max_slots * self.engine.max_context // self.tokens_per_block
        used = sum(-(-(len(r.tokens) + self.max_draft_len) // self.tokens_per_block) for r in self.running.values())
        return self._rm.KvCacheStats(max_num_blocks=total, free_num_blocks=total - used, used_num_blocks=used,
                                     tokens_per_block=self.tokens_per_block)

    def propose(self, running: List[Running], finished: List[Running]) -> Dict[int, List[int]]:
        reqs = [self.llm_requests[r.rid] for r in running]
        for q in reqs:
            q.state = self._req.LlmRequestState.GENERATION_IN_PROGRESS
            q.py_draft_tokens = [0] * self.max_draft_len  # _prepare_draft_requests
        batch = self._sched.ScheduledRequests()
        batch.generation_requests = list(reqs)
        if self.dummy:
            d = self._req.LlmRequest(0, [1, 2, 3], 8, self._req.SamplingConfig())
            d.is_cuda_graph_dummy, d.state = True, self._req.LlmRequestState.GENERATION_IN_PROGRESS
            d.py_draft_tokens = [0] * self.max_draft_len
            batch.generation_requests.append(d)
        stats = self.kv_stats()
        self.kv_reported.append((stats.free_num_blocks, stats.max_num_blocks))
        managers = self._rm.ResourceManager({self._rm.ResourceManagerType.KV_CACHE_MANAGER:
                                             self._rm.KVCacheManager(lambda: stats)})
        self.drafter.prepare_draft_tokens(self._fake.record(batch), self._fake.record(managers))
        self.set_lengths.append([len(q.py_draft_tokens) for q in batch.generation_requests])
        self.drafter.pad_draft_tokens_for_cuda_graph(batch)
        self.verified_lengths.append([len(q.py_draft_tokens) for q in reqs])
        return {q.py_request_id: list(q.py_draft_tokens) for q in reqs}

    def on_finish(self, r: Running) -> None:
        self.llm_requests[r.rid].state = self._req.LlmRequestState.GENERATION_COMPLETE

    def on_cancel(self, r: Running) -> None:
        self.llm_requests[r.rid].state = self._req.LlmRequestState.GENERATION_COMPLETE

    def generate(self, prompts, max_new) -> List[List[int]]:
        rids = [self.add_request(p, max_new[i] if isinstance(max_new, (list, tuple)) else max_new)
                for i, p in enumerate(prompts)]
        while self.step():
            pass
        return [self.done[rid].generated for rid in rids]
