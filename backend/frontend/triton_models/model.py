"""The Triton Python-backend model `llm` (and its names: ensemble, tensorrt_llm_bls): decoupled;
execute() converts each request (convert.py), refuses what is wrong with one error response, and
hands the rest to the service (backend/services/contract.py: our engine loop, or TensorRT-LLM), which
streams responses from its own thread through TritonSink (sink.py). Every failure of a request goes
one way: an error response of its kind; one request's failure never fails another's."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from .convert import convert
from .drain import DrainWatcher
from .forward import model_config
from .responses import INTERNAL, INVALID_ARG, UNAVAILABLE, MarkedSender, ResponseGroup, cancel_mark
from .sink import ResponseWriter, TritonSink
from ..metrics import MetricsPublisher, RequestLog
from ...generation.request import Overloaded, RequestError, validate
from ...served import for_model
from ...services import Service
from ...services.build import build_service
from ...services.heap import freeze_startup_objects
from ...wire import ErrorKind

log = logging.getLogger("specserve")


def _tensor(request, name: str) -> Optional[np.ndarray]:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        _, params = model_config(args, True, "this model must be decoupled (model_transaction_policy)")
        self.root = Path(params.pop("project_root", "") or Path(__file__).resolve().parents[3])
        self.cfg = for_model(params, root=self.root)  # the launcher's record (backend/served.py)
        log.info("config: %s", self.cfg)
        self.service: Service = build_service(self.cfg, self.root)
        self.writer = ResponseWriter() if self.cfg.async_send else None
        self.requests = RequestLog()
        self.metrics = MetricsPublisher(self.service, pb_utils, args["model_name"], args["model_version"], self.requests)
        self.service.start()  # after the publisher hooked the service's step outcomes
        freeze_startup_objects()  # full collections skip them from now on (heap.py)
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
                generations = convert(lambda name: _tensor(request, name), self.cfg)
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
