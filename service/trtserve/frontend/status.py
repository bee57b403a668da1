"""trtserve errors → status: the one table (:data:`STATUS_NAMES`), in gRPC's status names.

Every door answers from it: the gRPC door with the ``grpc.StatusCode`` of that name
(:mod:`trtserve.frontend.grpc.status`), the HTTP door with the HTTP status the name maps to
(:mod:`trtserve.frontend.http.errors`), and every outcome is counted under the name. The
hierarchy itself, and why each class gets its status, is drawn in :mod:`trtserve.errors`.
"""

from __future__ import annotations

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

STATUS_NAMES: dict[type[TrtServeError], str] = {
    InvalidRequest: "INVALID_ARGUMENT",
    ModelNotFound: "NOT_FOUND",
    Unsupported: "UNIMPLEMENTED",
    ResponseTooLarge: "RESOURCE_EXHAUSTED",
    RequestTimeout: "DEADLINE_EXCEEDED",
    BackendError: "INTERNAL",
    QueueFull: "RESOURCE_EXHAUSTED",
    Overloaded: "RESOURCE_EXHAUSTED",
    InflightFull: "RESOURCE_EXHAUSTED",
    ModelNotReady: "UNAVAILABLE",
    ModelControlDisabled: "UNAVAILABLE",
    ShuttingDown: "UNAVAILABLE",
}


def status_name(exc: TrtServeError) -> str:
    """The status name of a trtserve error (most specific class first; INTERNAL for any other)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_NAMES:
            return STATUS_NAMES[cls]
    return "INTERNAL"


__all__ = ["STATUS_NAMES", "status_name"]
