"""One request intake for both services (backend/request.admit): the same refusals, in the same
order, before any work on the request."""
import pytest

from backend.generation.request import GenerationRequest, Limits, Overloaded, RequestError, ShuttingDown, admit
from backend.generation.sampling import SamplingParams
from backend.wire import ErrorKind, error_kind


class CountingTokenizer:
    """One token per character; counts the calls (a refused request must not be tokenized)."""
    chat_template = None

    def __init__(self):
        self.calls = 0

    def __call__(self, text):
        self.calls += 1
        return type("Encoding", (), {"input_ids": [ord(c) % 100 for c in text]})()


LIMITS = Limits(max_new_tokens_limit=16, max_context=32)
EOS = frozenset({2})


def run(req, tok=None, **kw):
    args = dict(draining=False, queue_depth=0, max_queue=4)
    args.update(kw)
    return admit(req, tok or CountingTokenizer(), LIMITS, 100, EOS, **args)


def test_draining_and_overload_refuse_before_any_work():
    tok = CountingTokenizer()
    with pytest.raises(ShuttingDown) as e:
        run(GenerationRequest("hi", max_new_tokens=16), tok, draining=True)
    assert error_kind(str(e.value)) is ErrorKind.SHUTTING_DOWN
    with pytest.raises(Overloaded) as e:
        run(GenerationRequest("hi", max_new_tokens=16), tok, queue_depth=4)
    assert error_kind(str(e.value)) is ErrorKind.OVERLOADED and "max_queue 4" in str(e.value)
    assert tok.calls == 0
    assert run(GenerationRequest("hi", max_new_tokens=16), tok, queue_depth=4, max_queue=0).prompt_ids  # 0: no bound


def test_bad_requests_are_refused_naming_the_problem():
    with pytest.raises(RequestError, match="context window is 32"):
        run(GenerationRequest("x" * 32, max_new_tokens=16))
    with pytest.raises(RequestError, match="end_id 100 is outside the vocabulary"):
        run(GenerationRequest("hi", max_new_tokens=16, end_id=100))
    with pytest.raises(RequestError):
        run(GenerationRequest("hi", max_new_tokens=17))  # validate: over the limit


def test_seed_and_end_tokens():
    a = run(GenerationRequest("hi", max_new_tokens=16, seed=7, end_id=5))
    assert (a.seed, a.eos_ids, a.prompt_ids) == (7, frozenset({5}), [4, 5])
    b, c = run(GenerationRequest("hi", max_new_tokens=16, sampling=SamplingParams(temperature=1.0))), run(GenerationRequest("hi", max_new_tokens=16))
    assert b.eos_ids == EOS and b.seed != c.seed  # a random seed when the request sends none


def test_token_prompts_are_taken_as_they_are_and_checked_against_the_vocabulary():
    tok = CountingTokenizer()
    a = run(GenerationRequest("", max_new_tokens=16, input_ids=[7, 8, 9], stop_words_ids=[[3]]), tok)
    assert a.prompt_ids == [7, 8, 9] and tok.calls == 0
    for field, words in (("input_ids", dict(input_ids=[7, 100])), ("stop_words_list", dict(stop_words_ids=[[100]])),
                         ("bad_words_list", dict(bad_words_ids=[[1, -3]]))):
        with pytest.raises(RequestError, match=f"{field} holds token id"):
            run(GenerationRequest("", max_new_tokens=16, **{"input_ids": [1], **words}))
    with pytest.raises(RequestError, match="input_ids is empty"):
        run(GenerationRequest("", max_new_tokens=16, input_ids=[]))
    with pytest.raises(RequestError, match="apply_chat_template needs a text prompt"):
        run(GenerationRequest("", max_new_tokens=16, input_ids=[1], apply_chat_template=True))


def test_end_id_minus_one_means_no_end_token():
    assert run(GenerationRequest("hi", max_new_tokens=16, end_id=-1)).eos_ids == frozenset()
    with pytest.raises(RequestError, match="end_id -2 is outside"):
        run(GenerationRequest("hi", max_new_tokens=16, end_id=-2))
