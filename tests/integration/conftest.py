"""Start the real Triton server (the project's model repository) once for the session."""
import pytest

from server_helpers import running_server

SERVER_ENV = {  # small limits so the bad-input cases are cheap to reach
    "SPECSERVE_MAX_BATCH": "8",
    "SPECSERVE_MAX_CONTEXT": "512",
    "SPECSERVE_MAX_TOKENS_LIMIT": "256",
}


@pytest.fixture(scope="session")
def server(tmp_path_factory, checkpoint):
    log_dir = tmp_path_factory.mktemp("triton")
    trace = log_dir / "trace.jsonl"  # every step the server runs (tests/integration/test_replay_server.py)
    with running_server(dict(SERVER_ENV, SPECSERVE_TRACE_FILE=str(trace)), log_dir) as srv:
        srv.trace_file = trace
        yield srv
