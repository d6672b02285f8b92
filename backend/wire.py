"""The words the model and every front end share, in one place: the kinds of error a model's
message can carry (its prefix, HTTP status, OpenAI error type, Triton error code) and the
request-id names. Standard library only: Triton's unary model (backend/frontend/triton_models/forward.py), the
HTTP edge, the OpenAI layer and the serving loops all import it.

Errors cross processes as text (a decoupled Triton model's error reaches HTTP clients as a 400
whatever it was), so a kind is recognised by the prefix its message starts with:

>>> ErrorKind.OVERLOADED.message("3 requests are waiting; retry later")
'server overloaded: 3 requests are waiting; retry later'
>>> error_kind("server shutting down: not accepting new requests").http_status
503
>>> error_kind("max_tokens must be positive") is ErrorKind.INVALID
True
"""
from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """(message prefix, HTTP status, OpenAI error type, Triton error code name)."""

    OVERLOADED = ("server overloaded", 503, "server_overloaded", "UNAVAILABLE")  # admission refused: retry
    SHUTTING_DOWN = ("server shutting down", 503, "server_overloaded", "UNAVAILABLE")  # draining: retry elsewhere
    INTERNAL = ("internal error", 500, "server_error", "INTERNAL")  # ours; details only in the server log
    INVALID = ("", 400, "invalid_request_error", "INVALID_ARG")  # the request's fault: the message names the field

    def __init__(self, prefix: str, http_status: int, openai_type: str, triton_code: str):
        self.prefix, self.http_status, self.openai_type, self.triton_code = prefix, http_status, openai_type, triton_code

    @property
    def retry(self) -> bool:
        """Whether a client should retry (HTTP answers carry Retry-After)."""
        return self.http_status == 503

    def message(self, text: str) -> str:
        """`text` as a message of this kind (an INVALID message is the text itself)."""
        return f"{self.prefix}: {text}" if self.prefix else text


# A stream the server stopped sending (Triton died mid-request: the edge's and the OpenAI API's last event)
STREAM_BROKEN = ErrorKind.INTERNAL.message("the inference server stopped while running this request "
                                           "(it is being restarted); retry")


def error_kind(message: str) -> ErrorKind:
    """The kind of a model's error message, from its prefix (INVALID when it has none)."""
    return next((k for k in ErrorKind if k.prefix and message.startswith(k.prefix)), ErrorKind.INVALID)


# The HTTP edge's own id of a request the model computes: a `parameters` entry of /generate bodies,
# a header Triton forwards on /infer (--http-header-forward-pattern; backend/frontend/supervisor/triton_command.py), which the
# unary model passes on to llm; the model's response sender watches for the edge's cancel mark.
REQUEST_ID = "specserve_request_id"
REQUEST_ID_HEADER = "specserve-request-id"
REQUEST_ID_NAMES = (REQUEST_ID, REQUEST_ID_HEADER)  # either spelling, compared lower-cased
# The header that opens Triton's restricted APIs over HTTP (checked by the edge; backend/frontend/supervisor/triton_command.py).
ADMIN_HEADER = "specserve-admin-key"
# The header with the per-start key that opens every other HTTP API of Triton: the edge adds it to
# each request it forwards, so a local client that reaches Triton's private port directly gets 403.
INTERNAL_HEADER = "specserve-internal-key"
