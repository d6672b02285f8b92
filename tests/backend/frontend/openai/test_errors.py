"""The OpenAI API's one error path (backend/frontend/openai/errors.py)."""
from backend.frontend.openai.errors import model_error


def test_model_errors_keep_their_kind():
    assert model_error("[request id: 1] max_tokens must be a positive integer, got 0").status == 400
    assert model_error("[request id: 1] max_tokens must be a positive integer, got 0").message.startswith("max_tokens")
    assert model_error("server overloaded: 8 requests are waiting; retry later").status == 503
    assert model_error("internal error while accepting this request; see the server log").status == 500
