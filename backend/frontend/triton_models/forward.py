"""The unary (non-decoupled) Triton models: one response per request, for HTTP /infer, gRPC
ModelInfer, `client.infer()` and `perf_analyzer -i http`, which Triton refuses for the decoupled
`llm` model (llm_unary) and `tensorrt_llm` (tensorrt_llm_unary: it asks with streaming=false and
passes the one response on, `stream_input` below).

It holds no engine: each request is forwarded inside Triton to the decoupled model named by the
`forward_to` parameter (default `llm`) with BLS (`exec(decoupled=True)`), so it joins the same
continuously batched engine loop as every streaming request. It always asks `llm` to stream (the
backend then holds a thread of its pool only until the first step, and a cancelled request is
cancelled between steps) and joins the step texts into one response with the last step's
counters and `finish_reason`: with `stream=true` that is what a streaming client accumulates;
with `stream=false` the prompt is put in front unless `exclude_input_in_output`, exactly `llm`'s
own non-streaming text (as in TensorRT-LLM). `llm`'s errors come back with their kind (400 /
503 / 500 over HTTP): Triton 2.51's BLS reports every error as INTERNAL, so the kind is read from
the message as the HTTP edge does (`server overloaded...`, `internal error...`, else the client's).

execute() copies the inputs and returns at once; a thread per request waits for `llm` and sends
the one response through the request's response sender (allowed in default mode since Triton
24.06 / 2.47), so one instance serves any number of requests concurrently.
"""
from __future__ import annotations

import json
import logging
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from ...wire import REQUEST_ID, REQUEST_ID_NAMES, ErrorKind, error_kind

log = logging.getLogger("specserve.unary")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TEXT = "text_output"


def error_code(code, message: str):
    """The TritonError code for an error `llm` sent: its own code where the BLS keeps it (Triton
    after 2.51), else from the message (backend/frontend/triton_models/responses.py's kinds)."""
    if code != pb_utils.TritonError.INTERNAL:
        return code
    kind = error_kind(message)
    if kind is ErrorKind.INVALID and ("not ready" in message or "unknown model" in message):  # Triton's own
        kind = ErrorKind.INTERNAL
    return getattr(pb_utils.TritonError, kind.triton_code)


def model_config(args, decoupled: bool, why: str) -> tuple:
    """A Python model's (config, string parameters) at initialize, logging set up and its transaction
    policy checked (TritonModelException(why) if it is not `decoupled`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = json.loads(args["model_config"])
    if bool(pb_utils.using_decoupled_model_transaction_policy(config)) != decoupled:
        raise pb_utils.TritonModelException(why)
    return config, {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def _flag(tensor) -> bool:
    return tensor is not None and tensor.size > 0 and bool(tensor.reshape(-1)[0])


def _index(out: dict, name: str) -> int:
    arr = out.get(name)
    return 0 if arr is None else int(np.asarray(arr).reshape(-1)[0])


# outputs with one entry per generated token along axis 2 (batch, beam, tokens[, k]): joined by concatenation
PER_TOKEN = {"output_log_probs": np.float32, "output_token_ids": np.int32, "output_top_token_ids": np.int32,
             "output_top_log_probs": np.float32}


def _join_one(outputs: list, prefix: bytes) -> dict:
    """One generation's responses: `prefix` and the text_outputs concatenated, the per-token outputs
    (output_log_probs, output_token_ids, output_top_*) concatenated along their token axis, every
    other output from the last response that has it."""
    joined, texts, per_token = {}, [prefix], {}
    for out in outputs:
        for name, arr in out.items():
            if name == TEXT:
                joined[TEXT] = None  # a text model's: the texts are joined below
                texts.extend(x if isinstance(x, bytes) else str(x).encode() for x in np.asarray(arr).reshape(-1))
            elif name in PER_TOKEN:
                per_token.setdefault(name, []).append(np.asarray(arr, dtype=PER_TOKEN[name]))
            else:
                joined[name] = arr
    if TEXT in joined or prefix:
        joined[TEXT] = np.array([b"".join(texts)], dtype=np.object_)
    for name, arrays in per_token.items():
        full = [a for a in arrays if a.size] or arrays[:1]  # a step with no token may carry k = 0
        joined[name] = np.concatenate([a.reshape(1, 1, -1) if a.ndim < 4 else a.reshape((1, 1) + a.shape[-2:])
                                       for a in full], axis=2)
    return joined


def join_responses(outputs: list, prefix=b"") -> dict:
    """One request's responses (each {name: ndarray}, in order) as one. The generations of a
    batch (batch_index) or of num_return_sequences (sequence_index) are joined each on its own
    (prefix: bytes, or a list of them by batch row) and stacked in (batch, sequence) order along
    the first axis; the per-token outputs padded with zeros to the longest."""
    groups: dict = {}
    for out in outputs:
        groups.setdefault((_index(out, "batch_index"), _index(out, "sequence_index")), []).append(out)
    prefixes = prefix if isinstance(prefix, list) else None
    joined = [_join_one(groups[key], prefixes[key[0]] if prefixes else prefix) for key in sorted(groups)]
    if len(joined) == 1:
        return joined[0]
    out = {}
    for name in joined[0]:
        arrays = [np.asarray(j[name]) for j in joined if name in j]
        if name in PER_TOKEN:
            shape = [max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)]
            arrays = [np.pad(a, [(0, 0)] + [(0, m - n) for m, n in zip(shape[1:], a.shape[1:])]) for a in arrays]
        if len(arrays) == len(joined):
            out[name] = np.concatenate(arrays, axis=0)
    return out


def request_id(request):
    """The HTTP edge's id of the request (backend/frontend/edge/proxy.py): a header Triton forwards as a parameter
    on /infer, or a body parameter on /generate. Passed on to llm, which watches for its cancel mark
    (backend/frontend/triton_models/responses.py MarkedSender): Triton 2.51 does not tell a model when an HTTP client leaves."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (ValueError, AttributeError):
        return None
    return next((v for k, v in params.items() if k.lower() in REQUEST_ID_NAMES and isinstance(v, str)),
                None)


class TritonPythonModel:
    def initialize(self, args):
        config, params = model_config(args, False, "this model must not be decoupled: it answers once per request")
        self.target = params.get("forward_to") or "llm"
        # llm's `stream` is forced on (its step texts are joined); tensorrt_llm's `streaming` off (its
        # one response, token ids with the prompt's in front unless excluded, is passed on)
        self.stream_input = params.get("stream_input") or "stream"
        self.output_names = [o["name"] for o in config["output"]]
        self.input_names = [i["name"] for i in config["input"]]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                values = {}
                for name in self.input_names:
                    t = pb_utils.get_input_tensor_by_name(request, name)
                    if t is not None:  # copied: the request's buffers are released when execute returns
                        values[name] = np.array(t.as_numpy(), copy=True)
                prefix = self._set_stream(values)
                inputs = [pb_utils.Tensor(name, arr) for name, arr in values.items()]
            except Exception:
                log.exception("could not read a request's inputs")
                self._error(sender, f"{ErrorKind.INTERNAL.prefix} while accepting this request; see the server log", "INTERNAL")
                continue
            threading.Thread(target=self._forward, args=(inputs, prefix, sender, request_id(request)), name="unary",
                             daemon=True).start()
        return None

    def _set_stream(self, values: dict):
        """Set the target's stream input in `values` -> what the joined text starts with (b"", or
        one prefix per batch row)."""
        if self.stream_input != "stream":  # tensorrt_llm: one response, passed on
            rows = values["input_ids"].shape[0] if values.get("input_ids") is not None else 1
            values[self.stream_input] = np.zeros((rows, 1), bool)
            return b""
        prefix = b""
        if not _flag(values.get("stream")) and not _flag(values.get("exclude_input_in_output")):
            text = values.get("text_input")  # llm refuses a missing, empty or non-UTF-8 one
            if text is not None and text.size == 1 and isinstance(text.reshape(-1)[0], bytes):
                prefix = text.reshape(-1)[0]
            elif text is not None and text.size > 1:  # a batch: each row's own prompt
                prefix = [x if isinstance(x, bytes) else b"" for x in text.reshape(-1)]
        # one row per prompt: Triton refuses a batch whose inputs' first dimensions differ
        rows = values["text_input"].shape[0] if values.get("text_input") is not None and values["text_input"].ndim else 1
        values["stream"] = np.ones_like(values["stream"]) if "stream" in values else np.ones((rows, 1), bool)
        return prefix

    def _forward(self, inputs, prefix: bytes, sender, rid=None) -> None:
        try:
            bls = pb_utils.InferenceRequest(model_name=self.target, inputs=inputs,
                                            requested_output_names=self.output_names,
                                            **({"parameters": {REQUEST_ID: rid}} if rid else {}))
            responses = bls.exec(decoupled=True)
            outputs = []
            for resp in responses:
                if resp.has_error():
                    err = resp.error()
                    code = error_code(err.code() if hasattr(err, "code") else pb_utils.TritonError.INTERNAL,
                                      err.message())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(err.message(), code)),
                                flags=FINAL)
                    return
                tensors = resp.output_tensors()
                if tensors:  # a final flag-only response carries none
                    outputs.append({t.name(): np.array(t.as_numpy(), copy=True) for t in tensors})
                if sender.is_cancelled():
                    responses.cancel()
                    self._error(sender, "the request was cancelled", "CANCELLED")
                    return
            if not outputs:
                self._error(sender, f"{ErrorKind.INTERNAL.prefix}: the model sent no response; see the server log", "INTERNAL")
                return
            joined = join_responses(outputs, prefix)
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in joined.items()]),
                        flags=FINAL)
        except Exception:
            log.exception("forwarding a request to %s failed", self.target)
            try:
                self._error(sender, f"{ErrorKind.INTERNAL.prefix} while running this request; see the server log", "INTERNAL")
            except Exception:
                log.exception("could not send the error response")

    @staticmethod
    def _error(sender, message: str, code: str) -> None:
        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
            message, getattr(pb_utils.TritonError, code, pb_utils.TritonError.INTERNAL))), flags=FINAL)
