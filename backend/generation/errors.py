"""The errors a request can meet, torch-free so that every process can raise and catch them
(the token models' stubs import nothing heavier than numpy)."""
from __future__ import annotations


class RequestError(ValueError):
    """A request the server must refuse with a clear message (never a crash)."""


class Overloaded(RuntimeError):
    """The server is at its admission limit: the client should retry later (HTTP 503 / UNAVAILABLE)."""


class ShuttingDown(Overloaded):
    """The server is draining for shutdown: it takes no new request (HTTP 503 / UNAVAILABLE)."""
