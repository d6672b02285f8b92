"""One wire vocabulary: every front end maps a model's error by the same kinds, and the words
are written in backend/wire.py alone."""
import doctest
import re
from pathlib import Path

import pytest

from backend import wire
from backend.frontend.edge.errors import status_for_model_error
from backend.frontend.openai.errors import model_error
from backend.wire import ErrorKind, error_kind

BACKEND = Path(__file__).resolve().parents[2] / "backend"
MESSAGES = {
    ErrorKind.OVERLOADED: ErrorKind.OVERLOADED.message("3 requests are waiting (max_queue 2); retry later"),
    ErrorKind.SHUTTING_DOWN: ErrorKind.SHUTTING_DOWN.message("not accepting new requests"),
    ErrorKind.INTERNAL: f"{ErrorKind.INTERNAL.prefix} while verifying this request; see the server log",
    ErrorKind.INVALID: "max_tokens must be a positive integer, got 0",
}


def test_docstring_examples():
    assert doctest.testmod(wire).failed == 0


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_front_end_gives_a_kind_its_status(kind):
    message = MESSAGES[kind]
    assert error_kind(message) is kind
    assert status_for_model_error(400, message) == kind.http_status  # the HTTP edge (Triton says 400)
    err = model_error(message)  # the OpenAI layer
    assert err.status == kind.http_status and err.body()["error"]["type"] == kind.openai_type
    assert (err.code == "server_overloaded") == kind.retry


def test_a_status_triton_chose_itself_is_kept():
    assert status_for_model_error(404, MESSAGES[ErrorKind.OVERLOADED]) == 404


def test_the_words_are_written_once():
    """No module but wire.py spells a kind's prefix or a request-id name as a literal."""
    words = [k.prefix for k in ErrorKind if k.prefix] + [wire.REQUEST_ID, wire.REQUEST_ID_HEADER, wire.ADMIN_HEADER]
    for path in BACKEND.rglob("*.py"):
        if path.name == "wire.py":
            continue
        code = re.sub(r'(?s)""".*?"""', "", path.read_text())  # docstrings may name them
        code = "\n".join(line.split("#", 1)[0] for line in code.splitlines())  # comments too
        for word in words:
            assert f'"{word}' not in code and f"'{word}" not in code, f"{path.name} spells {word!r}: use backend.wire"
