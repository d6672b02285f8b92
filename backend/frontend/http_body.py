"""HTTP request bodies as the edge and the OpenAI layer read them: a size limit, JSON with a
depth limit, and the error (status, message) a refused body gets."""
from __future__ import annotations

import json

from aiohttp import web


class EdgeError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


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


def parse_json(raw: bytes, max_depth: int):
    """The body as JSON, or EdgeError(400) saying why not (empty, malformed, too deep)."""
    if not raw.strip():
        raise EdgeError(400, "the request body is empty; send a JSON object")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise EdgeError(400, f"the request JSON nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise EdgeError(400, f"the request body is not valid JSON: {e}") from None
    if json_depth(value) > max_depth:
        raise EdgeError(400, f"the request JSON nests deeper than {max_depth} levels")
    return value


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, at most `limit` bytes (EdgeError(413) beyond, read no further)."""
    if request.content_length is not None and request.content_length > limit:
        raise EdgeError(413, f"the request body is {request.content_length} bytes; this server accepts "
                             f"at most {limit}")
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise EdgeError(413, f"the request body exceeds {limit} bytes, the most this server accepts")
        chunks.append(chunk)
    return b"".join(chunks)
