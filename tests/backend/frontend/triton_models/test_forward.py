"""The unary model's forwarding (backend/frontend/triton_models/forward.py) with a stand-in for Triton's
`triton_python_backend_utils`: what it asks `llm` for and how it joins the answers.
tests/integration/test_unary_and_names.py runs it inside the real server."""
import importlib
import json
import sys
import threading
import time
import types

import numpy as np
import pytest

FINAL = 1


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class TritonError:
    INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = "INTERNAL", "INVALID_ARG", "UNAVAILABLE", "CANCELLED"

    def __init__(self, message, code="INTERNAL"):
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.tensors, self._error = list(output_tensors), error

    def output_tensors(self):
        return self.tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class Responses(list):
    cancelled = False

    def cancel(self):
        self.cancelled = True


class Llm:
    """The decoupled model behind: records each BLS request, answers with canned responses."""

    def __init__(self, responses):
        self.responses, self.requests, self.parameters = responses, [], []

    def request(self, model_name, inputs, requested_output_names, **kwargs):
        llm = self
        self.parameters.append(kwargs.get("parameters"))

        class Req:
            def exec(self, decoupled):
                assert decoupled
                llm.requests.append((model_name, {t.name(): t.as_numpy() for t in inputs}, requested_output_names))
                llm.iterator = Responses(llm.responses)
                return llm.iterator
        return Req()


class Sender:
    def __init__(self, cancelled=False):
        self.sent, self._cancelled, self.done = [], cancelled, threading.Event()

    def send(self, response, flags=0):
        self.sent.append((response, flags))
        self.done.set()

    def is_cancelled(self):
        return self._cancelled


class Request:
    def __init__(self, values, sender, parameters="{}"):
        self.values, self.sender, self._parameters = values, sender, parameters

    def get_response_sender(self):
        return self.sender

    def parameters(self):
        return self._parameters


CONFIG = {"input": [{"name": n} for n in ("text_input", "max_tokens", "stream", "exclude_input_in_output")],
          "output": [{"name": n} for n in ("text_output", "num_output_tokens", "finish_reason")],
          "parameters": {"forward_to": {"string_value": "llm"}}}


@pytest.fixture
def forward(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, TritonError, InferenceResponse
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    pb.TritonModelException = RuntimeError
    pb.using_decoupled_model_transaction_policy = lambda cfg: cfg.get("model_transaction_policy", {}).get("decoupled", False)
    pb.get_input_tensor_by_name = lambda req, name: Tensor(name, req.values[name]) if name in req.values else None
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    module = importlib.import_module("backend.frontend.triton_models.forward")
    module = importlib.reload(module)  # bound to this stand-in

    def run(values, responses, cancelled=False, parameters="{}"):
        llm = Llm(responses)
        pb.InferenceRequest = llm.request
        model = module.TritonPythonModel()
        model.initialize({"model_config": json.dumps(CONFIG)})
        sender = Sender(cancelled)
        assert model.execute([Request(values, sender, parameters)]) is None  # answers from its own thread
        assert sender.done.wait(10)
        time.sleep(0.05)  # nothing more is sent
        (response, flags), = sender.sent
        assert flags == FINAL
        return llm, response
    yield run
    sys.modules.pop("backend.frontend.triton_models.forward", None)



def step(text, n, reason=None):
    out = [Tensor("text_output", np.array([text.encode()], dtype=object)),
           Tensor("num_output_tokens", np.array([n], dtype=np.int32))]
    if reason:
        out.append(Tensor("finish_reason", np.array([reason.encode()], dtype=object)))
    return InferenceResponse(out)


STEPS = [step(" Paris", 1), step(", the", 3), step(" city", 4, "length"), InferenceResponse([])]


def outputs(response):
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def prompt(text="The capital of France is", **extra):
    values = {"text_input": np.array([[text.encode()]], dtype=object), "max_tokens": np.array([[4]], dtype=np.int32)}
    values.update({k: np.array([[v]]) for k, v in extra.items()})
    return values


def test_non_streaming_request_is_llm_streaming_joined_behind_the_prompt(forward):
    llm, response = forward(prompt(), STEPS)
    (model, sent, wanted), = llm.requests
    assert model == "llm" and wanted == ["text_output", "num_output_tokens", "finish_reason"]
    assert sent["stream"].tolist() == [[True]] and sent["max_tokens"].tolist() == [[4]]
    out = outputs(response)
    assert out["text_output"].tolist() == [b"The capital of France is Paris, the city"]
    assert out["num_output_tokens"].tolist() == [4] and out["finish_reason"].tolist() == [b"length"]


@pytest.mark.parametrize("extra", [{"stream": True}, {"exclude_input_in_output": True}])
def test_streaming_or_excluded_request_has_no_prompt(forward, extra):
    llm, response = forward(prompt(**extra), STEPS)
    assert outputs(response)["text_output"].tolist() == [b" Paris, the city"]
    assert llm.requests[0][1]["stream"].tolist() == [[True]]


def test_llm_error_keeps_its_message_and_code(forward):
    _, response = forward(prompt(), [InferenceResponse(error=TritonError("max_tokens must be a positive integer",
                                                                         "INVALID_ARG"))])
    assert response.has_error() and response.error().code() == "INVALID_ARG"
    assert response.error().message() == "max_tokens must be a positive integer"


@pytest.mark.parametrize("message,code", [("server overloaded: 32 requests are waiting; retry later", "UNAVAILABLE"),
                                          ("internal error while accepting this request", "INTERNAL"),
                                          ("top_p must be in (0, 1], got 0.0", "INVALID_ARG")])
def test_error_kind_from_the_message_when_bls_loses_the_code(forward, message, code):
    """Triton 2.51's BLS reports every error of the called model as INTERNAL."""
    _, response = forward(prompt(), [InferenceResponse(error=TritonError(message, "INTERNAL"))])
    assert response.error().code() == code and response.error().message() == message


def test_cancelled_request_cancels_llm(forward):
    llm, response = forward(prompt(), STEPS, cancelled=True)
    assert llm.iterator.cancelled and response.error().code() == "CANCELLED"


def test_the_edges_request_id_is_passed_on_to_llm(forward):
    """llm watches for the HTTP edge's cancel mark of this id (Triton forwards the edge's header on
    /infer as a parameter, keeping the header's spelling)."""
    rid = "0123456789abcdef" * 2
    llm, _ = forward(prompt(), STEPS, parameters=json.dumps({"Specserve-Request-Id": rid}))
    assert llm.parameters == [{"specserve_request_id": rid}]
    llm, _ = forward(prompt(), STEPS)  # no edge (gRPC): nothing added
    assert llm.parameters == [None]


def test_per_token_outputs_are_joined_along_the_token_axis(forward):
    """output_log_probs, output_token_ids and output_top_* of the steps concatenated (a step with no
    token may carry k = 0); two generations padded to the longer one and stacked."""
    import backend.frontend.triton_models.forward as module

    def out(ids, k, seq=None):
        n = len(ids)
        o = {"text_output": np.array([b"x"], dtype=object),
             "output_log_probs": np.full((1, 1, n), -1.0, np.float32),
             "output_token_ids": np.array(ids, np.int32).reshape(1, 1, n),
             "output_top_token_ids": np.arange(n * k, dtype=np.int32).reshape(1, 1, n, k),
             "output_top_log_probs": np.full((1, 1, n, k), -2.0, np.float32)}
        if seq is not None:
            o["sequence_index"] = np.array([[seq]], np.int32)
        return o
    joined = module.join_responses([out([5, 6], 3), out([7], 3), out([], 0)])
    assert joined["output_token_ids"].tolist() == [[[5, 6, 7]]]
    assert joined["output_top_token_ids"].shape == (1, 1, 3, 3) and joined["output_log_probs"].shape == (1, 1, 3)
    assert joined["output_top_token_ids"][0, 0, 2].tolist() == [0, 1, 2]
    two = module.join_responses([out([5, 6], 2, 0), out([8], 2, 1), out([], 0, 1)])
    assert two["output_token_ids"].tolist() == [[[5, 6]], [[8, 0]]]
    assert two["output_top_log_probs"].shape == (2, 1, 2, 2) and two["output_top_log_probs"][1, 0, 1].tolist() == [0, 0]
