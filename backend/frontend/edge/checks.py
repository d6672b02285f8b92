"""The edge's checks of a Triton-protocol body (generate, /infer), pure: what Triton 2.51 would
answer 500 for or wrap silently (a body that is not a JSON object, `inputs` that is no array, a
negative or fractional shape, a value of the wrong JSON type, an integer outside its tensor type
such as max_tokens 2^32+8, which INT32 would wrap to 8) and a generate field that is no input of
the model, each an EdgeError(400) naming the field."""
from __future__ import annotations

import json
import math

from ..http_body import EdgeError
from ...wire import REQUEST_ID_HEADER, REQUEST_ID_NAMES

GENERATE_FIELDS = {"id", "parameters"}  # generate-request fields of Triton's own besides the inputs
_INT_RANGES = {f"TYPE_INT{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)}
_INT_RANGES.update({f"TYPE_UINT{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64)})
_FLOAT_MAX = {"TYPE_FP16": 65504.0, "TYPE_FP32": 3.4028234663852886e38, "TYPE_FP64": math.inf}
# /infer's datatypes (the KServe protocol's names) as model-config types
_INFER_TYPES = {"BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING", **{t[5:]: t for t in (*_INT_RANGES, *_FLOAT_MAX)}}



def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def check_field(name: str, value, data_type: str) -> None:
    """One generate field against its tensor type in the model config: EdgeError(400) if
    Triton would refuse it with a 500 or convert it wrongly."""
    items, stack = [], [value]
    while stack:  # depth already bounded
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        else:
            items.append(v)
    for v in items:
        if data_type == "TYPE_BOOL":
            if not isinstance(v, bool):
                raise EdgeError(400, f"{name} must be true or false, got {_type_name(v)}")
        elif data_type == "TYPE_STRING":
            if not isinstance(v, str):
                raise EdgeError(400, f"{name} must be a string, got {_type_name(v)}")
        elif data_type in _INT_RANGES:
            lo, hi = _INT_RANGES[data_type]
            if isinstance(v, bool) or not isinstance(v, int):
                raise EdgeError(400, f"{name} must be an integer, got {_type_name(v)}")
            if not lo <= v <= hi:
                raise EdgeError(400, f"{name} {v} is out of range: {data_type[5:]} holds {lo}..{hi}")
        elif data_type in _FLOAT_MAX:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise EdgeError(400, f"{name} must be a number, got {_type_name(v)}")
            if math.isfinite(v) and abs(v) > _FLOAT_MAX[data_type]:
                raise EdgeError(400, f"{name} {v} is out of range for {data_type[5:]}")


def check_generate(body, input_types: dict) -> None:
    """A generate body against the model's inputs ({} when the model is unknown: Triton says so).
    Triton would pass a field that is no input on as a request parameter, which the model never
    reads: refused here, naming it, as Triton refuses an unknown input on /infer and gRPC."""
    if not isinstance(body, dict):
        raise EdgeError(400, f"the request body must be a JSON object, got {_type_name(body)}")
    for name, value in body.items():
        if name in input_types:
            check_field(name, value, input_types[name])
        elif input_types and name not in GENERATE_FIELDS:
            raise EdgeError(400, unknown_input_message(name, input_types))
    params = body.get("parameters")
    if input_types and isinstance(params, dict):
        for name in params:
            if name in input_types:
                raise EdgeError(400, f"parameters.{name} is not read by the model: send {name} as a "
                                     "top-level field of the request")


def unknown_input_message(name: str, input_types: dict) -> str:
    return (f"unexpected input '{name}': this model has no such input (it has "
            f"{', '.join(sorted(input_types))})")


def check_infer(body) -> None:
    """An /infer body (or the JSON header of a binary one): EdgeError(400) naming the field for what
    Triton 2.51 answers 500 for (inputs not an array, a shape not of non-negative integers, data of
    the wrong JSON type) or wraps silently (an integer outside its datatype). The request id
    parameter is the edge's own (REQUEST_ID_HEADER): a client's would reach the unary model next to it."""
    if not isinstance(body, dict):
        raise EdgeError(400, f"the request body must be a JSON object, got {_type_name(body)}")
    params = body.get("parameters")
    if isinstance(params, dict) and any(k.lower() in REQUEST_ID_NAMES for k in params):
        raise EdgeError(400, f"parameters.{REQUEST_ID_HEADER} is reserved: the server sets it")
    for key in ("inputs", "outputs"):
        if key in body and not isinstance(body[key], list) or key == "inputs" and key not in body:
            raise EdgeError(400, f"{key} must be an array of tensor objects, got {_type_name(body.get(key))}")
    for i, tensor in enumerate(body["inputs"]):
        if not isinstance(tensor, dict):
            raise EdgeError(400, f"inputs[{i}] must be a tensor object, got {_type_name(tensor)}")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise EdgeError(400, f"inputs[{i}].name must be a string, got {_type_name(name)}")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise EdgeError(400, f"input '{name}': shape must be an array of non-negative integers, got "
                                 f"{json.dumps(shape)[:80]}")
        datatype = tensor.get("datatype")
        if not isinstance(datatype, str):
            raise EdgeError(400, f"input '{name}': datatype must be a string, got {_type_name(datatype)}")
        if "data" in tensor and datatype in _INFER_TYPES:  # an unknown datatype: Triton names it
            check_field(name, tensor["data"], _INFER_TYPES[datatype])


def streams(value) -> bool:
    """Whether a generate body's `stream` field asks for a stream (true, or [true])."""
    return value is True or isinstance(value, list) and True in value
