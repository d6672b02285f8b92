"""Request intake (backend/loop/intake.py), the same for both services: a request becomes a
Sequence with its prompt, seed and end tokens, and, where our loop samples, the generator,
logits processors and grammar its steps use; refused requests are refused before any work
(request.admit's refusals: tests/backend/generation/test_admit.py) and take no sequence id."""
import doctest

import pytest
import torch

from backend.generation.guided import Guide, GuidedProcessor
from backend.generation.logits_processors import LogitsProcessor, Penalties
from backend.generation.request import GenerationRequest, Limits, Overloaded, RequestError, ShuttingDown
from backend.generation.sampling import SamplingParams
from backend.loop import intake
from backend.loop.intake import Intake, end_tokens


class CharTokenizer:
    """One token per character; counts the calls."""
    chat_template = None
    eos_token_id = 2

    def __init__(self):
        self.calls = 0

    def __call__(self, text, **kw):
        self.calls += 1
        return type("Encoding", (), {"input_ids": [ord(c) % 100 for c in text]})()

    def decode(self, ids, **kw):
        return "".join(chr(i) for i in ids)


LIMITS = Limits(max_new_tokens_limit=16, max_context=32)
SAMPLED = SamplingParams(temperature=0.7)


def make(tok=None, **kw):
    args = dict(clock=lambda: 12.5, kv_block_size=8)
    args.update(kw)
    return Intake(tok or CharTokenizer(), LIMITS, 100, frozenset({2}), **args)


def take(it, req, **kw):
    args = dict(draining=False, queue_depth=0, max_queue=4)
    args.update(kw)
    return it.sequence(req, "the sink", **args)


def test_end_tokens_are_the_models_and_the_tokenizers():
    assert doctest.testmod(intake).failed == 0
    assert end_tokens(None, CharTokenizer()) == frozenset({2})
    assert end_tokens([5, 6], CharTokenizer()) == frozenset({2, 5, 6})


def test_a_request_becomes_a_sequence_with_its_prompt_seed_and_end_tokens():
    it = make()
    a, b = take(it, GenerationRequest("hi", max_new_tokens=16, seed=7)), take(it, GenerationRequest("hey", max_new_tokens=16, end_id=5))
    assert (a.seq_id, b.seq_id) == (1, 2)
    assert a.prompt_ids == a.tokens == [4, 5] and a.tokens is not a.prompt_ids  # tokens grow, the prompt stays
    assert (a.seed, a.eos_ids, b.eos_ids) == (7, frozenset({2}), frozenset({5}))
    assert a.sink == "the sink" and a.arrival_s == 12.5 and a.kv_block_size == 8 and a.detok.ids == [4, 5]


def test_refused_requests_take_no_work_and_no_id():
    tok = CharTokenizer()
    it = make(tok)
    with pytest.raises(ShuttingDown):
        take(it, GenerationRequest("hi", max_new_tokens=16), draining=True)
    with pytest.raises(Overloaded, match="max_queue 4"):
        take(it, GenerationRequest("hi", max_new_tokens=16), queue_depth=4)
    with pytest.raises(RequestError, match="max_tokens 17 exceeds"):
        take(it, GenerationRequest("hi", max_new_tokens=17))
    assert tok.calls == 0
    assert take(it, GenerationRequest("hi", max_new_tokens=16)).seq_id == 1


def test_our_loop_gets_a_generator_only_for_sampled_requests_seeded_with_their_seed():
    it = make()
    greedy, sampled = take(it, GenerationRequest("hi", max_new_tokens=16)), take(it, GenerationRequest("hi", max_new_tokens=16, sampling=SAMPLED, seed=9))
    assert greedy.generator is None and greedy.processor is None and greedy.guide is None
    assert isinstance(sampled.generator, torch.Generator) and sampled.generator.initial_seed() == 9


def test_penalties_and_bad_words_get_a_logits_processor():
    it = make()
    for req in (GenerationRequest("hi", max_new_tokens=16, penalties=Penalties(presence_penalty=0.5)),
                GenerationRequest("hi", max_new_tokens=16, bad_words_ids=[[7]]),
                GenerationRequest("hi", max_new_tokens=16, penalties=Penalties(bad_words=("ab",)))):
        assert isinstance(take(it, req).processor, LogitsProcessor), req


def test_an_engine_that_samples_itself_gets_none_of_our_sampling_state():
    it = make(own_sampling=False)
    seq = take(it, GenerationRequest("hi", max_new_tokens=16, sampling=SAMPLED, penalties=Penalties(presence_penalty=0.5),
                                     guide=Guide("regex", "([")))  # not compiled: the engine masks itself
    assert it.guides is None and (seq.generator, seq.processor, seq.guide) == (None, None, None)


def test_a_guide_is_compiled_at_intake_and_a_bad_one_refused(tokenizer):
    it = Intake(tokenizer, Limits(max_new_tokens_limit=16, max_context=256), len(tokenizer), frozenset({tokenizer.eos_token_id}))
    seq = take(it, GenerationRequest("Name a colour:", max_new_tokens=16, guide=Guide("regex", "(red|green)")))
    assert isinstance(seq.processor, GuidedProcessor) and seq.guide is not None
    assert seq.guide.valid_prefix(seq.prompt_ids, tokenizer("red", add_special_tokens=False).input_ids) > 0
    with pytest.raises(RequestError, match="cannot be compiled"):
        take(it, GenerationRequest("hi", max_new_tokens=16, guide=Guide("regex", "([")))
    assert take(it, GenerationRequest("hi", max_new_tokens=16)).seq_id == 2  # the refused one took no id
