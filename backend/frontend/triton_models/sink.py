"""A sequence's responses to Triton: TritonSink sends its chunks, through a ResponseWriter's thread
when the config says async_send, which also polls Triton for cancels."""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Dict, Optional

import triton_python_backend_utils as pb_utils

from .responses import FINAL, INTERNAL, chunk_outputs
from ...generation.sequence import Chunk

log = logging.getLogger("specserve")


class ResponseWriter:
    """Sends the engine loop's responses from a thread of its own, in order. Building and sending
    a response (Python, then IPC to Triton) took about a tenth of the loop's time at 1, 8 and 32
    streams; here it can overlap the next step's forward, which runs without the GIL. On 2 cores
    that both run llama.cpp it shortened steps ~5% at one stream, nothing measurable at 8 or 32
    (docs/results.md); it pays where a core is spare.

    It also asks Triton, every `poll_s`, whether the open requests were cancelled, so that the
    loop's checks (TritonSink.cancelled) read a flag: `is_cancelled()` is an IPC round trip to
    Triton (~70 us), which at 32 streams held the loop thread ~5% of its time, its llama.cpp
    workers idle meanwhile (issue 30, docs/results.md)."""

    def __init__(self, poll_s: float = 0.05):
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self.poll_s = poll_s
        self._open: Dict[int, "TritonSink"] = {}  # id -> sink, until its final response is sent
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="response-writer", daemon=True)
        self.thread.start()

    def put(self, send) -> None:
        self.queue.put(send)

    def watch(self, sink: "TritonSink") -> None:
        with self._lock:
            idle = not self._open
            self._open[id(sink)] = sink
        if idle:  # the writer sleeps while there is nothing to poll: wake it
            self.queue.put(False)

    def unwatch(self, sink: "TritonSink") -> None:
        with self._lock:
            self._open.pop(id(sink), None)

    def _run(self) -> None:
        next_poll = time.monotonic() + self.poll_s
        while True:
            try:
                send = self.queue.get(timeout=max(0.0, next_poll - time.monotonic()) if self._open else None)
            except queue.Empty:
                send = False
            if send is None:
                return
            if send:
                send()  # TritonSink's sends catch their own errors
            if time.monotonic() >= next_poll:
                self._poll_cancels()
                next_poll = time.monotonic() + self.poll_s

    def _poll_cancels(self) -> None:
        with self._lock:
            sinks = list(self._open.values())
        for sink in sinks:
            try:
                sink.cancel_seen = sink.cancel_seen or sink.sender.is_cancelled()
            except Exception:  # a sender Triton already let go of: its request is over
                sink.cancel_seen = True

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then stop."""
        self.queue.put(None)
        self.thread.join(timeout)


class TritonSink:
    """Sends a sequence's chunks through the request's response sender (or its ResponseGroup);
    through `writer` (a ResponseWriter) when given: a send that fails there (the client is gone)
    makes `cancelled()` true, and the loop cancels the sequence at its next check; the writer
    also polls Triton for the request's cancellation (`cancelled()` then reads its answer)."""

    def __init__(self, sender, requests=None, batch_index=None, sequence_index=None,
                 writer: Optional[ResponseWriter] = None):
        self.sender, self.batch_index, self.sequence_index = sender, batch_index, sequence_index
        self.requests = requests  # backend.frontend.metrics.RequestLog: error reasons, answered token counts, latencies
        self.received_s, self.first_s = time.monotonic(), None
        self.writer, self.failed, self.cancel_seen = writer, False, False
        # the writer polls it from the loop's first check (None: not yet) until its final response (False)
        self._watch: Optional[bool] = None if writer is not None else False

    def send(self, chunk: Chunk, final: bool) -> None:
        if self.writer is None:
            return self._send(chunk, final)
        if self.failed:
            raise RuntimeError("an earlier response of this request could not be sent")
        if final:
            self._unwatch()
        self.writer.put(lambda: self._guarded(self._send, chunk, final))

    def error(self, message: str, code=INTERNAL) -> None:
        if self.writer is None:
            return self._error(message, code)
        self._unwatch()
        self.writer.put(lambda: self._guarded(self._error, message, code))

    def _unwatch(self) -> None:
        self._watch = False
        self.writer.unwatch(self)

    def _guarded(self, send, *args) -> None:
        try:
            send(*args)
        except Exception:
            self.failed = True
            log.warning("sending a response failed; the request will be cancelled", exc_info=True)

    def _send(self, chunk: Chunk, final: bool) -> None:
        outputs = [pb_utils.Tensor(k, v) for k, v in chunk_outputs(chunk, self.batch_index, self.sequence_index).items()]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)
        if self.requests is not None:
            now = time.monotonic()
            self.first_s = self.first_s or now - self.received_s
            if final:
                self.requests.answered(chunk.num_input_tokens, chunk.num_output_tokens, self.first_s,
                                       now - self.received_s)

    def _error(self, message: str, code=INTERNAL) -> None:
        """A final error response; the loop's own failures (after admission) are server faults."""
        self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))),
                         flags=FINAL)
        if self.requests is not None:  # Triton counts this request a success: count it ourselves
            self.requests.error(code)

    def cancelled(self) -> bool:
        if self.writer is None:
            return self.failed or self.sender.is_cancelled()
        if self._watch is None:  # the loop checks only the requests it holds: those the writer polls
            self._watch = True
            self.writer.watch(self)
        return self.failed or self.cancel_seen
