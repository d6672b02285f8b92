"""The supervisor's watch over a Triton start (backend/frontend/supervisor/triton_watch.py) on a hand-driven
clock; tests/integration/test_lifecycle.py kills and stops the real stubs."""
import doctest

from backend.frontend.supervisor import triton_watch
from backend.frontend.supervisor.triton_watch import MIN_START_DEADLINE_S, StartDeadlines, Stub, TritonWatch


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_docstring_examples():
    assert doctest.testmod(triton_watch).failed == 0


def test_a_stub_that_dies_while_triton_loads_restarts_it():
    """Triton 2.51 waits forever for a stub that died in its model's initialisation (a zombie it
    never reaps): restart once it has been dead a second. One that Triton stops and reaps itself
    (the auto-complete stub) is gone at once and no reason."""
    clock = Clock()
    watch = TritonWatch({"llm", "llm_unary"}, deadline_s=600, clock=clock)
    assert watch.check(False, [Stub(7, "llm", False)]) is None
    clock.t += 0.5  # a zombie's command line is gone: its model is what the watch saw before
    assert watch.check(False, [Stub(7, None, True)]) is None  # just died: maybe being reaped
    clock.t += 0.5
    assert watch.check(False, [Stub(8, "llm", False)]) is None  # reaped; another started
    clock.t += 0.5
    assert watch.check(False, [Stub(8, None, True), Stub(9, "llm_unary", False)]) is None
    clock.t += 0.9
    assert watch.check(False, [Stub(8, None, True), Stub(9, "llm_unary", False)]) is None
    clock.t += 0.1
    assert watch.check(False, [Stub(8, None, True), Stub(9, "llm_unary", False)]) == \
        "the Python-backend stub of model 'llm' died while tritonserver was loading"
    assert not watch.deadline_missed and watch.ready_after is None


def test_a_stub_never_seen_alive_is_named_by_its_pid():
    clock = Clock()
    watch = TritonWatch({"llm"}, deadline_s=600, clock=clock)
    assert watch.check(False, [Stub(7, None, True)]) is None
    clock.t += 1.0
    assert watch.check(False, [Stub(7, None, True)]) == \
        "the Python-backend stub (pid 7) died while tritonserver was loading"


def test_a_start_past_its_deadline_restarts_it():
    clock = Clock()
    watch = TritonWatch({"llm"}, deadline_s=60, clock=clock)
    clock.t += 60
    assert watch.check(False, [Stub(7, "llm", False)]) is None
    clock.t += 0.5
    assert "was not ready 60 s after it started" in watch.check(False, [Stub(7, "llm", False)])
    assert watch.deadline_missed


def test_once_ready_every_python_model_needs_a_live_stub():
    clock = Clock()
    watch = TritonWatch({"llm", "llm_unary"}, deadline_s=60, clock=clock)
    assert watch.check(False, []) is None
    clock.t += 12.5
    live = [Stub(7, "llm", False), Stub(9, "llm_unary", False)]
    assert watch.check(True, live) is None and watch.ready_after == 12.5
    clock.t += 1000  # no deadline once ready
    assert watch.check(False, live) is None
    assert watch.check(False, [Stub(7, "llm", True), Stub(9, "llm_unary", False)]) == \
        "the Python-backend stub of model 'llm' died"
    assert watch.check(False, [Stub(7, "llm", False)]) == "the Python-backend stub of model 'llm_unary' died"


def test_deadlines_come_from_measured_loads():
    deadlines = StartDeadlines()
    deadlines.loaded(3.0)
    assert deadlines.next() == MIN_START_DEADLINE_S
    deadlines.missed()
    deadlines.missed()  # a machine slower than measured: 2x, 4x, ... never a restart loop
    assert deadlines.next() == 4 * MIN_START_DEADLINE_S
    deadlines.loaded(2.0)  # ready again: back to the measured slowest
    assert deadlines.next() == MIN_START_DEADLINE_S
    fixed = StartDeadlines(45.0)  # SPECSERVE_START_TIMEOUT_S
    fixed.loaded(30.0)
    assert fixed.next() == 45.0
    fixed.missed()
    assert fixed.next() == 90.0
