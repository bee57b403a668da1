"""trtserve errors as gRPC status codes (from the one table,
:data:`trtserve.frontend.status.STATUS_NAMES`), and the stream form of an error."""

from __future__ import annotations

import grpc

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import TrtServeError
from trtserve.frontend.status import STATUS_NAMES, status_name

STATUS_FOR: dict[type[TrtServeError], grpc.StatusCode] = {
    cls: getattr(grpc.StatusCode, name) for cls, name in STATUS_NAMES.items()
}
"""The gRPC status of each error class (:data:`trtserve.frontend.status.STATUS_NAMES`)."""


def status_for(exc: TrtServeError) -> grpc.StatusCode:
    """The gRPC status code of a trtserve error (most specific class first)."""
    return getattr(grpc.StatusCode, status_name(exc))


def stream_error(request: pb.ModelInferRequest, exc: TrtServeError) -> pb.ModelStreamInferResponse:
    """The stream message answering ``request`` with an error: ``error_message``, the request's
    id, and the status name in ``infer_response.parameters["error_code"]`` (the stream goes on)."""
    message = pb.ModelStreamInferResponse(error_message=str(exc))
    message.infer_response.id = request.id
    message.infer_response.parameters["error_code"].string_param = status_for(exc).name
    return message
