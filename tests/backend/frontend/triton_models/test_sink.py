"""The served model's response path (backend/frontend/triton_models/sink.py TritonSink through a
ResponseWriter) with stand-ins for Triton's `triton_python_backend_utils`: responses leave in
order from the writer's thread, a failed send turns into a cancel, close() flushes.
The integration tests run the same path inside the real server."""
import importlib
import sys
import threading
import time
import types

import pytest

from backend.generation.sequence import Chunk
from test_forward import FINAL, InferenceResponse, Tensor, TritonError


class Sender:
    def __init__(self, fail_after=None):
        self.sent, self.fail_after, self.threads = [], fail_after, set()
        self.cancel, self.polls = False, []  # polls: the threads is_cancelled ran on

    def send(self, response, flags=0):
        self.threads.add(threading.current_thread().name)
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise RuntimeError("the client is gone")
        self.sent.append((response, flags))

    def is_cancelled(self):
        self.polls.append(threading.current_thread().name)
        return self.cancel


@pytest.fixture
def adapter(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, TritonError, InferenceResponse
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    importlib.reload(importlib.import_module("backend.frontend.triton_models.responses"))
    return importlib.reload(importlib.import_module("backend.frontend.triton_models.sink"))


def chunk(text):
    return Chunk(text=text, num_input_tokens=3, num_output_tokens=1, num_draft_tokens=0, num_accepted_tokens=0)


def text_of(response):
    return {t.name(): t.as_numpy() for t in response.output_tensors()}["text_output"][0].decode()


def test_responses_leave_in_order_from_the_writer_thread(adapter):
    writer, sender = adapter.ResponseWriter(), Sender()
    sink = adapter.TritonSink(sender, writer=writer)
    for i in range(50):
        sink.send(chunk(str(i)), final=False)
    sink.error("internal error in the engine step")
    writer.close()
    assert [text_of(r) for r, _ in sender.sent[:50]] == [str(i) for i in range(50)]
    last, flags = sender.sent[-1]
    assert last.has_error() and flags == FINAL
    assert sender.threads == {"response-writer"}


def test_a_failed_send_becomes_a_cancel(adapter):
    writer, sender = adapter.ResponseWriter(), Sender(fail_after=2)
    sink = adapter.TritonSink(sender, writer=writer)
    for i in range(3):
        sink.send(chunk(str(i)), final=False)
    writer.close()
    assert len(sender.sent) == 2 and sink.cancelled()
    with pytest.raises(RuntimeError, match="could not be sent"):  # the loop then cancels the sequence
        sink.send(chunk("3"), final=True)


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


def test_the_writer_polls_cancels_and_the_loop_reads_a_flag(adapter):
    """The loop's check never waits on Triton's IPC: the writer thread asks, every poll_s, for the
    requests the loop checks, and stops asking once their final response is on its way."""
    writer, sender, other = adapter.ResponseWriter(poll_s=0.01), Sender(), Sender()
    sink, done = adapter.TritonSink(sender, writer=writer), adapter.TritonSink(other, writer=writer)
    assert not sink.cancelled() and not done.cancelled()  # the first checks start the polling
    assert wait_for(lambda: len(sender.polls) >= 2 and len(other.polls) >= 2)
    done.send(chunk("end"), final=True)
    sender.cancel = True
    assert wait_for(sink.cancelled)
    polls = len(other.polls)
    time.sleep(0.05)
    writer.close()
    assert len(other.polls) <= polls + 1  # at most a poll already under way when it finished
    assert set(sender.polls) == set(other.polls) == {"response-writer"}


def test_without_a_writer_sends_at_once(adapter):
    sender = Sender()
    adapter.TritonSink(sender).send(chunk("x"), final=True)
    assert [(text_of(r), f) for r, f in sender.sent] == [("x", FINAL)]
    assert sender.threads == {threading.current_thread().name}
