"""trtserve errors → gRPC status codes: the one table (:data:`STATUS_FOR`), and the stream form of
an error.

The hierarchy itself, and why each class gets its code, is drawn in :mod:`trtserve.errors`.
"""

from __future__ import annotations

import grpc

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import (
    BackendError,
    InflightFull,
    InvalidRequest,
    ModelControlDisabled,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    QueueFull,
    RequestTimeout,
    ResponseTooLarge,
    ShuttingDown,
    TrtServeError,
    Unsupported,
)

STATUS_FOR: dict[type[TrtServeError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    ResponseTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    BackendError: grpc.StatusCode.INTERNAL,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InflightFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotReady: grpc.StatusCode.UNAVAILABLE,
    ModelControlDisabled: grpc.StatusCode.UNAVAILABLE,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: TrtServeError) -> grpc.StatusCode:
    """The gRPC status code of a trtserve error (most specific class first)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]
    return grpc.StatusCode.INTERNAL


def stream_error(request: pb.ModelInferRequest, exc: TrtServeError) -> pb.ModelStreamInferResponse:
    """The stream message answering ``request`` with an error: ``error_message``, the request's
    id, and the status name in ``infer_response.parameters["error_code"]`` (the stream goes on)."""
    message = pb.ModelStreamInferResponse(error_message=str(exc))
    message.infer_response.id = request.id
    message.infer_response.parameters["error_code"].string_param = status_for(exc).name
    return message
