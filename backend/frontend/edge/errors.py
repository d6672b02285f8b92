"""The edge's one error path: a refusal in the shape of the interface it was for (OpenAI's on
/v1, Triton's elsewhere), and the model's own errors given the status of their kind."""
from __future__ import annotations

import json
from typing import Optional

from aiohttp import web

from ...wire import error_kind


def status_for_model_error(status: int, message: str) -> int:
    """Triton 2.51 answers 400 for every error a decoupled model sends: restore its kind's status."""
    return error_kind(message).http_status if status == 400 else status


def error_response(status: int, message: str, stream: bool = False) -> web.Response:
    headers = {"Retry-After": "1"} if status == 503 else {}
    if stream:  # the shape Triton uses for /generate_stream errors
        return web.Response(status=status, headers=headers, content_type="text/event-stream",
                            text=error_event(message).decode())
    return web.json_response({"error": message}, status=status, headers=headers)


def error_event(message: str) -> bytes:
    """An error as Triton's /generate_stream sends it: one server-sent event whose data is {"error": ...}."""
    return f"data: {json.dumps({'error': message})}\n\n".encode()


def is_openai(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def refusal(request: web.Request, status: int, message: str, code: Optional[str] = None) -> web.Response:
    """An error in the shape of the interface the request was for: OpenAI's on /v1, Triton's
    ({"error": message}, an event on /generate_stream) on the rest."""
    if is_openai(request.path):
        from ..openai.errors import ApiError, error_response as openai_error
        return openai_error(ApiError(status, message, code=code))
    return error_response(status, message, request.path.endswith("/generate_stream"))
