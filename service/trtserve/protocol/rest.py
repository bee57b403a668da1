"""The KServe v2 REST infer body (JSON, and Triton's binary tensor extension) as the gRPC
``ModelInferRequest`` / ``ModelInferResponse`` it stands for.

The HTTP door does not validate tensors itself: it translates the body into the protobuf
request, which :mod:`trtserve.protocol.codec` validates exactly as for gRPC, so both doors
accept, refuse and answer the same inputs byte for byte.

Body forms (the Open Inference Protocol REST API and Triton's binary extension):

* JSON only: ``{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "parameters"?,
  "data"}], "outputs"?: [{"name", "parameters"?}]}``; ``data`` row-major, flat or nested; a
  BYTES element is a string (UTF-8) or, for binary, sent raw.
* Binary: the ``Inference-Header-Content-Length`` request header gives the JSON's byte length;
  the raw tensors follow it in the order of ``inputs``, each input carrying
  ``"parameters": {"binary_data_size": N}`` instead of ``data``. Raw form: little-endian,
  row-major, BOOL one byte, each BYTES element a 4-byte little-endian length and its bytes.
* Outputs are binary where the output's ``binary_data`` parameter says so, else as the request's
  ``binary_data_output`` parameter says (default false): their bytes follow the response JSON in
  output order, each output carrying ``binary_data_size``, and the response's
  ``Inference-Header-Content-Length`` gives the JSON's length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.datatypes import DATATYPES
from trtserve.errors import InvalidRequest
from trtserve.protocol.codec import decode_raw, encode_bytes, encode_tensor

HEADER_LENGTH = "inference-header-content-length"
"""The request and response header giving the JSON part's byte length (lower case, as ASGI passes headers)."""

_BINARY_SIZE = "binary_data_size"
_BINARY = "binary_data"
_BINARY_OUTPUT = "binary_data_output"
_INT64 = np.iinfo(np.int64)  # the range of a shape dimension and of an int64_param (JSON integers reach 2**64 - 1)


@dataclass(frozen=True)
class RestInfer:
    """A REST infer request as the door needs it.

    Attributes:
        request: the equivalent gRPC request (validated later by the codec).
        binary_outputs: output name → send it binary; ``binary_default`` for outputs not named.
    """

    request: pb.ModelInferRequest
    binary_outputs: dict[str, bool]
    binary_default: bool

    def binary(self, name: str) -> bool:
        """Whether output ``name`` goes back binary."""
        return self.binary_outputs.get(name, self.binary_default)


def json_object(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body.

    Raises:
        InvalidRequest (HTTP 400): not valid JSON, or not an object.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return doc


def parse_infer(body: bytes, header_length: int | None, model: str, version: str) -> RestInfer:
    """The infer request of ``body`` for ``model`` at ``version`` (empty: the highest served).

    Args:
        body: the whole request body.
        header_length: the ``Inference-Header-Content-Length`` value, or None (the body is JSON).

    Raises:
        InvalidRequest (HTTP 400): malformed JSON, a field of the wrong type, a header length of
            0 (Triton's raw binary request, not supported), negative or past the end of the body,
            a binary size past the end of the body or bytes left over after the last binary
            input, an input with both or neither of ``data`` and ``binary_data_size``.
    """
    if header_length is None:
        if not body:
            raise InvalidRequest("the request body is empty: send the infer request as JSON (inputs, and outputs "
                                 "if you choose them)")
        header_length = len(body)
    if header_length == 0:
        raise InvalidRequest("Inference-Header-Content-Length 0 (Triton's raw binary request: the whole body one "
                             "input tensor, no JSON) is not supported: send the JSON header first and give its "
                             "length in bytes")
    if not 0 < header_length <= len(body):
        raise InvalidRequest(f"Inference-Header-Content-Length is {header_length}; the body has {len(body)} bytes "
                             f"(it must give the length of the JSON part, at least 1)")
    try:
        doc = orjson.loads(body[:header_length])
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {type(doc).__name__}")
    _only(doc, _REQUEST_FIELDS, "the request")
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=_string(doc, "id", ""))
    params = _object(doc, "parameters", "request")
    binary_default = _flag(params.pop(_BINARY_OUTPUT, False), _BINARY_OUTPUT)
    _set_parameters(request.parameters, params, "request")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequest("the request needs 'inputs': a non-empty list of tensors")
    offset = header_length
    raw: list[bytes] = []
    for index, item in enumerate(inputs):
        offset = _add_input(request, raw, item, index, body, offset)
    if offset != len(body):
        raise InvalidRequest(f"{len(body) - offset} bytes follow the last binary input: the binary_data_size of the "
                             f"inputs add up to {offset - header_length} of the {len(body) - header_length} sent")
    request.raw_input_contents.extend(raw)  # every input raw: JSON data too, in its raw form
    binary_outputs: dict[str, bool] = {}
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list):
        raise InvalidRequest("'outputs' must be a list of {\"name\": ...} objects")
    for item in outputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each requested output must be an object with a string 'name'")
        _only(item, _OUTPUT_FIELDS, f"output '{item['name']}'")
        out = request.outputs.add(name=item["name"])
        out_params = _object(item, "parameters", f"output '{item['name']}'")
        if _BINARY in out_params:
            binary_outputs[item["name"]] = _flag(out_params.pop(_BINARY), f"output '{item['name']}' {_BINARY}")
        _set_parameters(out.parameters, out_params, f"output '{item['name']}'")
    return RestInfer(request, binary_outputs, binary_default)


_REQUEST_FIELDS = ("id", "parameters", "inputs", "outputs")
_INPUT_FIELDS = ("name", "shape", "datatype", "parameters", "data")
_OUTPUT_FIELDS = ("name", "parameters")


def _only(obj: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    """Refuse a field of ``obj`` the protocol does not define there (a typo such as ``input``
    for ``inputs`` would otherwise be ignored).

    Raises:
        InvalidRequest (HTTP 400): naming the field and those ``where`` takes.
    """
    unknown = [key for key in obj if key not in fields]
    if unknown:
        raise InvalidRequest(f"{where} has the field '{unknown[0]}', which the KServe v2 infer request does not "
                             f"define there (it takes {', '.join(fields)})")


def _add_input(request: pb.ModelInferRequest, raw: list[bytes], item: Any, index: int, body: bytes,
               offset: int) -> int:
    if not isinstance(item, dict):
        raise InvalidRequest(f"input {index} must be a JSON object with name, shape, datatype and data")
    name, datatype = item.get("name"), item.get("datatype")
    shape = item.get("shape")
    if not isinstance(name, str):
        raise InvalidRequest(f"input {index} has no string 'name'")
    _only(item, _INPUT_FIELDS, f"input '{name}'")
    if not isinstance(datatype, str):
        raise InvalidRequest(f"input '{name}' has no string 'datatype'")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidRequest(f"input '{name}': 'shape' must be a list of integers, got {shape!r}")
    if not all(_INT64.min <= d <= _INT64.max for d in shape):
        raise InvalidRequest(f"input '{name}': 'shape' {shape} has a dimension outside int64")
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    params = _object(item, "parameters", f"input '{name}'")
    size = params.pop(_BINARY_SIZE, None)
    _set_parameters(tensor.parameters, params, f"input '{name}'")
    has_data = "data" in item
    if size is not None:
        if has_data:
            raise InvalidRequest(f"input '{name}' has both 'data' and binary_data_size: send one")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest(f"input '{name}': binary_data_size must be an integer >= 0, got {size!r}")
        if offset + size > len(body):
            raise InvalidRequest(f"input '{name}': binary_data_size {size} runs past the end of the body "
                                 f"({len(body) - offset} bytes are left)")
        raw.append(body[offset:offset + size])
        return offset + size
    if not has_data:
        raise InvalidRequest(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    raw.append(_json_data(name, datatype, shape, item["data"]))
    return offset


def _json_data(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """The raw form of a JSON ``data`` array (the codec then checks its length against ``shape``)."""
    dt = DATATYPES.get(datatype)
    if dt is None:
        return b""  # the codec refuses the datatype, naming the ones it knows
    values = _flatten(data)
    if dt.name == "BYTES":
        items = []
        for v in values:
            if isinstance(v, str):
                items.append(v.encode())
            else:
                raise InvalidRequest(f"input '{name}': BYTES data must be strings, got {type(v).__name__}")
        return encode_bytes(items)
    if dt.name == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise InvalidRequest(f"input '{name}': BOOL data must be true or false")
    elif dt.numpy.kind in "iu":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise InvalidRequest(f"input '{name}': {datatype} data must be integers")
        info = np.iinfo(dt.numpy)
        bad = next((v for v in values if not info.min <= v <= info.max), None)
        if bad is not None:
            raise InvalidRequest(f"input '{name}': {bad} is out of range for {datatype}")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise InvalidRequest(f"input '{name}': {datatype} data must be numbers")
    expected = math.prod(shape) if all(d >= 0 for d in shape) else -1
    if expected >= 0 and len(values) != expected:
        raise InvalidRequest(f"input '{name}': shape {shape} holds {expected} elements; 'data' has {len(values)}")
    return encode_tensor(np.asarray(values, dtype=dt.numpy), dt)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    out: list[Any] = []
    stack = [data]
    while stack:  # row-major, iterative (a deeply nested body must not exhaust the stack)
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _object(doc: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise InvalidRequest(f"the {what} '{key}' must be a JSON object, got {type(value).__name__}")
    return dict(value)


def _string(doc: Mapping[str, Any], key: str, default: str) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"parameter {what} must be true or false, got {value!r}")
    return value


def _set_parameters(target: Any, params: Mapping[str, Any], what: str) -> None:
    """JSON parameter values as ``InferParameter``s: bool, int (int64), float (double), str."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if not _INT64.min <= value <= _INT64.max:
                raise InvalidRequest(f"{what} parameter '{key}' is {value}, outside int64")
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise InvalidRequest(f"{what} parameter '{key}' must be a boolean, number or string, "
                                 f"got {type(value).__name__}")


def infer_body(response: pb.ModelInferResponse, rest: RestInfer) -> tuple[bytes, int | None]:
    """The REST body answering ``rest`` with ``response`` (its outputs as ``raw_output_contents``):
    the JSON and the binary outputs after it, and the JSON's length (None when nothing is binary)."""
    outputs = []
    tail: list[bytes] = []
    for tensor, data in zip(response.outputs, response.raw_output_contents):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if rest.binary(tensor.name):
            entry["parameters"] = {_BINARY_SIZE: len(data)}
            tail.append(data)
        else:
            entry["data"] = _json_values(tensor, data)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version,
                           "outputs": outputs}
    if response.id:
        doc["id"] = response.id
    params = {k: getattr(p, p.WhichOneof("parameter_choice")) for k, p in response.parameters.items()
              if p.WhichOneof("parameter_choice")}
    if params:
        doc["parameters"] = params
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not tail:
        return head, None
    return b"".join([head, *tail]), len(head)


def _json_values(tensor: pb.ModelInferResponse.InferOutputTensor, data: bytes) -> Any:
    """Raw output bytes as a flat JSON list (BYTES as UTF-8 strings, with replacement; FP16 and
    BF16 as the numbers they hold)."""
    dt = DATATYPES[tensor.datatype]
    values = decode_raw(tensor.name, data, dt, [math.prod(tensor.shape)])
    if dt.name == "BYTES":
        return [v.decode("utf-8", "replace") for v in values]
    if dt.name in ("FP16", "BF16"):
        return values.astype(np.float32)
    return values


__all__ = ["HEADER_LENGTH", "RestInfer", "infer_body", "json_object", "parse_infer"]
