"""A fake TensorRT-LLM 1.2 PyExecutor on the torch engine: every behaviour our drafter hook can
notice, each copied from the upstream file named (index ids: tests/backend/services/trtllm/upstream_api.json).

One iteration (`step`), as PyExecutor._executor_loop with disable_overlap_scheduler=True:
  1. fetch (executor_request_queue): new requests become active, as context requests, while
     slots are free (max_batch_size); cancel ids sent since the last iteration are received.
  2. _prepare_and_schedule_batch (py_executor.py, index id 3542389387): with a draft_len_schedule
     on the drafter, max_total_draft_tokens = drafter.get_draft_len_for_batch_size(len(active))
     and drafter.update_max_total_draft_tokens(it); 0 switches speculation off for the
     iteration, else drafter.should_use_spec_decode(active, max_batch_size, max_num_tokens,
     max_total_draft_tokens) decides; generation requests get [0] * max_total_draft_tokens
     placeholders (or [] when off); the batch mixes this iteration's context requests (whole
     prompts, or chunks of `chunk` tokens: chunked prefill) with the generation requests.
  3. only when speculation is on: drafter.prepare_draft_tokens(batch, resource_manager), then
     drafter.pad_draft_tokens_for_cuda_graph(batch) (drafter.py: pads to the static length).
  4. one forward over context chunks and generation requests (1 + len(py_draft_tokens) each;
     model_engine.py: runtime_draft_len is the static length or 0).
  4b. guided decoding (guided_decoder.py, GuidedDecoder._build with the llguidance matcher factory
     of grammar_matcher.py), for requests with guided_decoding_params when a tokenizer is given:
     row 0 of a request is masked with its grammar after the committed tokens, row i after the
     drafts before it while the grammar accepts them; rows after a refused draft (or after the
     grammar's end) are not masked. Upstream advances one matcher and rolls it back after
     verification; here the matcher follows the committed tokens and drafts go on a copy (the
     same masks).
  5. sampling (sampler.py, index id 9889077999, no draft logits: _process_draft_tokens_greedy):
     the target's token at every verified position is its argmax (greedy) or a sample from
     softmax(logits / T) after top-k (a seeded generator per request); drafts are accepted while
     they equal it; py_num_accepted_draft_tokens and py_rewind_len = drafts - accepted are set
     and the rejected positions are rewound (here: the cached length is the committed one).
  6. finished requests get GENERATION_COMPLETE and leave; then _handle_canceled_requests: the
     cancels received at this iteration's fetch end their requests now, one iteration after
     the abort.
Request ids start at max_batch_size (the executor's queue); the LLM API's client id is another
number (its own counter from 1) and is what `submit`, `add_request`, `abort`, `request` and
`done` use. Objects handed to the hook pass through the fake's attribute recorder."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from own_loop import commit_tokens


@dataclass
class Running:
    client_id: int
    request: object  # the fake LlmRequest (its _tokens list is the committed tokens)
    prompt_len: int
    max_new: int
    end_id: Optional[int]
    temperature: float = 0.0
    top_k: Optional[int] = None
    generator: Optional[torch.Generator] = None
    slot: Optional[int] = None
    prefilled: int = 0  # prompt tokens in the cache so far (context phase)
    finish_reason: Optional[str] = None  # "length" | "stop" | "cancelled"

    @property
    def tokens(self) -> List[int]:
        return self.request._tokens

    @property
    def generated(self) -> List[int]:
        return self.tokens[self.prompt_len:]

    @property
    def rid(self) -> int:
        return self.request.py_request_id


@dataclass
class IterationRecord:
    batch_size: int  # active requests when the iteration was prepared
    spec_on: bool
    context: int  # context requests scheduled
    set_lengths: List[int] = field(default_factory=list)  # per generation request: what the hook set
    real: List[bool] = field(default_factory=list)  # per generation request: not a dummy
    verified: List[int] = field(default_factory=list)  # per generation request: draft positions verified


class FakePyExecutor:
    def __init__(self, engine, drafter, max_draft_len: int, *, tokens_per_block: int = 8, dummy: bool = False,
                 chunk: Optional[int] = None, max_num_tokens: int = 8192, tokenizer=None):
        from tensorrt_llm import _fake
        from tensorrt_llm._torch.pyexecutor import llm_request, resource_manager, scheduler

        self._fake, self._req, self._rm, self._sched = _fake, llm_request, resource_manager, scheduler
        self.engine, self.drafter, self.max_draft_len = engine, drafter, max_draft_len
        self.tokens_per_block, self.dummy, self.chunk = tokens_per_block, dummy, chunk
        self.max_batch_size, self.max_num_tokens = engine.max_slots, max_num_tokens
        self.waiting: List[Running] = []
        self.active: List[Running] = []
        self.done: Dict[int, Running] = {}  # client id -> finished or cancelled
        self._cancel_sent: set = set()  # client ids aborted since the last fetch
        self._cancel_received: set = set()
        self._request_ids = itertools.count(self.max_batch_size)  # executor_request_queue: ids from max_batch_size
        self._client_ids = itertools.count(1)  # the LLM API's own ids
        self.iterations: List[IterationRecord] = []
        self.kv_reported: List[tuple] = []
        self.drafted = self.accepted = 0
        self.guided = FakeGuidedDecoder(tokenizer, engine) if tokenizer is not None else None

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt_ids, max_new: int, end_id: Optional[int] = None, client_id: Optional[int] = None,
                    temperature: Optional[float] = None, top_k: Optional[int] = None,
                    seed: Optional[int] = None, guide=None) -> int:
        """Queue a request; its client id (the LLM API's request id) is returned."""
        cid = next(self._client_ids) if client_id is None else client_id
        q = self._req.LlmRequest(next(self._request_ids), list(prompt_ids), max_new,
                                 self._req.SamplingConfig(temperature, top_k), client_id=cid,
                                 end_id=-1 if end_id is None else end_id, guided_decoding_params=guide)
        greedy = top_k == 1 or not temperature
        gen = None if greedy else torch.Generator().manual_seed(cid if seed is None else seed)
        self.waiting.append(Running(cid, q, len(prompt_ids), max_new, end_id, 0.0 if greedy else float(temperature),
                                    top_k, gen))
        return cid

    def submit(self, prompt_ids, sampling_params) -> int:
        """From the fake LLM.generate_async."""
        from tensorrt_llm.sampling_params import executor_guide
        return self.add_request(prompt_ids, sampling_params.max_tokens, end_id=sampling_params.end_id,
                                top_k=sampling_params.top_k, temperature=sampling_params.temperature,
                                seed=sampling_params.seed, guide=executor_guide(sampling_params))

    def abort(self, client_id: int) -> None:
        """LLM API abort -> executor cancel_request: acted on at the end of the next iteration."""
        self._cancel_sent.add(client_id)

    cancel = abort

    def request(self, client_id: int) -> Running:
        if client_id in self.done:
            return self.done[client_id]
        for r in self.active + self.waiting:
            if r.client_id == client_id:
                return r
        raise KeyError(client_id)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    # -- views for the tests ------------------------------------------------------------------------
    @property
    def set_lengths(self) -> List[List[int]]:
        return [it.set_lengths for it in self.iterations if it.spec_on]

    @property
    def drafted_by_hook(self) -> int:
        """Draft tokens the hook set for real requests (before padding)."""
        return sum(sum(n for n, q in zip(it.set_lengths, it.real)) for it in self.iterations)

    @property
    def verified_lengths(self) -> List[List[int]]:
        return [it.verified for it in self.iterations]

    # -- one iteration --------------------------------------------------------------------------------
    def step(self) -> bool:
        """One executor iteration. False when there is nothing to run."""
        self._fetch()
        if not self.active:
            return False
        spec_on, context, generation = self._prepare_and_schedule()
        rec = IterationRecord(len(self.active), spec_on, len(context))
        gen_requests = [r.request for r in generation]
        if spec_on and self.drafter is not None:
            self._draft(context, generation, rec)
        rec.verified = [len(q.py_draft_tokens) for q in gen_requests]
        self.iterations.append(rec)
        self._forward_and_sample(context, generation)
        self._handle_canceled()
        return True

    def _fetch(self) -> None:
        self._cancel_received |= self._cancel_sent
        self._cancel_sent = set()
        for r in [r for r in self.waiting if r.client_id in self._cancel_received]:  # never started
            self.waiting.remove(r)
            self._end(r, "cancelled")
        free = [s for s in range(self.max_batch_size) if s not in {r.slot for r in self.active}]
        while self.waiting and free:
            r = self.waiting.pop(0)
            r.slot = free.pop(0)
            self.active.append(r)

    def _prepare_and_schedule(self):
        d = self.drafter
        max_total = self.max_draft_len
        if d is not None and d.draft_len_schedule is not None:
            max_total = d.get_draft_len_for_batch_size(len(self.active))
            d.update_max_total_draft_tokens(max_total)
        if d is None or (d.draft_len_schedule is not None and max_total == 0):
            spec_on = False
        else:
            spec_on = d.should_use_spec_decode([r.request for r in self.active], self.max_batch_size,
                                               self.max_num_tokens, max_total)
        GEN = self._req.LlmRequestState.GENERATION_IN_PROGRESS
        context = [r for r in self.active if r.request.state != GEN]
        generation = [r for r in self.active if r.request.state == GEN]
        for r in generation:  # _prepare_draft_requests
            r.request.py_draft_tokens = [0] * max_total if (max_total > 0 and spec_on) else []
        return spec_on, context, generation

    def _draft(self, context: List[Running], generation: List[Running], rec: IterationRecord) -> None:
        batch = self._sched.ScheduledRequests()
        batch.context_requests = [r.request for r in context]
        batch.generation_requests = [r.request for r in generation]
        if self.dummy:  # a CUDA-graph padding request the hook must leave alone
            dummy = self._req.LlmRequest(0, [1, 2, 3], 8, self._req.SamplingConfig())
            dummy.is_cuda_graph_dummy, dummy.state = True, self._req.LlmRequestState.GENERATION_IN_PROGRESS
            dummy.py_draft_tokens = [0] * self.drafter.max_total_draft_tokens
            batch.generation_requests.append(dummy)
        stats = self.kv_stats()
        self.kv_reported.append((stats.free_num_blocks, stats.max_num_blocks))
        managers = self._rm.ResourceManager({self._rm.ResourceManagerType.KV_CACHE_MANAGER:
                                             self._rm.KVCacheManager(lambda: stats)})
        self.drafter.prepare_draft_tokens(self._fake.record(batch), self._fake.record(managers))
        rec.set_lengths = [len(q.py_draft_tokens) for q in batch.generation_requests]
        rec.real = [not q.is_cuda_graph_dummy for q in batch.generation_requests]
        self.drafter.pad_draft_tokens_for_cuda_graph(batch)

    def kv_stats(self):
        total = self.engine.max_slots * self.engine.max_context // self.tokens_per_block
        used = sum(-(-(len(r.tokens) + self.max_draft_len) // self.tokens_per_block) for r in self.active)
        return self._rm.KvCacheStats(max_num_blocks=total, free_num_blocks=total - used, used_num_blocks=used,
                                     tokens_per_block=self.tokens_per_block)

    def _forward_and_sample(self, context: List[Running], generation: List[Running]) -> None:
        slots, starts, inputs, rows = [], [], [], []
        for r in context:
            n = len(r.tokens) - r.prefilled if self.chunk is None else min(self.chunk, len(r.tokens) - r.prefilled)
            slots.append(r.slot), starts.append(r.prefilled), inputs.append(r.tokens[r.prefilled: r.prefilled + n])
            rows.append([n - 1] if r.prefilled + n == len(r.tokens) else [])
        for r in generation:
            inp = [r.tokens[-1]] + list(r.request.py_draft_tokens)
            slots.append(r.slot), starts.append(len(r.tokens) - 1), inputs.append(inp)
            rows.append(list(range(len(inp))))
        logits = self.engine.forward(slots, starts, inputs, logit_rows=rows)
        at = 0
        for r, inp, rw in zip(context, inputs, rows):
            r.prefilled += len(inp)
            if rw:  # the prompt's last chunk: the first token, and the request starts generating
                r.request.state = self._req.LlmRequestState.GENERATION_IN_PROGRESS
                self._commit(r, self._targets(r, self._guide(r, logits[at: at + 1], [])))
            at += len(rw)
        for r in generation:
            draft = list(r.request.py_draft_tokens)
            target = self._targets(r, self._guide(r, logits[at: at + 1 + len(draft)], draft))
            at += 1 + len(draft)
            k = 0
            while k < len(draft) and draft[k] == target[k]:
                k += 1
            r.request.py_num_accepted_draft_tokens, r.request.py_rewind_len = k, len(draft) - k
            self.drafted += len(draft)
            self.accepted += k
            self._commit(r, target[: k + 1])

    def _guide(self, r: Running, logits: torch.Tensor, draft: List[int]) -> torch.Tensor:
        if self.guided is None or r.request.guided_decoding_params is None:
            return logits
        return self.guided.apply(r, logits, draft)

    def _targets(self, r: Running, logits: torch.Tensor) -> List[int]:
        """The target's token at each verified position: argmax, or a seeded sample."""
        if r.generator is None:
            return logits.argmax(-1).tolist()
        scaled = logits.float() / r.temperature
        if r.top_k:
            kth = scaled.topk(min(r.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        return torch.multinomial(torch.softmax(scaled, -1), 1, generator=r.generator)[:, 0].tolist()

    def _commit(self, r: Running, new: List[int]) -> None:
        if commit_tokens(r, new):
            self._leave(r)

    def _handle_canceled(self) -> None:
        for r in [r for r in self.active if r.client_id in self._cancel_received]:
            r.finish_reason = "cancelled"
            self._leave(r)
        self._cancel_received = set()  # received cancels are all acted on (or their request had ended)

    def _leave(self, r: Running) -> None:
        self.active.remove(r)
        self._end(r, r.finish_reason)

    def _end(self, r: Running, reason: str) -> None:
        r.finish_reason = reason
        r.request.state = self._req.LlmRequestState.GENERATION_COMPLETE
        if r.slot is not None:
            self.engine.truncate(r.slot, 0)
        self.done[r.client_id] = r

    def generate(self, prompts, max_new, **sampling) -> List[List[int]]:
        cids = [self.add_request(p, max_new[i] if isinstance(max_new, (list, tuple)) else max_new, **sampling)
                for i, p in enumerate(prompts)]
        while self.step():
            pass
        return [self.done[c].generated for c in cids]


class FakeGuidedDecoder:
    """Upstream's GuidedDecoder with its llguidance backend (step 4b of the module docstring): one
    matcher a request, made from its guided_decoding_params as LLGuidanceMatcherFactory.create
    makes it (EBNF_GRAMMAR is read as Lark)."""

    def __init__(self, tokenizer, engine):
        import llguidance.hf

        self.vocab = engine.shape.vocab
        self.ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.vocab)
        self.matchers: Dict[int, tuple] = {}  # request id -> (matcher, tokens it consumed)
        self.masked_rows = 0

    def _matcher(self, params):
        import llguidance

        kind, guide = params.guide_type.name, params.guide
        grammar = {"JSON": lambda: llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}'),
                   "JSON_SCHEMA": lambda: llguidance.LLMatcher.grammar_from_json_schema(guide),
                   "REGEX": lambda: llguidance.LLMatcher.grammar_from_regex(guide),
                   "EBNF_GRAMMAR": lambda: llguidance.LLMatcher.grammar_from_lark(guide)}[kind]()
        matcher = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"LLGuidance matcher error: {matcher.get_error()}")
        return matcher

    def _mask(self, matcher) -> torch.Tensor:
        import numpy as np

        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return torch.from_numpy(bits[: self.vocab].astype(bool))

    def apply(self, r: Running, logits: torch.Tensor, draft: List[int]) -> torch.Tensor:
        rid = r.rid
        if rid not in self.matchers:
            self.matchers[rid] = (self._matcher(r.request.guided_decoding_params), 0)
        matcher, consumed = self.matchers[rid]
        new = r.generated[consumed:]
        if new:
            assert matcher.consume_tokens(new), f"request {rid}: the grammar refused committed tokens {new}"
            self.matchers[rid] = (matcher, consumed + len(new))
        logits = logits.clone()
        probe = matcher.deep_copy()
        for row in range(logits.shape[0]):
            logits[row].masked_fill_(~self._mask(probe), float("-inf"))  # a finished grammar: the end token only
            self.masked_rows += 1
            # no mask after a draft the grammar refuses (verification rejects it) or after its end
            # token (upstream: the matcher is terminated)
            if row == len(draft) or probe.is_stopped() or not probe.consume_tokens([draft[row]]):
                break
        return logits
