"""How soon the supervisor restarts Triton (backend/frontend/supervisor/restarts.py), on a
hand-driven clock; tests/integration/test_lifecycle.py kills the real Triton."""
import doctest
import os
import subprocess
import sys

from backend.frontend.supervisor import restarts
from backend.frontend.supervisor.restarts import RestartPolicy


def test_doctests():
    assert doctest.testmod(restarts).failed == 0


def test_restarts_never_give_up_by_default():
    """A crash loop (a local client killing Triton again and again) slows restarts down to one
    every 30 s but never ends the service; SPECSERVE_MAX_RESTARTS = n > 0 gives up after n."""
    for max_restarts, delays in [(0, [1, 2, 4, 8, 16, 30, 30, 30]), (2, [1, 2, None])]:
        policy = RestartPolicy(max_restarts, clock=lambda: 0.0)
        assert [policy.delay() for _ in delays] == delays


def test_the_longest_wait_is_a_setting():
    policy = RestartPolicy(0, clock=lambda: 0.0, backoff_max_s=4.0)
    assert [policy.delay() for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_the_setting_is_read_from_the_environment():
    """SPECSERVE_RESTART_BACKOFF_MAX_S, never below 1 s; 30 s when unset."""
    def read(value: str) -> str:
        code = "from backend.frontend.supervisor.restarts import RESTART_BACKOFF_MAX_S as m; print(m)"
        env = dict(os.environ, SPECSERVE_RESTART_BACKOFF_MAX_S=value)
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert [read(v) for v in ("2", "0", "")] == ["2.0", "1.0", "30.0"]


def test_restarts_older_than_the_window_are_forgotten():
    now = [0.0]
    policy = RestartPolicy(max_restarts=2, window_s=600.0, clock=lambda: now[0])
    assert (policy.delay(), policy.delay(), policy.delay()) == (1.0, 2.0, None)
    now[0] = 601.0  # both restarts out of the window: back to the first delay
    assert policy.delay() == 1.0 and len(policy.times) == 1
