"""Generation requests as domain types, validated once at the boundary."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import FrozenSet, List, Optional, Sequence

from .guided import Guide
from .logits_processors import Penalties
from .sampling import SamplingParams
from ..wire import ErrorKind
# defined torch-free in their own modules (the token models import them alone); imported from here too
from .errors import Overloaded, RequestError, ShuttingDown  # noqa: F401
from .prompt import decode_utf8, prompt_ids  # noqa: F401


MIN_TEMPERATURE = 1e-6  # smallest positive temperature: logits / t stays finite in float32
MAX_TOP_LOG_PROBS = 20  # return_top_log_probs: alternatives per generated token (OpenAI's top_logprobs limit)
NO_END_ID = -1  # end_id -1: no end token, generate until max_tokens or a stop word (TensorRT-LLM's meaning)
MAX_CHARS_PER_TOKEN = 64  # a prompt longer than this x the context window cannot fit: refused before tokenizing


@dataclass(frozen=True)
class Limits:
    max_new_tokens_limit: int = 1024  # the server's: the largest max_new_tokens a request may ask for (max_tokens_limit)
    max_context: int = 2048  # prompt + output tokens per sequence


@dataclass
class GenerationRequest:
    prompt: str
    # tokens to generate at most: the wire's max_tokens, defaulted once, where the request enters
    # (ServerConfig.max_new_tokens); no default here, so nothing can generate a silent third length
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: Optional[int] = None
    stop_words: Sequence[str] = ()
    end_id: Optional[int] = None  # overrides the model's EOS token
    stream: bool = False
    exclude_input_in_output: bool = False
    apply_chat_template: bool = False
    penalties: Penalties = field(default_factory=Penalties)  # repetition/presence/frequency, min_length, bad_words
    return_log_probs: bool = False  # cum_log_probs / output_log_probs / output_token_ids outputs
    return_top_log_probs: int = 0  # output_top_token_ids / output_top_log_probs: k alternatives per token
    return_perf_metrics: bool = False  # acceptance_rate, total_draft_tokens, ... outputs
    guide: Optional[Guide] = None  # structured output: the grammar the output must match (backend/generation/guided.py)
    # Token-level requests (TensorRT-LLM's `tensorrt_llm` model, through llm's input_ids):
    input_ids: Optional[List[int]] = None  # the prompt as token ids, instead of `prompt`
    stop_words_ids: Sequence[Sequence[int]] = ()  # token sequences ending generation (kept in the output)
    bad_words_ids: Sequence[Sequence[int]] = ()  # token sequences never generated (as bad_words)
    return_output_ids: bool = False  # output_ids / sequence_length outputs


def validate(req: GenerationRequest, limits: Limits) -> GenerationRequest:
    """Raise RequestError naming the first problem; return the request unchanged."""
    if req.input_ids is not None:
        if not req.input_ids:
            raise RequestError("input_ids is empty")
        if req.apply_chat_template:
            raise RequestError("apply_chat_template needs a text prompt (text_input), not input_ids")
    elif not isinstance(req.prompt, str) or not req.prompt:
        raise RequestError("text_input is missing or empty")
    if len(req.prompt) > MAX_CHARS_PER_TOKEN * limits.max_context:  # tokenizing it would cost seconds
        raise RequestError(f"text_input has {len(req.prompt)} characters; it cannot fit the context window of "
                           f"{limits.max_context} tokens")
    if not isinstance(req.max_new_tokens, int) or req.max_new_tokens <= 0:
        raise RequestError(f"max_tokens must be a positive integer, got {req.max_new_tokens}")
    if req.max_new_tokens > limits.max_new_tokens_limit:
        raise RequestError(f"max_tokens {req.max_new_tokens} exceeds this server's limit of {limits.max_new_tokens_limit}")
    s = req.sampling
    if not math.isfinite(s.temperature):
        raise RequestError(f"temperature must be a finite number >= 0, got {s.temperature}")
    if s.temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {s.temperature}")
    if 0 < s.temperature < MIN_TEMPERATURE:  # logits / t would overflow float32 (denormals included)
        raise RequestError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {s.temperature}")
    if not (math.isfinite(s.top_p) and 0.0 < s.top_p <= 1.0):
        raise RequestError(f"top_p must be in (0, 1], got {s.top_p}")
    if s.top_k < 0:
        raise RequestError(f"top_k must be >= 0, got {s.top_k}")
    if req.seed is not None and req.seed < 0:
        raise RequestError(f"random_seed must be >= 0, got {req.seed}")
    if any(not w for w in req.stop_words):
        raise RequestError("stop_words must not contain empty strings")
    k = req.return_top_log_probs
    if not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOG_PROBS:
        raise RequestError(f"return_top_log_probs must be between 0 and {MAX_TOP_LOG_PROBS}, got {k}")
    if k and not req.return_log_probs:
        raise RequestError("return_top_log_probs needs return_log_probs=true (the alternatives come with the "
                           "generated tokens' own log probs)")
    problem = req.penalties.problems(req.max_new_tokens) or (req.guide.problem() if req.guide is not None else None)
    if problem:
        raise RequestError(problem)
    return req


@dataclass(frozen=True)
class Admitted:
    """What intake decided about an accepted request: its prompt ids, seed and end tokens."""
    prompt_ids: List[int]
    seed: int
    eos_ids: FrozenSet[int]


def admit(req: GenerationRequest, tokenizer, limits: Limits, vocab: int, default_eos: FrozenSet[int], *,
          draining: bool, queue_depth: int, max_queue: int) -> Admitted:
    """One request intake for every service (our loop, the TensorRT-LLM service): refuse new
    work while draining (ShuttingDown) or when max_queue requests already wait (Overloaded), both
    before any work on the request; validate; tokenize; check the prompt fits the context and
    end_id the vocabulary (RequestError). A request without a seed gets a random one, so any
    sampled request can be reproduced from its log."""
    if draining:
        raise ShuttingDown(ErrorKind.SHUTTING_DOWN.message("not accepting new requests; retry on another server "
                                                          "or later"))
    if max_queue and queue_depth >= max_queue:
        raise Overloaded(ErrorKind.OVERLOADED.message(f"{queue_depth} requests are waiting (max_queue {max_queue}); "
                                                      "retry later"))
    validate(req, limits)
    ids = prompt_ids(tokenizer, req)
    if len(ids) >= limits.max_context:
        raise RequestError(f"prompt has {len(ids)} tokens; the context window is {limits.max_context} "
                           f"(prompt + output must fit)")
    if req.end_id is not None and not (0 <= req.end_id < vocab or req.end_id == NO_END_ID):
        raise RequestError(f"end_id {req.end_id} is outside the vocabulary [0, {vocab})")
    for name, seqs in (("input_ids", [ids] if req.input_ids is not None else []),
                       ("stop_words_list", req.stop_words_ids), ("bad_words_list", req.bad_words_ids)):
        bad = next((t for seq in seqs for t in seq if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab})")
    eos = default_eos if req.end_id is None else frozenset() if req.end_id == NO_END_ID else frozenset({req.end_id})
    return Admitted(ids, req.seed if req.seed is not None else random.getrandbits(63), eos)


def chat_prefix(tokenizer) -> list:
    """The tokens every chat-template prompt starts with (the template's system turn, for
    example): the common start of two user turns' prompt_ids; [] without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    a, b = (prompt_ids(tokenizer, GenerationRequest(prompt=text, max_new_tokens=1, apply_chat_template=True)) for text in ("a", "Zq"))
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return a[:n]
