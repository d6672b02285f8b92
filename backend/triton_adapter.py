"""The Triton Python-backend model: converts wire tensors to domain types and back.

The only module that imports `triton_python_backend_utils`. The interface is the
tensor names of NVIDIA's TensorRT-LLM backend ensemble (text_input, max_tokens,
stream, temperature, top_k, top_p, random_seed, stop_words, end_id, ...,
output text_output), so existing TensorRT-LLM clients, perf_analyzer and
genai-perf work unchanged. The model is decoupled: execute() validates and hands
requests to the engine loop, which streams responses from its own thread.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from .engine_loop import EngineLoop
from .request import GenerationRequest, Overloaded, RequestError, decode_utf8
from .sampling import SamplingParams
from .sequence import Chunk
from .server_config import ServerConfig
from .service import build_service

log = logging.getLogger("specserve")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# pb_utils.TritonError codes (looked up when sending: the stub defines TritonError only once it
# serves). Triton's HTTP front end maps them to 400 / 503 / 500; gRPC streams carry only the
# message, so every message says what kind of error it is.
INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

# Inputs of the TensorRT-LLM ensemble we act on, plus our own apply_chat_template.
# pad_id / bad_words / beam_width are accepted for compatibility (see _convert).
_SCALARS = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "random_seed": int,
            "end_id": int, "pad_id": int, "beam_width": int, "stream": bool, "exclude_input_in_output": bool,
            "apply_chat_template": bool}


def _tensor(request, name: str) -> Optional[np.ndarray]:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _scalar(request, name: str, kind):
    arr = _tensor(request, name)
    if arr is None:
        return None
    if arr.size != 1:
        raise RequestError(f"{name} must hold exactly one value per request, got shape {list(arr.shape)}")
    value = arr.reshape(-1)[0]
    return kind(value.item() if hasattr(value, "item") else value)


def _strings(request, name: str) -> list:
    arr = _tensor(request, name)
    if arr is None:
        return []
    return [decode_utf8(b, name) if isinstance(b, bytes) else str(b) for b in arr.reshape(-1)]


def _convert(request, cfg: ServerConfig) -> GenerationRequest:
    text = _tensor(request, "text_input")
    if text is None or text.size == 0:
        raise RequestError("text_input is missing or empty")
    if text.size != 1:
        raise RequestError(f"send one prompt per request (text_input has shape {list(text.shape)})")
    raw = text.reshape(-1)[0]
    prompt = decode_utf8(raw, "text_input") if isinstance(raw, bytes) else str(raw)
    v = {k: _scalar(request, k, kind) for k, kind in _SCALARS.items()}
    if v["beam_width"] not in (None, 1):
        raise RequestError(f"beam_width {v['beam_width']} is not supported (only 1)")
    if any(_strings(request, "bad_words")):
        raise RequestError("bad_words is not supported")
    stop_words = [w for w in _strings(request, "stop_words") if w]
    sampling = SamplingParams(temperature=v["temperature"] if v["temperature"] is not None else 0.0,
                              top_k=v["top_k"] or 0, top_p=v["top_p"] if v["top_p"] is not None else 1.0)
    # TensorRT-LLM treats top_k=1 as greedy; so do we (exactly the same tokens).
    if sampling.top_k == 1:
        sampling = SamplingParams()
    chat = v["apply_chat_template"]
    return GenerationRequest(
        prompt=prompt,
        max_tokens=v["max_tokens"] if v["max_tokens"] is not None else cfg.default_max_tokens,
        sampling=sampling, seed=v["random_seed"], stop_words=stop_words, end_id=v["end_id"],
        stream=bool(v["stream"]), exclude_input_in_output=bool(v["exclude_input_in_output"]),
        apply_chat_template=cfg.chat_template_default if chat is None else chat)


class TritonSink:
    """Sends a sequence's chunks through the request's response sender."""

    def __init__(self, sender):
        self.sender = sender

    def send(self, chunk: Chunk, final: bool) -> None:
        outputs = [pb_utils.Tensor("text_output", np.array([chunk.text.encode("utf-8")], dtype=np.object_))]
        for name in ("num_input_tokens", "num_output_tokens", "num_draft_tokens", "num_accepted_tokens"):
            outputs.append(pb_utils.Tensor(name, np.array([getattr(chunk, name)], dtype=np.int32)))
        if chunk.finish_reason:
            outputs.append(pb_utils.Tensor("finish_reason", np.array([chunk.finish_reason.encode()], dtype=np.object_)))
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)

    def error(self, message: str, code=INTERNAL) -> None:
        """A final error response; the loop's own failures (after admission) are server faults."""
        self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))),
                         flags=FINAL)

    def cancelled(self) -> bool:
        return self.sender.is_cancelled()


class MetricsPublisher:
    """Mirrors the loop's counters into Triton's Prometheus metrics (port --metrics-port).

    Published from a side thread a few times a second, not per step: each update is
    an IPC round trip to the server, which the step's hot path should not pay.
    """

    COUNTERS = {  # metric name -> (LoopStats field, help)
        "specserve_steps_total": ("steps", "speculative steps run"),
        "specserve_step_sequences_total": ("sequence_steps", "sum over steps of the running batch size"),
        "specserve_tokens_emitted_total": ("emitted", "tokens emitted by steps (excludes each request's first token)"),
        "specserve_tokens_drafted_total": ("drafted", "draft tokens proposed"),
        "specserve_tokens_accepted_total": ("accepted", "draft tokens accepted"),
        "specserve_requests_finished_total": ("finished", "requests finished (stop or length)"),
        "specserve_requests_cancelled_total": ("cancelled", "requests cancelled by the client"),
        "specserve_drafter_errors_total": ("drafter_errors", "drafter failures (fell back to plain decoding)"),
        "specserve_preemptions_total": ("preemptions", "sequences preempted for lack of KV blocks (recomputed later)"),
        "specserve_memory_gamma_cuts_total": ("memory_gamma_cuts", "steps whose drafts were dropped for lack of KV blocks"),
        "specserve_drafter_parks_total": ("drafter_parks", "model drafters parked to give their memory to the KV pool"),
        "specserve_drafter_reloads_total": ("drafter_reloads", "model drafter reloads started"),
    }
    PHASES = ("prefill", "draft", "verify", "accept", "io", "step")

    def __init__(self, loop, period_s: float = 0.2):
        self.loop, self.period_s = loop, period_s
        self._stop = threading.Event()
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = []
        self.counters = {}
        for name, (field, help_) in self.COUNTERS.items():
            fam = pb_utils.MetricFamily(name=name, description=help_, kind=counter)
            self.families.append(fam)
            self.counters[field] = [fam.Metric(labels={}), 0]
        fam = pb_utils.MetricFamily(name="specserve_phase_seconds_total", kind=counter,
                                    description="engine-loop wall time by phase (step = whole steps)")
        self.families.append(fam)
        for ph in self.PHASES:
            self.counters[f"{ph}_time_s"] = [fam.Metric(labels={"phase": ph}), 0.0]
        fam = pb_utils.MetricFamily(name="specserve_sequences", kind=gauge,
                                    description="sequences by state (running hold a batch slot and KV cache)")
        self.families.append(fam)
        self.gauges = {st: fam.Metric(labels={"state": st}) for st in ("running", "waiting")}
        fam = pb_utils.MetricFamily(name="specserve_kv_blocks", kind=gauge,
                                    description="KV cache blocks (16 tokens) by state; the pool grows when a drafter is parked")
        self.families.append(fam)
        self.kv_gauges = {st: fam.Metric(labels={"state": st}) for st in ("free", "total")}
        self.thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self.thread.start()

    def publish(self) -> None:
        stats = self.loop.stats
        for field, entry in self.counters.items():
            value = getattr(stats, field)
            if value > entry[1]:
                entry[0].increment(value - entry[1])
                entry[1] = value
        self.gauges["running"].set(len(self.loop.running))
        self.gauges["waiting"].set(len(self.loop.waiting) + self.loop.inbox.qsize())
        self.kv_gauges["free"].set(self.loop.pool.num_free)
        self.kv_gauges["total"].set(self.loop.pool.num_blocks)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.publish()
            except Exception:
                log.exception("publishing metrics failed")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2)


class TritonPythonModel:
    def initialize(self, args):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("this model must be decoupled (model_transaction_policy)")
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        self.root = Path(params.pop("project_root", "") or Path(__file__).resolve().parents[1])
        self.cfg = ServerConfig.load(params)
        log.info("config: %s", self.cfg)
        self.loop = build_service(self.cfg, self.root)
        self.loop.start()
        self.metrics = None
        if isinstance(self.loop, EngineLoop):
            self.metrics = MetricsPublisher(self.loop)
        else:
            log.warning("the specserve_* metrics are not yet published for engine=%s", self.cfg.engine)

    def execute(self, requests):
        for request in requests:
            sink = TritonSink(request.get_response_sender())
            try:
                self.loop.submit(_convert(request, self.cfg), sink)
            except RequestError as e:  # the client's mistake: HTTP 400
                sink.error(str(e), INVALID_ARG)
            except Overloaded as e:  # HTTP 503: retry later
                sink.error(str(e), UNAVAILABLE)
            except Exception:  # never let one bad request take the model down; no internals to the client
                log.exception("could not accept a request")
                sink.error("internal error while accepting this request; see the server log", INTERNAL)
        return None

    def finalize(self):
        if self.metrics is not None:
            self.metrics.stop()
        self.loop.stop()
