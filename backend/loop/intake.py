"""Request intake, the same for every service (our loop, the TensorRT-LLM service): a
GenerationRequest becomes a Sequence, or is refused before it is queued.

`Intake.sequence` admits the request (backend/generation/request.admit: draining, overload,
validation, tokenizing, the context and vocabulary checks, a seed), then builds its Sequence
(prompt ids, end tokens, detokenizer). Where our loop samples (`own_sampling`), the sequence also
gets what its steps sample and mask with: a torch generator (model drafters' rejection sampling),
its logits processors (penalties, min_length, bad words) and its grammar's state (structured
output); an engine that samples and masks itself (TensorRT-LLM) needs none of them.
"""
from __future__ import annotations

import itertools
import time
from typing import Callable, Iterable, Optional, Union

import torch

from ..generation.detokenizer import IncrementalDetokenizer
from ..generation.guided import GuideCompiler, GuidedProcessor, GuideError
from ..generation.logits_processors import LogitsProcessor, tokenize_words
from ..generation.request import Admitted, GenerationRequest, Limits, RequestError, admit
from ..generation.sequence import Sequence


def end_tokens(model_eos: Union[int, Iterable[int], None], tokenizer) -> frozenset:
    """The tokens that end a request naming no end_id: the model's end-of-sequence token(s) (one
    id or a list, as a checkpoint's config.json has it) and the tokenizer's.

    >>> end_tokens(2, type("Tok", (), {"eos_token_id": 0})())
    frozenset({0, 2})
    >>> sorted(end_tokens([2, 7], type("Tok", (), {"eos_token_id": None})()))
    [2, 7]
    """
    ids = set() if model_eos is None else {model_eos} if isinstance(model_eos, int) else set(model_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class Intake:
    """GenerationRequest -> Sequence for one service. `own_sampling`: the service samples with our
    code (its sequences get a generator, logits processors and a compiled grammar); else the
    engine does. `kv_block_size`: what return_perf_metrics counts blocks in."""

    def __init__(self, tokenizer, limits: Limits, vocab: int, eos_ids: frozenset, *, own_sampling: bool = True,
                 kv_block_size: int = 16, clock: Callable[[], float] = time.perf_counter):
        self.tok, self.limits, self.vocab, self.eos_ids = tokenizer, limits, vocab, frozenset(eos_ids)
        self.kv_block_size, self.clock = kv_block_size, clock
        self.guides: Optional[GuideCompiler] = GuideCompiler(tokenizer, vocab) if own_sampling else None
        self._ids = itertools.count(1)

    def sequence(self, req: GenerationRequest, sink, *, draining: bool, queue_depth: int,
                 max_queue: int) -> Sequence:
        """The request's Sequence, given the service's admission state (max_queue 0: no bound);
        ShuttingDown, Overloaded or RequestError (naming the problem) if it is refused, before any
        work on a request refused for draining or overload."""
        a = admit(req, self.tok, self.limits, self.vocab, self.eos_ids, draining=draining,
                  queue_depth=queue_depth, max_queue=max_queue)
        sampling = self._sampling_state(req, a) if self.guides is not None else {}
        return Sequence(seq_id=next(self._ids), request=req, sink=sink, prompt_ids=a.prompt_ids,
                        tokens=list(a.prompt_ids), detok=IncrementalDetokenizer(self.tok, a.prompt_ids),
                        eos_ids=a.eos_ids, seed=a.seed, arrival_s=self.clock(), kv_block_size=self.kv_block_size,
                        **sampling)

    def _sampling_state(self, req: GenerationRequest, a: Admitted) -> dict:
        """What our loop's steps sample and mask the request's sequence with: its generator,
        processor and guide (RequestError if its grammar cannot be compiled)."""
        greedy = req.sampling.greedy
        processor = guide = None
        if not req.penalties.neutral or req.bad_words_ids:  # requests without penalties pay nothing per step
            bad = tokenize_words(self.tok, req.penalties.bad_words) + [list(w) for w in req.bad_words_ids]
            processor = LogitsProcessor(req.penalties, bad, a.eos_ids,
                                        temperature=0.0 if greedy else req.sampling.temperature)
        if req.guide is not None:
            try:
                guide = self.guides.compile(req.guide, len(a.prompt_ids), a.eos_ids)
            except GuideError as e:
                raise RequestError(str(e)) from None
            processor = GuidedProcessor(guide, processor)
        return dict(generator=None if greedy else torch.Generator().manual_seed(a.seed), processor=processor,
                    guide=guide)
