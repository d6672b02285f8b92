"""How soon the supervisor restarts Triton (backend/frontend/supervisor/restarts.py), on a
hand-driven clock; tests/integration/test_lifecycle.py kills the real Triton."""
import doctest

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


def test_restarts_older_than_the_window_are_forgotten():
    now = [0.0]
    policy = RestartPolicy(max_restarts=2, window_s=600.0, clock=lambda: now[0])
    assert (policy.delay(), policy.delay(), policy.delay()) == (1.0, 2.0, None)
    now[0] = 601.0  # both restarts out of the window: back to the first delay
    assert policy.delay() == 1.0 and len(policy.times) == 1
