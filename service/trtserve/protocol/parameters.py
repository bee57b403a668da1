"""The request and tensor parameters trtserve reads (of the KServe v2 / Open Inference Protocol
``parameters`` maps and Triton's extensions to them), and the refusal of every other one:
nothing a client asks for is accepted and then ignored.

Request parameters:

* ``timeout`` (int64, microseconds): the request's own deadline, also per message in a stream.
* ``priority`` (uint64 or int64): 1 is the most urgent; 0 or absent means the model's default.
* ``triton_enable_empty_final_response`` (bool): on a stream, every response carries
  ``triton_final_response: true`` (each request of a model that is not decoupled gets exactly
  one response, so it is the final one; no empty response follows).
* ``long_text`` (string, :data:`LONG_TEXT`): what a text longer than the model's window
  becomes. ``"truncate"`` (the default): the model reads its first window and the rest is
  cut. ``"chunk"``: it is embedded whole, as overlapping windows pooled back into one answer,
  for a model whose handler can (:mod:`trtserve.handlers`, ``chunk``); any other model refuses
  it (INVALID_ARGUMENT).

What ``priority`` and ``timeout`` mean for the queue (the level, the deadline) is the
admission rule, :func:`trtserve.ipc.admission.admit`; here they are only parsed.

Tensor parameters: ``binary_data`` on a requested output (gRPC outputs always travel as raw
bytes, so it is honoured as it is). Triton's shared-memory parameters (``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset``) on inputs or outputs are refused
UNIMPLEMENTED: trtserve does not implement the shared-memory extension, so running on the
inline bytes, or answering inline to a client that reads its output from a region, would
give it wrong or stale data. Any other parameter is refused INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import InvalidRequest, Unsupported

REQUEST_PARAMETERS = ("priority", "timeout", "triton_enable_empty_final_response", "long_text")
TRUNCATE, CHUNK = "truncate", "chunk"
LONG_TEXT = (TRUNCATE, CHUNK)
"""The values of the ``long_text`` parameter (the first is the default)."""
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
SHARED_MEMORY_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
OUTPUT_PARAMETERS = ("binary_data",)


class RequestParameters(NamedTuple):
    """What a request's parameters ask for."""

    priority: int
    """1 is the most urgent; 0: the model's default."""
    timeout: float | None
    """The request's own deadline in seconds from its arrival, or None."""
    final: bool
    """``triton_enable_empty_final_response``."""
    long_text: str = TRUNCATE
    """One of :data:`LONG_TEXT`."""


def request_parameters(request: pb.ModelInferRequest) -> RequestParameters:
    """The ``priority``, ``timeout`` (seconds, or None), ``triton_enable_empty_final_response``
    and ``long_text`` of a request.

    Raises:
        InvalidRequest (INVALID_ARGUMENT): a parameter of the wrong type or a negative value,
            or a parameter trtserve does not read.
        Unsupported (UNIMPLEMENTED): sequence-batching parameters.
    """
    priority, timeout, final, long_text = 0, None, False, TRUNCATE
    for key, param in request.parameters.items():
        kind = param.WhichOneof("parameter_choice")
        if key == "priority":
            if kind not in ("int64_param", "uint64_param"):
                raise InvalidRequest(f"parameter 'priority' must be an integer (int64 or uint64), got {kind}")
            priority = int(getattr(param, kind))
            if priority < 0:
                raise InvalidRequest(f"parameter 'priority' must be >= 0, got {priority}")
        elif key == "timeout":
            if kind != "int64_param":
                raise InvalidRequest(f"parameter 'timeout' must be int64 microseconds, got {kind}")
            if param.int64_param < 0:
                raise InvalidRequest(f"parameter 'timeout' must be >= 0 microseconds, got {param.int64_param}")
            if param.int64_param > 0:
                timeout = param.int64_param / 1e6
        elif key == "triton_enable_empty_final_response":
            if kind != "bool_param":
                raise InvalidRequest(
                    f"parameter 'triton_enable_empty_final_response' must be a bool, got {kind}"
                )
            final = param.bool_param
        elif key == "long_text":
            if kind != "string_param" or param.string_param not in LONG_TEXT:
                got = repr(param.string_param) if kind == "string_param" else kind
                raise InvalidRequest(f"parameter 'long_text' must be the string {' or '.join(map(repr, LONG_TEXT))}, "
                                     f"got {got}")
            long_text = param.string_param
        elif key in SEQUENCE_PARAMETERS:
            raise Unsupported(
                f"parameter '{key}': trtserve has no sequence batcher (it serves stateless models)"
            )
        else:
            raise InvalidRequest(
                f"unknown request parameter '{key}'; trtserve reads {', '.join(REQUEST_PARAMETERS)}"
            )
    return RequestParameters(priority, timeout, final, long_text)


def check_tensor_parameters(kind: str, name: str, parameters: Mapping[str, Any]) -> None:
    """Refuse the parameters of input or output tensor ``name`` that trtserve does not honour.

    Args:
        kind: ``"input"`` or ``"output"`` (a requested output).

    Raises:
        Unsupported (UNIMPLEMENTED): shared-memory parameters, or ``classification``.
        InvalidRequest (INVALID_ARGUMENT): any other parameter it does not read.
    """
    for key in parameters:
        if key in SHARED_MEMORY_PARAMETERS:
            where = "read its data from" if kind == "input" else "be written to"
            raise Unsupported(
                f"{kind} '{name}' asks to {where} a shared-memory region ({key}); trtserve does not implement "
                "the shared-memory extension (it is not among ServerMetadata's extensions): "
                "send the tensor in the request"
                + ("" if kind == "input" else " and read it from the response")
            )
        if kind == "output" and key == "classification":
            raise Unsupported(f"output '{name}' asks for classification, which trtserve does not implement")
        if kind == "output" and key in OUTPUT_PARAMETERS:
            continue
        allowed = f"; it reads {', '.join(OUTPUT_PARAMETERS)}" if kind == "output" else " (it reads none)"
        raise InvalidRequest(f"unknown parameter '{key}' on {kind} '{name}'{allowed}")
