"""The request parameters trtserve reads (``../shared/notes/protocol.md`` b5).

* ``timeout`` (int64, microseconds): the request's own deadline, also per message in a stream.
* ``priority`` (uint64 or int64): 1 is the most urgent; 0 or absent means the model's default.

What they mean for the queue (the level, the deadline) is the admission rule,
:func:`trtserve.batching.admission.admit`; here they are only parsed and type-checked.
"""

from __future__ import annotations

from .._proto.inference import grpc_service_pb2 as pb
from ..errors import InvalidRequest

# Reserved keys a client library may send that change nothing here.
IGNORABLE = frozenset({"triton_enable_empty_final_response"})


def request_parameters(request: pb.ModelInferRequest) -> tuple[int, float | None]:
    """The ``priority`` and ``timeout`` (seconds, or None) of a request.

    Raises:
        InvalidRequest (INVALID_ARGUMENT): a parameter of the wrong type or a negative value,
            or an unknown ``triton_``-prefixed key.
    """
    priority, timeout = 0, None
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
        elif key.startswith("triton_") and key not in IGNORABLE:
            raise InvalidRequest(f"unknown reserved parameter '{key}'")
    return priority, timeout
