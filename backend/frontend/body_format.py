"""What a request body must be before the edge reads it as JSON (backend/frontend/http_body.py):
at most a size limit, sent within a time limit (read_body), in a content coding this server
decodes and a media type the interface takes.

Content coding (`Content-Encoding`, RFC 9110 8.4): identity, gzip (x-gzip), deflate and br are
decoded here (the edge, not aiohttp, so every refusal is the interface's own error): a coding
this server does not decode is 415, a body that is not what its coding says 400, a body that
decodes to more than the size limit 413 (a gzip bomb stops at the limit, never inflated whole).
The decoded body is what reaches Triton.

Media type (`Content-Type`): a body is JSON in UTF-8 (RFC 8259). What each interface accepts is
decided by the clients that use it, so that none of them breaks:

- the OpenAI API (/v1): `application/json` (or a `+json` type), as the openai client and
  genai-perf (perf_analyzer's OpenAI client) send; anything else, no Content-Type included, is 415;
- Triton's protocol (/v2): also no Content-Type (tritonclient.http; perf_analyzer's and the C++
  client's model-control calls), `application/octet-stream` (tritonclient.http.aio, and the C++
  client / perf_analyzer -i http with binary tensor data) and `application/x-www-form-urlencoded`
  (what `curl -d` sends, as in the README's examples; Triton itself accepts it). Other types
  (`text/plain`, `multipart/form-data`, ...) are 415.

Everywhere a `charset` other than UTF-8 is 415, and so is a body in UTF-16 or UTF-32 whatever its
label (Python's JSON parser would read it silently).

>>> media_type_problem("application/json; charset=utf-8", OPENAI_TYPES) is None
True
>>> media_type_problem(None, OPENAI_TYPES)
'this API takes a JSON body: send Content-Type: application/json'
>>> media_type_problem("application/x-www-form-urlencoded", TRITON_TYPES) is None  # curl -d
True
>>> media_type_problem("text/plain", TRITON_TYPES)
'Content-Type text/plain is not accepted here: the body is JSON, send Content-Type: application/json'
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Optional

from aiohttp import web

from .http_body import EdgeError

JSON = "application/json"
OPENAI_TYPES = frozenset({JSON})
# None: no Content-Type at all
TRITON_TYPES = frozenset({JSON, None, "application/octet-stream", "application/x-www-form-urlencoded"})
UTF8 = ("utf-8", "utf8")
CODINGS = ("identity", "gzip", "x-gzip", "deflate", "br")


def media_type_problem(header: Optional[str], accepted: frozenset) -> Optional[str]:
    """Why a body labelled `header` (the Content-Type value, None when absent) is refused (415) by
    an interface accepting `accepted` media types, or None if it is not."""
    if header is None or not header.strip():
        return None if None in accepted else f"this API takes a JSON body: send Content-Type: {JSON}"
    mime, *params = [p.strip() for p in header.split(";")]
    mime = mime.lower()
    for p in params:
        name, _, value = p.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in UTF8:
            return (f"charset {value.strip()} is not accepted: the body is JSON in UTF-8, send "
                    f"Content-Type: {JSON}")
    if mime in accepted or JSON in accepted and mime.startswith("application/") and mime.endswith("+json"):
        return None
    return f"Content-Type {mime} is not accepted here: the body is JSON, send Content-Type: {JSON}"


def check_media_type(header: Optional[str], accepted: frozenset) -> None:
    """EdgeError(415) if a body labelled `header` is refused (media_type_problem)."""
    problem = media_type_problem(header, accepted)
    if problem is not None:
        raise EdgeError(415, problem)


async def read_body(request: web.Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, at most `limit` bytes (EdgeError(413) beyond, read no further), within `timeout_s`
    seconds (EdgeError(408) after: a client that stalls holds no connection forever; answer it
    with close_after), its Content-Encoding undone (EdgeError 400 / 413 / 415: decode_content)."""
    if request.content_length is not None and request.content_length > limit:
        raise EdgeError(413, f"the request body is {request.content_length} bytes; this server accepts "
                             f"at most {limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise EdgeError(413, f"the request body exceeds {limit} bytes, the most this server accepts")
                chunks.append(chunk)
    except TimeoutError:
        raise EdgeError(408, f"the request body did not arrive within {timeout_s:g} s") from None
    return decode_content(b"".join(chunks), request.headers.get("Content-Encoding"), limit)


def decode_content(raw: bytes, coding: Optional[str], limit: int) -> bytes:
    """The body `raw` with its Content-Encoding `coding` (a list: applied in order, undone last
    first) undone, at most `limit` bytes once decoded. EdgeError: 415 for a coding this server does
    not decode, 400 for a body that does not match its coding, 413 beyond `limit`."""
    codings = [c.strip().lower() for c in (coding or "").split(",") if c.strip()]
    for c in codings:
        if c not in CODINGS:
            raise EdgeError(415, f"Content-Encoding {c} is not supported: send the body as it is, or "
                                 f"encoded with {', '.join(x for x in CODINGS if x != 'x-gzip')}")
    for c in reversed(codings):
        if raw and c != "identity":
            raw = _decode(raw, c, limit)
    return raw


class _Corrupt(Exception):
    """The decoder's own error (zlib.error, brotli.error): the data is not what its coding says."""


def _decode(raw: bytes, coding: str, limit: int) -> bytes:
    mismatch = f"the request body does not match its Content-Encoding: it is not {coding} data"
    try:
        out, complete = (_unbrotli if coding == "br" else _inflate)(raw, coding, limit)
    except _Corrupt as e:
        raise EdgeError(400, f"{mismatch} ({e})") from None
    if len(out) > limit:
        raise EdgeError(413, f"the request body exceeds {limit} bytes once decoded (Content-Encoding: "
                             f"{coding}), the most this server accepts")
    if not complete:
        raise EdgeError(400, f"{mismatch} (it ends before its {coding} stream does)")
    return out


def _unbrotli(raw: bytes, coding: str, limit: int) -> tuple:
    """(br data decoded, at most about limit + 1 bytes; whether the stream was complete)."""
    try:
        import brotli  # installed with tritonclient[http] (geventhttpclient)
    except ImportError:
        raise EdgeError(415, "Content-Encoding br is not supported by this installation: send the body as "
                             "it is, or gzip it") from None
    d = brotli.Decompressor()
    try:
        out = d.process(raw, output_buffer_limit=limit + 1)
    except brotli.error as e:
        raise _Corrupt(str(e) or "brotli: decoder failed") from None
    return out, d.is_finished()


def _inflate(raw: bytes, coding: str, limit: int) -> tuple:
    """(gzip or deflate data decoded, at most limit + 1 bytes; whether the stream was complete).
    gzip may hold several members (RFC 1952); deflate is the zlib format (RFC 9110), or raw deflate
    as some clients send it."""
    try:
        if coding == "deflate":
            try:
                d = zlib.decompressobj(zlib.MAX_WBITS)
                out = d.decompress(raw, limit + 1)
            except zlib.error:
                d = zlib.decompressobj(-zlib.MAX_WBITS)
                out = d.decompress(raw, limit + 1)
            return out, d.eof and not d.unused_data
        out, rest = b"", raw
        while rest:  # a gzip member at a time
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(rest, limit + 1 - len(out))  # >= 1: 0 would mean no limit
            if len(out) > limit or not d.eof:
                return out, d.eof
            rest = d.unused_data
        return out, True
    except zlib.error as e:
        raise _Corrupt(str(e)) from None
