"""One request's state inside the engine loop, and the sink it answers through."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol

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

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def prefill_ids(self) -> List[int]:
        """What a prefill caches: the prompt, or after a preemption every token but the pending one."""
        return self.tokens[:-1] if self.generated > 0 else self.prompt_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, new_tokens: List[int], max_context: int) -> None:
        """Commit emitted tokens, stopping at EOS, max_tokens, context or a stop word."""
        req = self.request
        for t in new_tokens:
            if t in self.eos_ids:
                self.finish_reason = "stop"
                break
            self.tokens.append(t)
            self.detok.push([t])
            if req.stop_words:
                at = find_stop(self.detok.text, req.stop_words, self.sent_chars)
                if at is not None:
                    self.stop_at, self.finish_reason = at, "stop"
                    break
            if self.generated >= req.max_tokens or len(self.tokens) >= max_context:
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
            if chunk.text or final:
                self.sink.send(chunk, final)
        elif final:
            chunk = self.chunk(finish=True)
            chunk.text = self.output_text()
            if not self.request.exclude_input_in_output:
                chunk.text = self.request.prompt + chunk.text
            self.sink.send(chunk, True)

    def output_text(self) -> str:
        end = self.stop_at if self.stop_at is not None else len(self.detok.text)
        return self.detok.text[:end]
