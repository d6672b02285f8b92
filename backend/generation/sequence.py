"""One request's state inside the engine loop, and the sink it answers through."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Protocol

import torch

from .detokenizer import IncrementalDetokenizer
from .request import GenerationRequest
from .stopping import find_stop, holdback


@dataclass
class Chunk:
    """What one response carries."""

    text: str
    num_input_tokens: int
    num_output_tokens: int  # cumulative
    num_draft_tokens: int  # cumulative
    num_accepted_tokens: int  # cumulative
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | None
    output_log_probs: Optional[List[float]] = None  # return_log_probs: this response's tokens' log probs
    output_token_ids: Optional[List[int]] = None  # return_log_probs: those tokens' ids
    top_token_ids: Optional[List[List[int]]] = None  # return_top_log_probs: k most likely ids per token
    top_log_probs: Optional[List[List[float]]] = None  # return_top_log_probs: their log probs
    cum_log_prob: float = 0.0  # return_log_probs: sum over every generated token so far
    perf: Optional[dict] = None  # return_perf_metrics: TensorRT-LLM's per-request metrics
    output_ids: Optional[List[int]] = None  # return_output_ids: new ids (streaming), else the whole sequence


class ResponseSink(Protocol):
    """Where a sequence's responses go (Triton response sender, or a test list)."""

    def send(self, chunk: Chunk, final: bool) -> None: ...

    def error(self, message: str) -> None: ...  # final error response

    def cancelled(self) -> bool: ...


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request: GenerationRequest
    sink: ResponseSink
    prompt_ids: List[int]
    tokens: List[int]  # committed: prompt + generated
    detok: IncrementalDetokenizer
    eos_ids: frozenset
    generator: Optional[torch.Generator] = None  # model drafters' rejection sampling
    seed: int = 0  # the request's random_seed (or a random one): per-position sampling streams
    slot: int = -1
    kv_len: int = 0  # tokens in the target KV cache; tokens[kv_len:] is the one pending token
    drafted: int = 0
    accepted: int = 0
    sent_chars: int = 0
    finish_reason: Optional[str] = None
    arrival_s: float = 0.0
    first_token_s: Optional[float] = None
    stop_at: Optional[int] = field(default=None)  # char index where a stop word begins
    preemptions: int = 0  # times it left the batch for lack of KV blocks (and was recomputed)
    joined: bool = False  # its first prefill completed: the speculator (policy, drafters) knows it
    processor: Any = None  # backend.generation.logits_processors.LogitsProcessor / guided.GuidedProcessor, or None
    guide: Any = None  # backend.generation.guided.GuideState: the grammar its output must match, or None
    log_probs: List[float] = field(default_factory=list)  # return_log_probs: one per generated token
    top_ids: List[List[int]] = field(default_factory=list)  # return_top_log_probs: per generated token
    top_log_probs: List[List[float]] = field(default_factory=list)
    sent_log_probs: int = 0  # log_probs already sent (streaming)
    sent_ids: int = 0  # generated ids already sent as output_ids (streaming)
    arrival_ns: int = field(default_factory=time.time_ns)  # wall clock, for return_perf_metrics
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    kv_block_size: int = 16  # the KV pool's block size: return_perf_metrics counts blocks
    reused_tokens: int = 0  # prompt tokens copied from cached cells at admission (KV reuse), not prefilled

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def prefill_ids(self) -> List[int]:
        """What a prefill caches: the prompt, or after a preemption every token but the pending one."""
        return self.tokens[:-1] if self.generated > 0 else self.prompt_ids

    @property
    def prefill_len(self) -> int:
        """len(prefill_ids), without the copy."""
        return len(self.tokens) - 1 if self.generated > 0 else len(self.prompt_ids)

    @property
    def prefilling(self) -> bool:
        """Admitted, its prefill (in chunks) not yet complete: it takes no part in steps."""
        return self.kv_len < self.prefill_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, new_tokens: List[int], max_context: int, log_probs: Optional[tuple] = None) -> None:
        """Commit emitted tokens, stopping at EOS, max_tokens, context or a stop word (log_probs:
        verifier.log_probs_of's (each token's log prob, its top alternatives or None), kept
        for the tokens committed)."""
        before = len(self.tokens)
        self._append(new_tokens, max_context)
        if log_probs is not None:
            kept = len(self.tokens) - before
            values, top = log_probs
            self.log_probs.extend(values[:kept])
            if top is not None:
                self.top_ids.extend(top[0][:kept])
                self.top_log_probs.extend(top[1][:kept])
        if len(self.tokens) > before:
            self.last_token_ns = time.time_ns()
            if not self.first_token_ns:
                self.first_token_ns = self.last_token_ns

    def _append(self, new_tokens: List[int], max_context: int) -> None:
        req = self.request
        for t in new_tokens:
            if t in self.eos_ids:
                self.finish_reason = "stop"
                break
            self.tokens.append(t)
            self.detok.push([t])
            if req.stop_words_ids and any(0 < len(w) <= self.generated and self.tokens[-len(w):] == list(w)
                                           for w in req.stop_words_ids):
                self.finish_reason = "stop"  # a token-level stop word stays in the output, as in TensorRT-LLM
                break
            if req.stop_words:
                at = find_stop(self.detok.text, req.stop_words, self.sent_chars)
                if at is not None:
                    self.stop_at, self.finish_reason = at, "stop"
                    break
            if self.generated >= req.max_new_tokens or len(self.tokens) >= max_context:
                self.finish_reason = "length"
                break
        if self.finished and self.stop_at is None:
            self.detok.flush()

    def chunk(self, finish: bool = False) -> Chunk:
        """Text not yet sent (holding back a possible stop-word start), as a Chunk."""
        text = self.detok.text
        end = self.stop_at if self.stop_at is not None else len(text)
        if not finish and not self.finished and self.request.stop_words:
            end -= holdback(text[:end], self.request.stop_words)
        delta = text[self.sent_chars: max(end, self.sent_chars)]
        self.sent_chars = max(end, self.sent_chars)
        return Chunk(text=delta, num_input_tokens=len(self.prompt_ids), num_output_tokens=self.generated,
                     num_draft_tokens=self.drafted, num_accepted_tokens=self.accepted,
                     finish_reason=self.finish_reason)

    def respond(self, final: bool) -> None:
        """Send what the client should see now: a streaming chunk (if it has text, or is the
        last), or the whole output once finished (with the prompt unless excluded, as in
        TensorRT-LLM). Raises whatever the sink raises."""
        if self.request.stream:
            chunk = self.chunk(finish=final)
            new_ids = self.request.return_output_ids and self.generated > self.sent_ids
            if chunk.text or final or new_ids:
                self.sink.send(self._extras(chunk), final)
        elif final:
            chunk = self.chunk(finish=True)
            chunk.text = self.output_text()
            if not self.request.exclude_input_in_output:
                chunk.text = self.request.prompt + chunk.text
            self.sink.send(self._extras(chunk), True)

    def _extras(self, chunk: Chunk) -> Chunk:
        """The outputs the request asked for besides the text: the log probs (ids, top alternatives)
        of the tokens not yet sent, and the perf metrics."""
        req = self.request
        if req.return_output_ids:  # TensorRT-LLM's output_ids: streamed, the new ids; else the prompt's too
            start = len(self.prompt_ids) + self.sent_ids if req.stream else len(self.prompt_ids)
            if not req.stream and not req.exclude_input_in_output:
                start = 0
            chunk.output_ids = self.tokens[start:]
            self.sent_ids = self.generated
        if req.return_log_probs:
            sent, start = self.sent_log_probs, len(self.prompt_ids)
            chunk.output_log_probs = self.log_probs[sent:]
            chunk.output_token_ids = self.tokens[start + sent: start + len(self.log_probs)]
            if req.return_top_log_probs:
                chunk.top_token_ids, chunk.top_log_probs = self.top_ids[sent:], self.top_log_probs[sent:]
            chunk.cum_log_prob = float(sum(self.log_probs))
            self.sent_log_probs = len(self.log_probs)
        if req.return_perf_metrics:
            chunk.perf = {"acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
                          "total_draft_tokens": self.drafted, "total_accepted_draft_tokens": self.accepted,
                          "arrival_time_ns": self.arrival_ns, "first_scheduled_time_ns": self.scheduled_ns,
                          "first_token_time_ns": self.first_token_ns, "last_token_time_ns": self.last_token_ns,
                          **self._kv_blocks()}
        return chunk

    def _kv_blocks(self) -> dict:
        """TensorRT-LLM's per-request KV block counts: the blocks its tokens fill, of which those
        its prompt took whole from cached cells (KV reuse) and those allocated new."""
        total = -(-len(self.tokens) // self.kv_block_size)
        reused = min(self.reused_tokens // self.kv_block_size, total)
        return {"kv_cache_alloc_total_blocks": total, "kv_cache_reused_blocks": reused,
                "kv_cache_alloc_new_blocks": total - reused}

    def output_text(self) -> str:
        end = self.stop_at if self.stop_at is not None else len(self.detok.text)
        return self.detok.text[:end]
