"""Triton's wire -> GenerationRequests (backend/frontend/triton_models/convert.py), pure: a request's tensors
come from a plain getter, no Triton stub needed."""
import numpy as np
import pytest

from backend.frontend.triton_models.convert import convert, rows
from backend.generation.request import RequestError
from backend.server_config import ServerConfig


def inputs(**arrays):
    return arrays.get


def test_one_row_applies_to_every_prompt_and_the_default_length_applies_once():
    text = np.array([[b"a"], [b"b"]], dtype=object)
    out = convert(inputs(text_input=text, temperature=np.array([[0.5]], dtype=np.float32),
                         max_tokens=np.array([[3], [4]], dtype=np.int32)), ServerConfig(default_max_tokens=9))
    assert [(g.prompt, g.max_new_tokens, g.sampling.temperature, b, s) for g, b, s in out] == [
        ("a", 3, 0.5, 0, None), ("b", 4, 0.5, 1, None)]
    (one, b, s), = convert(inputs(text_input=np.array([[b"a"]], dtype=object)), ServerConfig(default_max_tokens=9))
    assert (one.max_new_tokens, b, s) == (9, None, None)  # ServerConfig.max_new_tokens: the server's default


def test_rows_of_another_count_are_refused():
    assert [list(r) for r in rows(np.array([7]), "top_k", 3)] == [[7]] * 3
    with pytest.raises(RequestError, match="top_p has 3 rows for a batch of 2 prompts"):
        rows(np.zeros((3, 1)), "top_p", 2)
