"""The Triton Python-backend model: converts wire tensors to domain types and back.

The only module that imports `triton_python_backend_utils`. The interface is the
tensor names of NVIDIA's TensorRT-LLM backend ensemble (text_input, max_tokens,
stream, temperature, top_k, top_p, random_seed, stop_words, end_id, ...,
output text_output), so existing TensorRT-LLM clients, perf_analyzer and
genai-perf work unchanged. The model is decoupled: execute() validates and hands
requests to the service (backend/services/contract.py: our engine loop, or TensorRT-LLM),
which streams responses from its own thread.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from .metrics import MetricsPublisher, RequestLog
from .triton_forward import model_config
from ..generation.guided import Guide
from ..generation import word_lists
from ..generation.logits_processors import Penalties
from ..generation.request import GenerationRequest, Overloaded, RequestError, decode_utf8, validate
from ..generation.sampling import SamplingParams
from ..generation.sequence import Chunk
from ..served import for_model
from ..server_config import ServerConfig
from ..services import Service
from ..services.build import build_service
from ..wire import REQUEST_ID, ErrorKind

log = logging.getLogger("specserve")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# pb_utils.TritonError codes (looked up when sending: the stub defines TritonError only once it
# serves). Triton's HTTP front end maps them to 400 / 503 / 500; gRPC streams carry only the
# message, so every message says what kind of error it is.
INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

# Inputs of the TensorRT-LLM ensemble we act on, plus our own apply_chat_template and min_length
# (TensorRT-LLM's min_tokens under its sampling-config name). pad_id / beam_width are accepted for
# compatibility (see _convert). Every input may carry a batch dimension > 1 (one row per prompt, as
# end_to_end_grpc_client.py --batch-inputs sends): a single row applies to every prompt.
_SCALARS = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "random_seed": int,
            "end_id": int, "pad_id": int, "beam_width": int, "stream": bool, "exclude_input_in_output": bool,
            "apply_chat_template": bool, "repetition_penalty": float, "presence_penalty": float,
            "frequency_penalty": float, "min_length": int, "min_tokens": int, "return_log_probs": bool,
            "return_top_log_probs": int, "return_perf_metrics": bool, "num_return_sequences": int}
MAX_RETURN_SEQUENCES = 16
_REQUEST_ID_FORM = re.compile(r"[0-9a-f]{32}")  # uuid4().hex: nothing else names a file


def _tensor(request, name: str) -> Optional[np.ndarray]:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _rows(arr: np.ndarray, name: str, batch: int) -> list:
    """An input's rows, one per prompt of the batch (a single row applies to every prompt)."""
    rows = arr.reshape(1, -1) if arr.ndim < 2 else arr.reshape(arr.shape[0], -1)
    if rows.shape[0] == batch:
        return list(rows)
    if rows.shape[0] == 1:
        return [rows[0]] * batch
    raise RequestError(f"{name} has {rows.shape[0]} rows for a batch of {batch} prompts (text_input); send one "
                       f"row per prompt, or one for all")


def _scalars(request, name: str, kind, batch: int) -> list:
    arr = _tensor(request, name)
    if arr is None:
        return [None] * batch
    out = []
    for row in _rows(arr, name, batch):
        if row.size != 1:
            raise RequestError(f"{name} must hold exactly one value per request, got shape {list(arr.shape)}")
        value = row[0]
        out.append(kind(value.item() if hasattr(value, "item") else value))
    return out


def _strings(request, name: str, batch: int) -> list:
    arr = _tensor(request, name)
    if arr is None:
        return [[] for _ in range(batch)]
    if arr.dtype != np.object_:
        raise RequestError(f"{name} must be strings (BYTES), got {arr.dtype}")
    return [[decode_utf8(b, name) if isinstance(b, bytes) else str(b) for b in row] for row in _rows(arr, name, batch)]


def _token_prompt(request) -> Optional[list]:
    """input_ids (a token-level prompt, [1, n] or [n]) as a list, or None when not sent; a prompt
    in text_input as well is refused."""
    arr = _tensor(request, "input_ids")
    if arr is None:
        return None
    text = _tensor(request, "text_input")
    if text is not None and text.size:
        raise RequestError("send the prompt as text_input or as input_ids, not both")
    if arr.ndim > 1 and arr.shape[0] != 1:
        raise RequestError(f"input_ids has {arr.shape[0]} rows; send one token sequence per request")
    return [int(t) for t in arr.reshape(-1)]


def _word_lists(request, name: str, batch: int) -> list:
    """stop_words_list / bad_words_list ([2, n] int32 per prompt: backend/generation/word_lists.py)
    as token sequences, one list per prompt of the batch."""
    arr = _tensor(request, name)
    if arr is None:
        return [[] for _ in range(batch)]
    if arr.ndim < 2 or arr.shape[-2] != 2:
        raise RequestError(f"{name} must have shape [2, n] per request (ids, end offsets), got {list(arr.shape)}")
    try:
        return [word_lists.decode(r.reshape(2, -1), name) for r in _rows(arr.reshape(-1, 2 * arr.shape[-1]), name, batch)]
    except ValueError as e:
        raise RequestError(str(e)) from None


def _convert(request, cfg: ServerConfig) -> list:
    """One Triton request -> [(GenerationRequest, batch_index, sequence_index)]: one per prompt of
    the batch (text_input rows) and returned sequence (num_return_sequences); an index is None
    when that dimension is 1 (its output is then not sent)."""
    text, ids = _tensor(request, "text_input"), _token_prompt(request)
    if ids is not None:  # one token-level prompt: the batch is its one row
        text = np.array([b""], dtype=np.object_)
    if text is None or text.size == 0:
        raise RequestError("text_input is missing or empty")
    batch = text.shape[0] if text.ndim >= 1 else 1
    if text.size != batch:
        raise RequestError(f"send one prompt per batch row (text_input has shape {list(text.shape)})")
    columns = {k: _scalars(request, k, kind, batch) for k, kind in _SCALARS.items()}
    stop_rows, bad_rows = _strings(request, "stop_words", batch), _strings(request, "bad_words", batch)
    guide_types, guides = _strings(request, GUIDE_TYPE, batch), _strings(request, GUIDE_TEXT, batch)
    stop_ids, bad_ids = _word_lists(request, "stop_words_list", batch), _word_lists(request, "bad_words_list", batch)
    out = []
    for b, raw in enumerate(text.reshape(-1)):
        v = {k: col[b] for k, col in columns.items()}
        where = f" (batch row {b})" if batch > 1 else ""
        prompt = decode_utf8(raw, "text_input") if isinstance(raw, bytes) else str(raw)
        if v["beam_width"] not in (None, 1):
            raise RequestError(f"beam_width {v['beam_width']} is not supported (only 1){where}")
        n = 1 if v["num_return_sequences"] is None else v["num_return_sequences"]
        if not 1 <= n <= MAX_RETURN_SEQUENCES:
            raise RequestError(f"num_return_sequences must be between 1 and {MAX_RETURN_SEQUENCES}, got {n}{where}")
        if None not in (v["min_length"], v["min_tokens"]) and v["min_length"] != v["min_tokens"]:
            raise RequestError(f"min_length {v['min_length']} and min_tokens {v['min_tokens']} disagree (they are "
                               f"the same setting){where}")
        min_length = v["min_length"] if v["min_length"] is not None else v["min_tokens"]
        penalties = Penalties(
            repetition_penalty=1.0 if v["repetition_penalty"] is None else v["repetition_penalty"],
            presence_penalty=0.0 if v["presence_penalty"] is None else v["presence_penalty"],
            frequency_penalty=0.0 if v["frequency_penalty"] is None else v["frequency_penalty"],
            min_length=0 if min_length is None else min_length, bad_words=tuple(w for w in bad_rows[b] if w))
        sampling = SamplingParams(temperature=v["temperature"] if v["temperature"] is not None else 0.0,
                                  top_k=v["top_k"] or 0, top_p=v["top_p"] if v["top_p"] is not None else 1.0)
        # TensorRT-LLM treats top_k=1 as greedy; so do we (exactly the same tokens).
        if sampling.top_k == 1:
            sampling = SamplingParams()
        chat = v["apply_chat_template"]
        guide = _guide(guide_types[b], guides[b], where)
        for s in range(n):  # sequence s samples with seed + s when a seed is given
            seed = None if v["random_seed"] is None else (v["random_seed"] + s) % (1 << 64)
            out.append((GenerationRequest(
                prompt=prompt,
                max_new_tokens=cfg.max_new_tokens(v["max_tokens"]),
                sampling=sampling, seed=seed, stop_words=[w for w in stop_rows[b] if w], end_id=v["end_id"],
                stream=bool(v["stream"]), exclude_input_in_output=bool(v["exclude_input_in_output"]),
                apply_chat_template=cfg.chat_template_default if chat is None else chat, penalties=penalties,
                return_log_probs=bool(v["return_log_probs"]), return_top_log_probs=v["return_top_log_probs"] or 0,
                return_perf_metrics=bool(v["return_perf_metrics"]), input_ids=ids, stop_words_ids=stop_ids[b],
                bad_words_ids=bad_ids[b], return_output_ids=ids is not None, guide=guide),
                b if batch > 1 else None, s if n > 1 else None))
    return out


GUIDE_TYPE, GUIDE_TEXT = "guided_decoding_guide_type", "guided_decoding_guide"


def _guide(types: list, texts: list, where: str) -> Optional[Guide]:
    """TensorRT-LLM's guided decoding inputs of one prompt -> a Guide, or None (no type, or an
    empty one: unguided, as in TensorRT-LLM). The grammar itself is compiled at admission."""
    if len(types) > 1 or len(texts) > 1:
        raise RequestError(f"{GUIDE_TYPE} and {GUIDE_TEXT} take one string per request{where}")
    kind, text = (types[0].strip() if types else ""), (texts[0] if texts else "")
    if not kind:
        if text.strip():
            raise RequestError(f"{GUIDE_TEXT} needs {GUIDE_TYPE} (json, json_schema, regex or ebnf_grammar){where}")
        return None
    guide = Guide(kind, text)
    problem = guide.problem()
    if problem:
        raise RequestError(problem + where)
    return guide


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
    """The file the HTTP edge creates if this request's client leaves (backend/frontend/edge.py CancelMarks),
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


class DrainWatcher:
    """Shutdown begins when the launcher (backend/frontend/launcher.py) writes the file named by
    SPECSERVE_DRAIN_FILE, holding the seconds in-flight requests may still run. From then on
    the model refuses new requests on every protocol (UNAVAILABLE, "server shutting down"),
    and the service lets those in flight finish for that long, then fails the rest; once nothing
    is in flight it writes `<file>.done`, so the launcher stops Triton without waiting longer."""

    def __init__(self, path: str, service: Service, period_s: float = 0.05, writer: Optional[ResponseWriter] = None):
        self.path, self.service, self.period_s, self.writer = Path(path), service, period_s, writer
        self.draining = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drain-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                if not self.draining:
                    try:
                        text = self.path.read_text().strip()
                    except OSError:
                        continue
                    try:
                        seconds = float(text or 0)
                    except ValueError:
                        seconds = 0.0
                    self.draining = True
                    log.warning("shutdown: refusing new requests; in-flight ones have %.1f s to finish", seconds)
                    self.service.drain(seconds)
                elif self.service.idle and (self.writer is None or self.writer.queue.empty()):
                    self.path.with_name(self.path.name + ".done").write_text("drained\n")
                    log.warning("shutdown: nothing in flight")
                    return
            except Exception:
                log.exception("drain watcher failed")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2)


class TritonPythonModel:
    def initialize(self, args):
        _, params = model_config(args, True, "this model must be decoupled (model_transaction_policy)")
        self.root = Path(params.pop("project_root", "") or Path(__file__).resolve().parents[2])
        self.cfg = for_model(params, root=self.root)  # the launcher's record (backend/served.py)
        log.info("config: %s", self.cfg)
        self.service: Service = build_service(self.cfg, self.root)
        self.writer = ResponseWriter() if self.cfg.async_send else None
        self.requests = RequestLog()
        self.metrics = MetricsPublisher(self.service, pb_utils, args["model_name"], args["model_version"], self.requests)
        self.service.start()  # after the publisher hooked the service's step outcomes
        drain_file = os.environ.get("SPECSERVE_DRAIN_FILE")
        self.drain = DrainWatcher(drain_file, self.service, writer=self.writer) if drain_file else None

    def execute(self, requests):
        for request in requests:
            sender, mark = request.get_response_sender(), cancel_mark(request)
            sink = TritonSink(sender if mark is None else MarkedSender(sender, mark), self.requests, writer=self.writer)
            if self.drain is not None and self.drain.draining:  # shutdown began: no new work
                sink.error(ErrorKind.SHUTTING_DOWN.message("not accepting new requests; retry on another server "
                                                           "or later"), UNAVAILABLE)
                continue
            try:
                generations = _convert(request, self.cfg)
                if len(generations) > 1:  # a batch, or num_return_sequences: one response sender for all
                    for gen, _, _ in generations:  # refuse the request before any generation starts
                        validate(gen, self.service.limits)
                    sink.sender = ResponseGroup(sink.sender, len(generations))
                for gen, b, s in generations:
                    self.service.submit(gen, TritonSink(sink.sender, self.requests, b, s, self.writer))
            except RequestError as e:  # the client's mistake: HTTP 400
                sink.error(str(e), INVALID_ARG)
            except Overloaded as e:  # HTTP 503: retry later
                sink.error(str(e), UNAVAILABLE)
            except Exception:  # never let one bad request take the model down; no internals to the client
                log.exception("could not accept a request")
                sink.error(f"{ErrorKind.INTERNAL.prefix} while accepting this request; see the server log", INTERNAL)
        return None

    def finalize(self):
        if self.drain is not None:
            self.drain.stop()
        self.metrics.stop()
        self.service.stop()
        if self.writer is not None:  # the final responses service.stop() gave the requests left
            self.writer.close()
