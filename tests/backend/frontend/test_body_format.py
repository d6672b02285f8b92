"""Content codings and media types of request bodies (backend/frontend/body_format.py), without a
server: tests/backend/test_edge.py runs them through the edge, tests/integration/test_hostile_input.py
against the real server."""
import doctest
import gzip
import zlib

import brotli
import pytest

from backend.frontend import body_format, http_body
from backend.frontend.body_format import OPENAI_TYPES, TRITON_TYPES, decode_content, media_type_problem
from backend.frontend.http_body import EdgeError, parse_json

BODY = b'{"model": "llm", "prompt": "hi"}'


def test_docstring_examples():
    assert doctest.testmod(body_format).failed == 0 and doctest.testmod(http_body).failed == 0


@pytest.mark.parametrize("coding,data", [
    (None, BODY), ("identity", BODY), ("gzip", gzip.compress(BODY)), ("x-gzip", gzip.compress(BODY)),
    ("GZIP", gzip.compress(BODY)), ("deflate", zlib.compress(BODY)),  # deflate: the zlib format (tritonclient)
    ("deflate", zlib.compress(BODY, wbits=-15)),  # raw deflate, as some clients send it
    ("br", brotli.compress(BODY)), ("gzip, br", brotli.compress(gzip.compress(BODY))),
    ("gzip", gzip.compress(BODY[:10]) + gzip.compress(BODY[10:])),  # two gzip members
])
def test_codings_are_undone(coding, data):
    assert decode_content(data, coding, 1 << 20) == BODY


@pytest.mark.parametrize("coding,data", [
    ("gzip", BODY), ("deflate", BODY), ("br", BODY),  # the reproducer: JSON labelled compressed
    ("gzip", gzip.compress(BODY)[:-6]),  # cut short
    ("gzip", gzip.compress(BODY) + b"junk"),  # something after the gzip member that is no member
    ("deflate", zlib.compress(BODY) + b"junk"),
    ("br", brotli.compress(BODY)[:-3]),
])
def test_a_body_that_does_not_match_its_coding_is_a_400(coding, data):
    with pytest.raises(EdgeError, match=f"does not match its Content-Encoding: it is not {coding} data") as e:
        decode_content(data, coding, 1 << 20)
    assert e.value.status == 400


@pytest.mark.parametrize("coding", ["zstd", "compress", "foo", "gzip, foo"])
def test_a_coding_this_server_does_not_decode_is_a_415(coding):
    with pytest.raises(EdgeError, match="is not supported") as e:
        decode_content(BODY, coding, 1 << 20)
    assert e.value.status == 415


@pytest.mark.parametrize("coding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress),
                                             ("br", lambda data: brotli.compress(data, quality=1))])
def test_a_bomb_stops_at_the_limit(coding, compress):
    """64 MiB of zeros compress to ~64 KiB: refused once 1 MiB is decoded, never inflated whole."""
    bomb = compress(b"0" * (64 << 20))
    assert len(bomb) < 1 << 20
    with pytest.raises(EdgeError, match="exceeds 1048576 bytes once decoded") as e:
        decode_content(bomb, coding, 1 << 20)
    assert e.value.status == 413
    assert decode_content(compress(b"0" * (1 << 20)), coding, 1 << 20) == b"0" * (1 << 20)  # the limit itself


@pytest.mark.parametrize("header,accepted,ok", [
    ("application/json", OPENAI_TYPES, True), ("Application/JSON; charset=UTF-8", OPENAI_TYPES, True),
    ('application/json; charset="utf-8"', OPENAI_TYPES, True), ("application/vnd.api+json", OPENAI_TYPES, True),
    (None, OPENAI_TYPES, False), ("text/plain", OPENAI_TYPES, False),
    ("application/x-www-form-urlencoded", OPENAI_TYPES, False), ("application/json; charset=utf-16", OPENAI_TYPES, False),
    # Triton's protocol: what NVIDIA's clients and curl -d send
    (None, TRITON_TYPES, True), ("", TRITON_TYPES, True), ("application/json", TRITON_TYPES, True),
    ("application/octet-stream", TRITON_TYPES, True), ("application/x-www-form-urlencoded", TRITON_TYPES, True),
    ("text/plain", TRITON_TYPES, False), ("text/plain; charset=utf-8", TRITON_TYPES, False),
    ("multipart/form-data; boundary=x", TRITON_TYPES, False), ("application/json; charset=latin-1", TRITON_TYPES, False),
])
def test_media_types(header, accepted, ok):
    assert (media_type_problem(header, accepted) is None) == ok


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_json_in_utf16_or_utf32_is_a_415(encoding):
    """Python's JSON parser reads these silently; JSON is UTF-8 (RFC 8259)."""
    with pytest.raises(EdgeError, match="JSON must be sent in UTF-8") as e:
        parse_json('{"text_input": "hi"}'.encode(encoding), 32)
    assert e.value.status == 415
    assert parse_json(b'\xef\xbb\xbf{"a": 1}', 32) == {"a": 1}  # UTF-8 with a byte-order mark: still UTF-8
