"""The JSON of an HTTP request body as the edge and the OpenAI API read it: in UTF-8, within a
depth limit, valid Unicode; and the error (status, message) a refused body gets, EdgeError, which
the body's bytes raise too (backend/frontend/body_format.py reads them)."""
from __future__ import annotations

import json
import re

from aiohttp import web


class EdgeError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param  # param: the field it is about


def json_depth(value) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in v)
    return depth


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff: only half of a pair is valid


def lone_surrogate(value, path: str = "") -> str | None:
    """Where a parsed JSON value holds a lone UTF-16 surrogate ("\\ud800" unpaired: Python parses
    it, but it is not Unicode, and no UTF-8 encoder takes it), as a path such as
    `inputs[0].data[0]`; None if nowhere.

    >>> lone_surrogate({"text_input": "hi", "stop_words": ["ok", "\\ud800"]})
    'stop_words[1]'
    >>> lone_surrogate(json.loads(r'"\\ud83d\\ude00"')) is None  # a pair in JSON: one character
    True
    """
    stack = [(value, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            try:
                v.encode()
            except UnicodeEncodeError:
                return where or "the request body"
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.extend([(k, f"{where} (a field name)".strip()), (x, f"{where}.{k}" if where else k)])
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
    return None


def parse_json(raw: bytes, max_depth: int):
    """The body as JSON, or EdgeError saying why not: 400 (empty, malformed, too deep, a string
    that is not Unicode), 415 (UTF-16 or UTF-32, which Python's parser would read: JSON is UTF-8)."""
    if not raw.strip():
        raise EdgeError(400, "the request body is empty; send a JSON object")
    encoding = json.detect_encoding(raw)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise EdgeError(415, f"the request body is {encoding.upper()}: JSON must be sent in UTF-8")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise EdgeError(400, f"the request JSON nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise EdgeError(400, f"the request body is not valid JSON: {e}") from None
    if json_depth(value) > max_depth:
        raise EdgeError(400, f"the request JSON nests deeper than {max_depth} levels")
    where = lone_surrogate(value) if _SURROGATE_ESCAPE.search(raw) else None
    if where is not None:
        raise EdgeError(400, surrogate_message(where), where)
    return value


def surrogate_message(where: str) -> str:
    return (f"{where} is not valid Unicode: it holds a lone surrogate (a UTF-16 half such as \\ud800 without "
            "the \\udc00-\\udfff that must follow it)")


async def close_after(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """Send `resp` and close the connection: for a client whose body stalled (408), which aiohttp
    would otherwise keep reading for its lingering time (10 s) after the answer."""
    await resp.prepare(request)
    await resp.write_eof()
    if request.transport is not None:
        request.transport.close()
    return resp
