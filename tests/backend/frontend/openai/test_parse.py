"""An OpenAI request body -> a typed OpenAIRequest (backend/frontend/openai/parse.py), without a server:
tests/integration/test_openai_api.py runs the API against the real one."""
import pytest

from backend.frontend.openai.errors import ApiError, model_error
from backend.frontend.openai.parse import parse_chat, parse_completion, resolve_lengths
from backend.server_config import ServerConfig


MSG = [{"role": "user", "content": "hi"}]


def test_defaults():
    p = parse_chat({"model": "llm", "messages": MSG})
    assert p.temperature == 1.0 and p.n == 1 and p.max_tokens is None and p.stop == []
    assert p.messages == MSG
    p = parse_completion({"model": "llm", "prompt": ["hello"]})
    assert p.max_tokens == 16 and p.prompt == "hello" and p.echo is False


def test_fields():
    p = parse_chat({"model": "llm", "max_tokens": 5, "max_completion_tokens": 7, "stop": "x", "seed": 4,
                              "temperature": 0, "n": 2, "stream": True, "stream_options": {"include_usage": True},
                              "logprobs": False, "presence_penalty": 0, "messages": [
                                  {"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                    {"type": "text", "text": "b"}]}]})
    assert (p.max_tokens, p.stop, p.seed, p.temperature, p.n, p.include_usage) == (7, ["x"], 4, 0.0, 2, True)
    assert p.messages == [{"role": "system", "content": "ab"}]


@pytest.mark.parametrize("body,param,words", [
    ({"model": "llm", "messages": MSG, "min_p": 0.1}, "min_p", "Unrecognized request argument supplied: min_p"),
    # found by hand (issue 32): each was accepted, or answered 503 / 500, before
    ({"model": "llm", "messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content", "lone surrogate"),
    ({"model": "llm", "messages": MSG, "stop": ["x", "\udc00"]}, "stop[1]", "lone surrogate"),
    ({"model": "llm", "messages": MSG, "user": "\ud800"}, "user", "lone surrogate"),
    ({"model": "llm", "messages": MSG, "\ud800": 1}, "(a field name)", "lone surrogate"),
    ({"model": "llm", "messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", "must be a string"),
    ({"model": "llm", "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": {"y": [1]}}]}]},
     "messages[0].content[0]", "content[0].x is not supported"),
    ({"model": "llm", "messages": MSG, "max_completion_tokens": 3, "max_tokens": "x"}, "max_tokens", "must be an integer"),
    ({"model": "llm", "messages": MSG, "min_tokens": -1}, "min_tokens", "between 0"),
    ({"model": "llm", "messages": MSG, "min_tokens": 2.0}, "min_tokens", "must be an integer"),
    ({"model": "llm", "messages": MSG, "ignore_eos": "yes"}, "ignore_eos", "ignore_eos must be true or false"),
    ({"model": "llm", "messages": MSG, "logprobs": 1}, "logprobs", "logprobs must be true or false"),
    ({"model": "llm", "messages": MSG, "top_logprobs": 2}, "top_logprobs", "top_logprobs requires logprobs"),
    ({"model": "llm", "messages": MSG, "logprobs": False, "top_logprobs": 2}, "top_logprobs", "requires logprobs"),
    ({"model": "llm", "messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"model": "llm", "messages": MSG, "logit_bias": {"1": 5}}, "logit_bias", "logit_bias is not supported"),
    ({"model": "llm", "messages": MSG, "tools": [{"type": "function"}]}, "tools", "tools is not supported"),
    ({"model": "llm", "messages": MSG, "n": 9}, "n", "n must be between 1 and 8"),
    ({"model": "llm", "messages": MSG, "presence_penalty": 2.5}, "presence_penalty", "between -2.0 and 2.0"),
    ({"model": "llm", "messages": MSG, "frequency_penalty": "x"}, "frequency_penalty", "must be a number"),
    ({"model": "llm", "messages": MSG, "top_p": "high"}, "top_p", "top_p must be a number"),
    ({"model": "llm", "messages": MSG, "seed": -1}, "seed", "seed must be between 0"),
    ({"model": "llm", "messages": MSG, "stop": ["a", ""]}, "stop", "stop must be"),
    ({"model": "llm", "messages": MSG, "stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"messages": MSG}, "model", "model is required"),
    ({"model": "llm", "messages": []}, "messages", "non-empty list"),
    ({"model": "llm", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]", "only text parts"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]", "tool_calls"),
])
def test_chat_refusals_name_the_field(body, param, words):
    with pytest.raises(ApiError, match=words.replace("[", r"\[")) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("body,expected", [
    ({}, (None, 0)),  # the model applies its default max_tokens
    ({"max_tokens": 8, "min_tokens": 3}, (8, 3)),
    ({"max_tokens": 8, "min_tokens": 8}, (8, 8)),
    ({"max_tokens": 8, "ignore_eos": True}, (8, 8)),  # exactly max_tokens: the end tokens are masked throughout
    ({"max_tokens": 8, "ignore_eos": True, "min_tokens": 2}, (8, 8)),
    ({"max_tokens": 8, "ignore_eos": False}, (8, 0)),
    ({"ignore_eos": True}, (64, 64)),  # without max_tokens: the server's default_max_tokens, sent explicitly
    ({"min_tokens": 5}, (64, 5)),
])
def test_min_tokens_and_ignore_eos(body, expected):
    p = parse_chat(dict({"model": "llm", "messages": MSG}, **body))
    resolve_lengths(p, ServerConfig(default_max_tokens=64))
    assert (p.max_tokens, p.min_length) == expected


@pytest.mark.parametrize("body,words", [({"max_tokens": 4, "min_tokens": 5}, "min_tokens 5 exceeds max_tokens 4"),
                                        ({"min_tokens": 65}, "(the server's default: send max_tokens)")])
def test_min_tokens_above_max_tokens(body, words):
    p = parse_chat(dict({"model": "llm", "messages": MSG}, **body))
    with pytest.raises(ApiError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        resolve_lengths(p, ServerConfig(default_max_tokens=64))
    assert e.value.status == 400 and e.value.param == "min_tokens"
    p = parse_completion({"model": "llm", "prompt": "x", "min_tokens": 17})  # OpenAI's default 16
    with pytest.raises(ApiError, match="min_tokens 17 exceeds max_tokens 16"):
        resolve_lengths(p, ServerConfig())


def test_model_errors_name_the_openai_field():
    p = parse_chat({"model": "llm", "messages": MSG, "max_completion_tokens": 300})
    assert model_error("max_tokens 300 exceeds this server's limit of 256", p.field_of).param == "max_completion_tokens"
    assert model_error("top_p must be in (0, 1], got 0.0", p.field_of).param == "top_p"
    assert model_error("prompt has 600 tokens; the context window is 512 (prompt + output must fit)", p.field_of).param == "messages"
    assert model_error("min_length (min_tokens) 5 exceeds max_tokens 4", p.field_of).param == "min_tokens"
    p = parse_completion({"model": "llm", "prompt": "x", "max_tokens": 300})
    assert model_error("text_input has 40000 characters; it cannot fit", p.field_of).param == "prompt"
    assert model_error("server overloaded: 8 requests are waiting; retry later", p.field_of).param is None


def test_penalties_are_passed_on():
    p = parse_chat({"model": "llm", "messages": MSG, "presence_penalty": 0.5, "frequency_penalty": -1})
    assert (p.presence_penalty, p.frequency_penalty) == (0.5, -1.0)
    p = parse_completion({"model": "llm", "prompt": "x", "frequency_penalty": 2})
    assert p.frequency_penalty == 2.0 and p.presence_penalty is None


def test_logprobs_fields():
    p = parse_chat({"model": "llm", "messages": MSG, "logprobs": True, "top_logprobs": 3})
    assert (p.logprobs, p.top_logprobs) == (True, 3)
    p = parse_chat({"model": "llm", "messages": MSG, "logprobs": True})
    assert (p.logprobs, p.top_logprobs) == (True, 0)
    p = parse_chat({"model": "llm", "messages": MSG, "logprobs": False, "top_logprobs": 0})
    assert (p.logprobs, p.top_logprobs) == (False, 0)
    p = parse_completion({"model": "llm", "prompt": "x", "logprobs": 0})
    assert (p.logprobs, p.top_logprobs) == (True, 0)
    p = parse_completion({"model": "llm", "prompt": "x", "logprobs": 5})
    assert (p.logprobs, p.top_logprobs) == (True, 5)
    p = parse_completion({"model": "llm", "prompt": "x"})
    assert p.logprobs is False


@pytest.mark.parametrize("body,words", [({"logprobs": 6}, "logprobs must be between 0 and 5"),
                                        ({"logprobs": True}, "logprobs must be an integer"),
                                        ({"logprobs": 2, "echo": True}, "logprobs with echo"),
                                        ({"top_logprobs": 2}, "Unrecognized request argument supplied: top_logprobs")])
def test_completion_logprobs_refusals(body, words):
    with pytest.raises(ApiError, match=words) as e:
        parse_completion(dict({"model": "llm", "prompt": "x"}, **body))
    assert e.value.status == 400 and e.value.param in ("logprobs", "top_logprobs")


def test_completion_refusals():
    with pytest.raises(ApiError, match="prompt must be"):
        parse_completion({"model": "llm", "prompt": [1, 2, 3]})
    with pytest.raises(ApiError, match="Unrecognized request argument supplied: messages"):
        parse_completion({"model": "llm", "prompt": "x", "messages": MSG})
