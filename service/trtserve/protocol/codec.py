"""Tensor codec: KServe v2 ``ModelInferRequest`` → validated numpy arrays, and arrays →
``ModelInferResponse``.

Pure functions of the message and the model spec. Every check happens here, before a request
is queued, and every failure is an :class:`~trtserve.errors.InvalidRequest` (gRPC
INVALID_ARGUMENT) whose one sentence names the tensor, what was expected and what came.

Wire rules (the KServe v2 / Open Inference Protocol gRPC tensor forms):

* Raw data: ``raw_input_contents[i]`` belongs to ``inputs[i]``; either every input is raw or
  none is. Numbers are little-endian, row-major, no padding. A BYTES element is a 4-byte
  little-endian length followed by that many bytes.
* Typed data: ``contents.<field>`` where the field is fixed by the datatype
  (:mod:`trtserve.datatypes`); FP16 and BF16 have none and must be raw.
* Outputs always go back as ``raw_output_contents``, in the order of ``outputs``.
* Zero-size tensors are refused: every dimension must be at least 1 (a zero-row batch or an
  empty tensor is never handed to an engine).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence

import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.datatypes import DATATYPES, Datatype, Tensors
from trtserve.errors import BackendError, InvalidRequest
from trtserve.protocol.parameters import check_tensor_parameters
from trtserve.spec import ModelSpec, TensorSpec

_LENGTH = struct.Struct("<I")
# Default cap on the elements one request may declare (over all its inputs), so that a forged
# shape cannot make us allocate (or overflow int64 computing) an absurd size; the server passes
# its own (``--max-request-elements``). Raw bytes are bounded by the gRPC receive limit.
MAX_ELEMENTS = 1 << 40
# Ranges of the integer types carried in the wider typed fields (int_contents is int32,
# uint_contents uint32).
_RANGE = {name: (np.iinfo(DATATYPES[name].numpy).min, np.iinfo(DATATYPES[name].numpy).max)
          for name in ("INT8", "INT16", "UINT8", "UINT16")}


def decode_inputs(
    request: pb.ModelInferRequest, spec: ModelSpec, *, max_elements: int = MAX_ELEMENTS
) -> tuple[Tensors, int]:
    """Decode and validate the input tensors of ``request`` for the model ``spec``.

    ``max_elements`` caps the elements the request declares over all its inputs; shapes are
    checked against it (and against the bytes actually sent) before anything is allocated.

    Returns:
        (tensors, rows): input name → array (batch on axis 0 for a batched model; BYTES as an
        object array of ``bytes``), and the number of batch rows (1 for a model without a
        batch dimension).

    Raises:
        InvalidRequest: unknown, duplicate or missing input; wrong datatype; wrong rank or
            dims; zero-size or negative dims; data length not matching the shape; typed
            contents in the wrong field, or as well as raw contents; a malformed BYTES
            element; inconsistent batch sizes.
    """
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, in the order of 'inputs', or none"
        )
    tensors: Tensors = {}
    rows = 0
    declared = 0
    for i, tensor in enumerate(request.inputs):
        expected = spec.input(tensor.name)
        if expected is None:
            names = ", ".join(f"'{t.name}'" for t in spec.inputs)
            raise InvalidRequest(
                f"unexpected input '{tensor.name}' for model '{spec.name}'; its inputs are {names}"
            )
        if tensor.name in tensors:
            raise InvalidRequest(f"input '{tensor.name}' is given more than once")
        if tensor.parameters:
            check_tensor_parameters("input", tensor.name, tensor.parameters)
        shape = _check_shape(tensor.name, list(tensor.shape), expected, spec)
        declared += math.prod(shape)
        if declared > max_elements:
            raise InvalidRequest(
                f"input '{tensor.name}' has shape {shape}: the request declares {declared} elements, "
                f"more than the server's limit of {max_elements} per request"
            )
        _check_datatype(tensor.name, tensor.datatype, expected.datatype)
        if raw:
            typed = tensor.contents.ListFields()
            if typed:
                raise InvalidRequest(
                    f"input '{tensor.name}' carries contents.{typed[0][0].name} as well as raw_input_contents; "
                    "send its data one way only"
                )
            arr = decode_raw(tensor.name, raw[i], expected.datatype, shape)
        else:
            arr = _decode_typed(tensor.name, tensor.contents, expected.datatype, shape)
        if spec.batched:
            if rows and shape[0] != rows:
                raise InvalidRequest(
                    f"input '{tensor.name}' has batch size {shape[0]} but other inputs have {rows}; "
                    "all inputs of a request must have the same batch size"
                )
            rows = shape[0]
        tensors[tensor.name] = arr
    for expected in spec.inputs:
        if expected.name not in tensors and not expected.optional:
            raise InvalidRequest(
                f"missing input '{expected.name}' for model '{spec.name}' "
                f"(datatype {expected.datatype.name}, shape {expected.shape(spec.batched)})"
            )
    return tensors, max(rows, 1)


def requested_outputs(request: pb.ModelInferRequest, spec: ModelSpec) -> list[TensorSpec]:
    """The outputs to return, in the order asked for (all of them, in config order, if none).

    Raises:
        InvalidRequest: an unknown or repeated output name, or an output parameter trtserve
            does not read.
        Unsupported: ``classification`` or shared-memory output parameters
            (:func:`~trtserve.protocol.parameters.check_tensor_parameters`).
    """
    if not request.outputs:
        return list(spec.outputs)
    chosen: list[TensorSpec] = []
    for out in request.outputs:
        found = spec.output(out.name)
        if found is None:
            names = ", ".join(f"'{t.name}'" for t in spec.outputs)
            raise InvalidRequest(
                f"unknown output '{out.name}' requested from model '{spec.name}'; its outputs are {names}"
            )
        if found in chosen:
            raise InvalidRequest(f"output '{out.name}' is requested more than once")
        if out.parameters:
            check_tensor_parameters("output", out.name, out.parameters)
        chosen.append(found)
    return chosen


def _check_datatype(name: str, got: str, expected: Datatype) -> None:
    if got != expected.name:
        if got not in DATATYPES:
            raise InvalidRequest(
                f"input '{name}' has unknown datatype '{got}'; expected {expected.name}"
            )
        raise InvalidRequest(f"input '{name}' has datatype {got}; the model expects {expected.name}")


def _check_shape(name: str, shape: list[int], expected: TensorSpec, spec: ModelSpec) -> list[int]:
    # The common case first, in a few comparisons: fixed dims, matched exactly, a batch size in
    # range. Any other shape (variable dims, or one to refuse) takes the checks below.
    if expected.fixed and math.prod(shape) <= MAX_ELEMENTS:
        if spec.batched:
            if (len(shape) == len(expected.dims) + 1 and 0 < shape[0] <= spec.policy.max_batch_size
                    and tuple(shape[1:]) == expected.dims):
                return shape
        elif tuple(shape) == expected.dims:
            return shape
    want = expected.shape(spec.batched)
    if len(shape) != len(want):
        hint = ""
        if spec.batched and len(shape) == len(want) - 1:
            hint = " (this model batches: put the batch size first, e.g. [1, ...])"
        raise InvalidRequest(f"input '{name}' has shape {shape}; the model expects {want}{hint}")
    for axis, (got, dim) in enumerate(zip(shape, want)):
        if got < 0:
            raise InvalidRequest(f"input '{name}' has a negative dimension in shape {shape}")
        if got == 0:
            what = "batch size" if spec.batched and axis == 0 else "dimension"
            raise InvalidRequest(
                f"input '{name}' has shape {shape}: a zero {what} carries no data; every dimension must be >= 1"
            )
        if dim != -1 and got != dim:
            raise InvalidRequest(f"input '{name}' has shape {shape}; the model expects {want}")
    if spec.batched and shape[0] > spec.policy.max_batch_size and not spec.policy.split_oversized:
        raise InvalidRequest(
            f"input '{name}' has batch size {shape[0]}, more than the model's max_batch_size "
            f"{spec.policy.max_batch_size}"
        )
    if math.prod(shape) > MAX_ELEMENTS:
        raise InvalidRequest(f"input '{name}' has shape {shape}, more than {MAX_ELEMENTS} elements")
    return shape


def decode_raw(name: str, data: bytes, datatype: Datatype, shape: Sequence[int]) -> np.ndarray:
    """View raw little-endian bytes as an array of ``shape`` (no copy for numeric types).

    Raises:
        InvalidRequest: the byte length does not match ``shape`` (numeric types) or a BYTES
            element's length prefix runs past the end, or the element count differs.
    """
    count = math.prod(shape)
    if datatype.name == "BYTES":
        return _decode_bytes(name, data, count).reshape(shape)
    expected = count * datatype.itemsize
    if len(data) != expected:
        raise InvalidRequest(
            f"input '{name}' ({datatype.name}, shape {list(shape)}) needs {expected} bytes of raw data; "
            f"got {len(data)}"
        )
    return np.frombuffer(data, dtype=datatype.numpy.newbyteorder("<")).reshape(shape)


def _decode_bytes(name: str, data: bytes, count: int) -> np.ndarray:
    if count > len(data) // _LENGTH.size:  # each element needs its 4-byte length at least
        raise InvalidRequest(
            f"input '{name}' (BYTES) declares {count} elements but its {len(data)} bytes hold at most "
            f"{len(data) // _LENGTH.size}"
        )
    out = np.empty(count, dtype=object)
    view = memoryview(data)
    pos = 0
    for i in range(count):
        if pos + 4 > len(data):
            raise InvalidRequest(
                f"input '{name}' (BYTES) holds {i} elements; its shape needs {count}"
            )
        (n,) = _LENGTH.unpack_from(data, pos)
        pos += 4
        if pos + n > len(data):
            raise InvalidRequest(
                f"input '{name}' (BYTES) element {i} declares {n} bytes but only {len(data) - pos} remain"
            )
        out[i] = bytes(view[pos : pos + n])
        pos += n
    if pos != len(data):
        raise InvalidRequest(
            f"input '{name}' (BYTES) has {len(data) - pos} bytes left over after its {count} elements"
        )
    return out


def _decode_typed(
    name: str, contents: pb.InferTensorContents, datatype: Datatype, shape: list[int]
) -> np.ndarray:
    present = [field.name for field, _ in contents.ListFields()]
    count = math.prod(shape)
    if datatype.contents_field is None:
        raise InvalidRequest(
            f"input '{name}' is {datatype.name}, which has no typed contents field; "
            "send it in raw_input_contents"
        )
    wrong = [f for f in present if f != datatype.contents_field]
    if wrong:
        raise InvalidRequest(
            f"input '{name}' ({datatype.name}) carries contents.{wrong[0]}; "
            f"expected contents.{datatype.contents_field}"
        )
    values = getattr(contents, datatype.contents_field)
    if len(values) != count:
        raise InvalidRequest(
            f"input '{name}' ({datatype.name}, shape {shape}) needs {count} values in "
            f"contents.{datatype.contents_field}; got {len(values)}"
        )
    if datatype.name == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    if datatype.name in _RANGE:
        lo, hi = _RANGE[datatype.name]
        wide = np.asarray(values, dtype=np.int64)
        if wide.size and (wide.min() < lo or wide.max() > hi):
            raise InvalidRequest(
                f"input '{name}' ({datatype.name}) has a value outside [{lo}, {hi}] "
                f"in contents.{datatype.contents_field}"
            )
        return wide.astype(datatype.numpy).reshape(shape)
    return np.asarray(values, dtype=datatype.numpy).reshape(shape)


def encode_bytes(values: Iterable[object]) -> bytes:
    """BYTES elements (``bytes`` or ``str``, UTF-8 encoded) in the raw wire form: each a 4-byte
    little-endian length, then the data."""
    parts: list[bytes] = []
    for v in values:
        b = v.encode() if isinstance(v, str) else bytes(v)  # type: ignore[arg-type]
        parts.append(_LENGTH.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def encode_tensor(arr: np.ndarray, datatype: Datatype) -> bytes:
    """An output array's raw bytes (little-endian, row-major)."""
    if datatype.name == "BYTES":
        return encode_bytes(arr.reshape(-1))
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr).tobytes()


def encode_response(
    spec: ModelSpec,
    request_id: str,
    outputs: Tensors,
    chosen: Sequence[TensorSpec],
    parameters: dict[str, int] | None = None,
) -> pb.ModelInferResponse:
    """Build the response carrying ``chosen`` outputs as ``raw_output_contents``.

    Args:
        spec: the model (its name and the version answered).
        request_id: the request's ``id``, echoed.
        outputs: output name → array, as the model produced them.
        chosen: the outputs to send, in order (:func:`requested_outputs`).
        parameters: int64 response parameters to set, if any.

    Raises:
        BackendError: an output is missing or its numpy dtype is not the configured datatype
            (a model bug, not the caller's).
    """

    response = pb.ModelInferResponse(model_name=spec.name, model_version=spec.version, id=request_id)
    for out in chosen:
        arr = outputs.get(out.name)
        if arr is None:
            raise BackendError(f"the model produced no output '{out.name}'")
        if arr.dtype != out.datatype.numpy and not (out.datatype.name == "BYTES" and arr.dtype.kind in "OSU"):
            raise BackendError(
                f"output '{out.name}' has dtype {arr.dtype}; the model config says {out.datatype.name}"
            )
        response.outputs.add(name=out.name, datatype=out.datatype.name, shape=arr.shape)
        response.raw_output_contents.append(encode_tensor(arr, out.datatype))
    for key, value in (parameters or {}).items():
        response.parameters[key].int64_param = value
    return response
