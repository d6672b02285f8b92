"""The served model's response path (backend/frontend/triton_adapter.py TritonSink through a
ResponseWriter) with stand-ins for Triton's `triton_python_backend_utils`: responses leave in
order from the writer's thread, a failed send turns into a cancel, close() flushes.
The integration tests run the same path inside the real server."""
import importlib
import sys
import threading
import types

import pytest

from backend.generation.sequence import Chunk
from test_triton_forward import FINAL, InferenceResponse, Tensor, TritonError


class Sender:
    def __init__(self, fail_after=None):
        self.sent, self.fail_after, self.threads = [], fail_after, set()

    def send(self, response, flags=0):
        self.threads.add(threading.current_thread().name)
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise RuntimeError("the client is gone")
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


@pytest.fixture
def adapter(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, TritonError, InferenceResponse
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    return importlib.reload(importlib.import_module("backend.frontend.triton_adapter"))


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


def test_without_a_writer_sends_at_once(adapter):
    sender = Sender()
    adapter.TritonSink(sender).send(chunk("x"), final=True)
    assert [(text_of(r), f) for r, f in sender.sent] == [("x", FINAL)]
    assert sender.threads == {threading.current_thread().name}
