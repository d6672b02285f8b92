"""The OpenAI API's one error path: every failure of a request becomes the ApiError its client
gets ({"error": {message, type, param, code}}, the HTTP status of its kind)."""
from __future__ import annotations

import logging
from typing import Optional

from aiohttp import web

from ...wire import STREAM_BROKEN, ErrorKind, error_kind

log = logging.getLogger("specserve.openai")
NOT_REACHABLE = "the inference server is not reachable; retry later"


class UpstreamGone(Exception):
    """Triton's gRPC connection failed or broke (Triton is down or died): no model error, no message.
    `started`: whether the request had its first response (then its client learns it did not finish)."""

    def __init__(self, started: bool):
        super().__init__()
        self.started = started


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = next((k for k in ErrorKind if k.http_status == self.status), ErrorKind.INVALID if self.status < 500
                    else ErrorKind.INTERNAL)
        return {"error": {"message": self.message, "type": kind.openai_type, "param": self.param, "code": self.code}}


class ModelError(ApiError):
    """An error the model (or Triton) sent: Triton's counters saw it, the edge's refusals do not."""


def error_response(e: ApiError) -> web.Response:
    headers = {"Retry-After": "1"} if e.status == 503 else {}
    return web.json_response(e.body(), status=e.status, headers=headers)


def model_error(message: str, field_of=lambda name: None) -> ModelError:
    """An error Triton or the model sent, with the HTTP status of its kind, and the OpenAI field it
    is about (`param`: field_of(the engine input the message names)) when it is the request's."""
    message = message.split("] ", 1)[1] if message.startswith("[request id:") else message
    kind = error_kind(message)
    param = field_of(message.split(" ", 1)[0]) if kind is ErrorKind.INVALID else None
    return ModelError(kind.http_status, message, param, code="server_overloaded" if kind.retry else None)


def api_error(e: BaseException, doing: str) -> ApiError:
    """Any failure as the client's ApiError: an ApiError as it is; Triton gone, before the request's
    first response 503 (retry later), after it 500 (it did not finish); anything else is a fault of
    ours, logged, 500 saying what we were doing."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UpstreamGone):
        return ApiError(500, STREAM_BROKEN) if e.started else ApiError(503, NOT_REACHABLE)
    log.error("OpenAI request failed while %s", doing, exc_info=e)
    return ApiError(500, f"{ErrorKind.INTERNAL.prefix} while {doing}; see the server log")
