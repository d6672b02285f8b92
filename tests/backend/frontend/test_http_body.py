"""The JSON of request bodies (backend/frontend/http_body.py): depth, parse errors, lone
surrogates, each an EdgeError naming what is wrong."""
import pytest

from backend.frontend.http_body import EdgeError, json_depth, parse_json


def test_depth():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [[1]]}) == 3
    assert json_depth(parse_json(b"[" * 32 + b"]" * 32, 32)) == 32
    with pytest.raises(EdgeError, match="deeper than 32"):
        parse_json(b"[" * 33 + b"]" * 33, 32)
    with pytest.raises(EdgeError, match="deeper than 32"):
        parse_json(b"[" * 40000 + b"]" * 40000, 32)  # Python's parser stops at its recursion limit


@pytest.mark.parametrize("raw,words", [(b"", "empty"), (b"  \n", "empty"), (b'{"a": ', "not valid JSON"),
                                       (b"\xff\xff", "not valid JSON")])
def test_unparsable(raw, words):
    with pytest.raises(EdgeError, match=words) as e:
        parse_json(raw, 32)
    assert e.value.status == 400


@pytest.mark.parametrize("raw,where", [
    (b'{"text_input": "\\ud800", "max_tokens": 2}', "text_input"),
    (b'{"inputs": [{"name": "text_input", "data": ["ok", "a\\udfffb"]}]}', r"inputs\[0\].data\[1\]"),
    (b'{"stop_words": ["\\ud83d"]}', r"stop_words\[0\]"),  # the first half of a pair, alone
])
def test_lone_surrogates_are_400s_naming_the_field(raw, where):
    """Python parses "\\ud800", Triton's parser refuses it with a 500: not Unicode, refused here."""
    with pytest.raises(EdgeError, match=f"^{where} is not valid Unicode") as e:
        parse_json(raw, 32)
    assert e.value.status == 400
    assert parse_json(b'{"text_input": "\\ud83d\\ude00 \\u00e9"}', 32) == {"text_input": "\U0001F600 \u00e9"}
