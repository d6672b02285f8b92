"""The Triton models of NVIDIA's token-level model set (backend/frontend/triton_models/token_models.py computes):

- `Preprocessing` (model `preprocessing`): text -> ids with the served checkpoint's tokenizer;
- `Postprocessing` (model `postprocessing`): ids -> text;
- `TokenForward` (model `tensorrt_llm`, decoupled): ids in, ids out, on `llm`'s engine. It holds no
  engine: each request goes to `llm` by BLS with llm's names (input_ids instead of text_input) and
  each of llm's responses comes back under NVIDIA's names as it arrives (output_ids,
  sequence_length, ...), so streaming stays streaming and every request joins the one engine loop.

A request's mistake is answered with INVALID_ARG naming the field; other requests go on.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from . import token_models
from .forward import error_code, model_config, request_id
from ...generation import text_tokenizer
from ...generation.errors import RequestError
from ...served import for_model
from ...wire import REQUEST_ID, ErrorKind

log = logging.getLogger("specserve.tokens")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _inputs(request) -> dict:
    """Every input of a request as {name: ndarray}, copied (its buffers go when execute returns)."""
    return {t.name(): np.array(t.as_numpy(), copy=True) for t in request.inputs()}


def _error(message: str, code: str):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
        message, getattr(pb_utils.TritonError, code, pb_utils.TritonError.INTERNAL)))


def _load_tokenizer(args):
    """The tokenizer of the checkpoint llm serves: the launcher's record of the served config
    (backend/served.py), else this model's `checkpoint` parameter with SPECSERVE_CHECKPOINT over it.
    text_tokenizer's, not transformers': these stubs then import neither transformers nor torch."""
    params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
    root = Path(params.pop("project_root", "") or Path(__file__).resolve().parents[3])
    cfg = for_model(params, root=root)
    return text_tokenizer.load(cfg.resolve(cfg.checkpoint, root))


class _TokenizerModel:
    """One response per request from `compute(tokenizer, inputs) -> {name: ndarray}`."""

    def initialize(self, args):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.tokenizer = _load_tokenizer(args)

    def compute(self, values: dict) -> dict:
        raise NotImplementedError

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                out = self.compute(_inputs(request))
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()]))
            except RequestError as e:
                responses.append(_error(str(e), "INVALID_ARG"))
            except Exception:
                log.exception("could not serve a request")
                responses.append(_error(f"{ErrorKind.INTERNAL.prefix} while serving this request; see the server log",
                                        "INTERNAL"))
        return responses


class Preprocessing(_TokenizerModel):
    def compute(self, values: dict) -> dict:
        return token_models.preprocess(self.tokenizer, values)


class Postprocessing(_TokenizerModel):
    def compute(self, values: dict) -> dict:
        for name in ("TOKENS_BATCH", "SEQUENCE_LENGTH"):
            if values.get(name) is None:
                raise RequestError(f"{name} is missing")
        return {"OUTPUT": token_models.postprocess(self.tokenizer, values["TOKENS_BATCH"], values["SEQUENCE_LENGTH"])}


class TokenForward:
    def initialize(self, args):
        config, params = model_config(args, True, "this model must be decoupled: it streams llm's responses")
        self.target = params.get("forward_to") or "llm"
        self.output_names = [o["name"] for o in config["output"]]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = [pb_utils.Tensor(k, v) for k, v in token_models.llm_inputs(_inputs(request)).items()]
            except RequestError as e:
                sender.send(_error(str(e), "INVALID_ARG"), flags=FINAL)
                continue
            except Exception:
                log.exception("could not read a request's inputs")
                sender.send(_error(f"{ErrorKind.INTERNAL.prefix} while accepting this request; see the server log",
                                   "INTERNAL"), flags=FINAL)
                continue
            threading.Thread(target=self._relay, args=(inputs, sender, request_id(request)), name="tokens",
                             daemon=True).start()
        return None

    def _relay(self, inputs, sender, rid=None) -> None:
        """llm's responses, each sent on as it arrives; the final flag follows the last."""
        try:
            bls = pb_utils.InferenceRequest(model_name=self.target, inputs=inputs,
                                            requested_output_names=self.output_names,
                                            **({"parameters": {REQUEST_ID: rid}} if rid else {}))
            responses = bls.exec(decoupled=True)
            for resp in responses:
                if resp.has_error():
                    err = resp.error()
                    code = error_code(err.code() if hasattr(err, "code") else pb_utils.TritonError.INTERNAL,
                                      err.message())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                        err.message(), code)), flags=FINAL)
                    return
                tensors = resp.output_tensors()
                if tensors:  # llm's flag-only final response carries none
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor(t.name(), np.array(t.as_numpy(), copy=True)) for t in tensors]))
                if sender.is_cancelled():
                    responses.cancel()
                    sender.send(_error("the request was cancelled", "CANCELLED"), flags=FINAL)
                    return
            sender.send(flags=FINAL)
        except Exception:
            log.exception("forwarding a request to %s failed", self.target)
            try:
                sender.send(_error(f"{ErrorKind.INTERNAL.prefix} while running this request; see the server log",
                                   "INTERNAL"), flags=FINAL)
            except Exception:
                log.exception("could not send the error response")
