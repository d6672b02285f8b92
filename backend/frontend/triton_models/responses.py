"""What goes back to Triton: a response's output tensors (chunk_outputs), one request's responses
shared by its generations (ResponseGroup), a sender that also sees the edge's cancel mark
(MarkedSender), and Triton's error codes."""
from __future__ import annotations

import json
import os
import re
import threading
from typing import Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from ...generation.sequence import Chunk
from ...wire import REQUEST_ID

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# pb_utils.TritonError codes (looked up when sending: the stub defines TritonError only once it
# serves). Triton's HTTP front end maps them to 400 / 503 / 500; gRPC streams carry only the
# message, so every message says what kind of error it is.
INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"
_REQUEST_ID_FORM = re.compile(r"[0-9a-f]{32}")  # uuid4().hex: nothing else names a file


class ResponseGroup:
    """The generations of one Triton request (batch rows x num_return_sequences) share its response
    sender: only the last generation to finish sends the final flag. An error response closes the
    request at once; a later send from a sibling raises (the loop then cancels that sibling)."""

    def __init__(self, sender, count: int):
        self.sender, self.left, self.closed = sender, count, False
        self.lock = threading.Lock()

    def send(self, response, flags: int = 0) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("the request already ended")
            if response.has_error():
                self.closed = True
            elif flags & FINAL:
                self.left -= 1
                self.closed = self.left == 0
            self.sender.send(response, flags=FINAL if self.closed else 0)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


def cancel_mark(request) -> Optional[str]:
    """The file the HTTP edge creates if this request's client leaves (backend/frontend/edge/cancel_marks.py),
    or None: no edge id (gRPC, or a server without the edge)."""
    directory = os.environ.get("SPECSERVE_CANCEL_DIR")
    if not directory:
        return None
    try:
        rid = json.loads(request.parameters() or "{}").get(REQUEST_ID)
    except (ValueError, AttributeError):
        return None
    return os.path.join(directory, rid) if isinstance(rid, str) and _REQUEST_ID_FORM.fullmatch(rid) else None


class MarkedSender:
    """A response sender that also counts the edge's cancel mark as a cancel: Triton 2.51 does not
    tell the model when an HTTP client leaves before its first response; the edge sees it. The mark
    is removed with the final response (one stat per poll: cheaper than is_cancelled's IPC)."""

    def __init__(self, sender, mark: str):
        self.sender, self.mark = sender, mark

    def send(self, response, flags: int = 0) -> None:
        try:
            self.sender.send(response, flags=flags)
        finally:
            if flags & FINAL:
                try:
                    os.unlink(self.mark)
                except OSError:
                    pass

    def is_cancelled(self) -> bool:
        return os.path.exists(self.mark) or self.sender.is_cancelled()


PERF_OUTPUTS = {"acceptance_rate": np.float32, "total_draft_tokens": np.int32, "total_accepted_draft_tokens": np.int32,
                "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
                "last_token_time_ns": np.int64}
KV_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")


def chunk_outputs(chunk: Chunk, batch_index=None, sequence_index=None) -> dict:
    """A response's output tensors {name: ndarray}. TensorRT-LLM's outputs that our first ones
    lack carry its batch dimension, as its clients read them (x[0][0]): cum_log_probs [1, 1] and
    output_log_probs [1, 1, n] (batch, beam, tokens), our output_token_ids [1, 1, n] and
    output_top_token_ids / output_top_log_probs [1, 1, n, k], batch_index, sequence_index, perf
    metrics [1, 1]."""
    out = {"text_output": np.array([chunk.text.encode("utf-8")], dtype=np.object_)}
    for name in ("num_input_tokens", "num_output_tokens", "num_draft_tokens", "num_accepted_tokens"):
        out[name] = np.array([getattr(chunk, name)], dtype=np.int32)
    if chunk.finish_reason:
        out["finish_reason"] = np.array([chunk.finish_reason.encode()], dtype=np.object_)
    if chunk.output_log_probs is not None:
        out["cum_log_probs"] = np.array([[chunk.cum_log_prob]], dtype=np.float32)
        out["output_log_probs"] = np.array(chunk.output_log_probs, dtype=np.float32).reshape(1, 1, -1)
        out["output_token_ids"] = np.array(chunk.output_token_ids or [], dtype=np.int32).reshape(1, 1, -1)
    if chunk.top_token_ids is not None:
        n, k = len(chunk.top_token_ids), len(chunk.top_token_ids[0]) if chunk.top_token_ids else 0
        out["output_top_token_ids"] = np.array(chunk.top_token_ids, dtype=np.int32).reshape(1, 1, n, k)
        out["output_top_log_probs"] = np.array(chunk.top_log_probs, dtype=np.float32).reshape(1, 1, n, k)
    if chunk.perf is not None:
        out.update({k: np.array([[chunk.perf[k]]], dtype=t) for k, t in PERF_OUTPUTS.items()})
        # TensorRT-LLM's KV-cache block counts (blocks reused across requests: backend/loop/retained.py)
        out.update({k: np.array([[chunk.perf.get(k, 0)]], dtype=np.int32) for k in KV_OUTPUTS})
    if chunk.output_ids is not None:  # TensorRT-LLM's [batch, beam, tokens] and [batch, beam]
        out["output_ids"] = np.array(chunk.output_ids, dtype=np.int32).reshape(1, 1, -1)
        out["sequence_length"] = np.array([[len(chunk.output_ids)]], dtype=np.int32)
    if batch_index is not None:
        out["batch_index"] = np.array([[batch_index]], dtype=np.int32)
    if sequence_index is not None:
        out["sequence_index"] = np.array([[sequence_index]], dtype=np.int32)
    return out
