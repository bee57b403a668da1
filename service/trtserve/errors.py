"""The one exception hierarchy of trtserve.

Every layer below the front ends raises these. The gRPC front end maps them to status codes in
one table, :data:`trtserve.frontend.grpc.status.STATUS_FOR` (the most specific class listed
wins; an error not listed is INTERNAL); nothing below the front ends imports grpc. The hierarchy, whether
retrying the same request can help, and the status each class is answered with:

::

    TrtServeError
    ├── InvalidRequest       permanent  INVALID_ARGUMENT    the caller sent something wrong
    ├── ModelNotFound        permanent  NOT_FOUND           no such model or version
    ├── Unsupported          permanent  UNIMPLEMENTED       valid, but not something trtserve does
    ├── ResponseTooLarge     permanent  RESOURCE_EXHAUSTED  this answer exceeds the send limit
    ├── RequestTimeout       permanent  DEADLINE_EXCEEDED   the deadline passed before it could run
    │   └── DeadlineUnmeetable  permanent  DEADLINE_EXCEEDED  refused at admission: even an idle server is too slow
    ├── BackendError         permanent  INTERNAL            the engine failed on this batch
    └── Retryable            (retry later, elsewhere or after backoff)
        ├── QueueFull        RESOURCE_EXHAUSTED  the model's queue is at max_queue_size
        ├── Overloaded       RESOURCE_EXHAUSTED  the work queued ahead would make it miss its deadline
        ├── InflightFull     RESOURCE_EXHAUSTED  the front end holds its bound of requests in progress
        ├── ModelNotReady    UNAVAILABLE         loading, failed to load, or unloading
        ├── ModelControlDisabled  UNAVAILABLE    load/unload asked for outside explicit mode
        └── ShuttingDown     UNAVAILABLE         the server is draining

Triton answers UNAVAILABLE for a full queue and for an expired request; trtserve uses the
codes gRPC defines for those cases (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) on purpose.

Each class has an :class:`ErrorCode`: an error crosses between processes as its code and its
sentence (:func:`error_for` makes it again), never as a class name.

A refusal at admission carries a :attr:`TrtServeError.refusal` reason (``queue_full``,
``queue_wait``, ``deadline_unmeetable``, ``inflight_bound``, ``window``): the label of
``trtserve_rejected_total``.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """One code per error class of the hierarchy above: how an error crosses between the
    engine core and a front end (with its sentence)."""

    BACKEND_ERROR = 1
    INVALID_REQUEST = 2
    MODEL_NOT_FOUND = 3
    UNSUPPORTED = 4
    RESPONSE_TOO_LARGE = 5
    REQUEST_TIMEOUT = 6
    DEADLINE_UNMEETABLE = 7
    QUEUE_FULL = 8
    OVERLOADED = 9
    INFLIGHT_FULL = 10
    MODEL_NOT_READY = 11
    MODEL_CONTROL_DISABLED = 12
    SHUTTING_DOWN = 13


class TrtServeError(Exception):
    """Base of every error trtserve raises on purpose. The message is sent to the caller.

    Attributes:
        error_code: the class's :class:`ErrorCode` (the base and :class:`Retryable`, never raised
            themselves, cross as BACKEND_ERROR).
        refusal: for a request refused at admission (never queued), the reason counted in
            ``trtserve_rejected_total``; ``None`` otherwise.
    """

    error_code = ErrorCode.BACKEND_ERROR
    refusal: str | None = None


class InvalidRequest(TrtServeError):
    """The request is malformed for this model: wrong name, datatype, shape, byte length,
    parameter type, or content. The message names the tensor, what was expected and what came.
    """

    error_code = ErrorCode.INVALID_REQUEST


class ModelNotFound(TrtServeError):
    """No model (or version) of that name exists in the repository."""

    error_code = ErrorCode.MODEL_NOT_FOUND


class Unsupported(TrtServeError):
    """The request asks for a protocol feature trtserve does not implement."""

    error_code = ErrorCode.UNSUPPORTED


class ResponseTooLarge(TrtServeError):
    """The serialized response of this request exceeds the server's maximum send size."""

    error_code = ErrorCode.RESPONSE_TOO_LARGE


class RequestTimeout(TrtServeError):
    """The request's deadline passed (or would pass before it could finish), so it was not run."""

    error_code = ErrorCode.REQUEST_TIMEOUT


class DeadlineUnmeetable(RequestTimeout):
    """Refused at admission: the request's deadline comes before even a batch of its rows
    started now on an idle server could finish (the latency model's low estimate)."""

    error_code = ErrorCode.DEADLINE_UNMEETABLE
    refusal = "deadline_unmeetable"


class WindowExpired(RequestTimeout):
    """The HTTP door held the request unread, beyond its front end's concurrency window, until
    its deadline passed (:mod:`trtserve.frontend.http.hold`): answered 504 without running."""

    refusal = "window"


class BackendError(TrtServeError):
    """The engine (ONNX Runtime, TensorRT, a Python model) failed while running a batch.

    Raised by ``trtserve.runtimes`` with the original exception chained (``raise ... from``).
    Every request of the failed batch gets it; the execution slot keeps serving.
    """

    error_code = ErrorCode.BACKEND_ERROR


class Retryable(TrtServeError):
    """The request was refused for a transient reason; the same request may succeed later."""


class QueueFull(Retryable):
    """The model's queue holds ``max_queue_size`` requests already; nothing was queued."""

    error_code = ErrorCode.QUEUE_FULL
    refusal = "queue_full"


class Overloaded(Retryable):
    """Refused at admission: the deadline could be met by an idle server, but not behind the
    work queued ahead of this request (its predicted queue wait, :mod:`trtserve.batching.wait`);
    retry on another server or later."""

    error_code = ErrorCode.OVERLOADED
    refusal = "queue_wait"


class InflightFull(Retryable):
    """Refused by a front end before decoding the request's tensors: it already has its bound of
    inference requests in progress (``trtserve serve --max-inflight-rpcs``, measured capacity ×
    the longest default timeout with ``auto``: :mod:`trtserve.batching.capacity`); retry on
    another server or later."""

    error_code = ErrorCode.INFLIGHT_FULL
    refusal = "inflight_bound"


class ModelNotReady(Retryable):
    """The model exists but cannot serve now (loading, failed to load with a reason, or unloading)."""

    error_code = ErrorCode.MODEL_NOT_READY


class ModelControlDisabled(Retryable):
    """RepositoryModelLoad/Unload while the model control mode is ``none`` or ``poll`` (Triton
    answers UNAVAILABLE too); the message names the mode."""

    error_code = ErrorCode.MODEL_CONTROL_DISABLED


class ShuttingDown(Retryable):
    """The server is draining: requests accepted earlier finish, new ones are refused."""

    error_code = ErrorCode.SHUTTING_DOWN


def error_for(code: int, message: str) -> TrtServeError:
    """The error of class ``code`` (an :class:`ErrorCode`) with ``message``, as the other
    process raised it; an unknown code (a peer of another trtserve version) is a BackendError
    (INTERNAL)."""
    return _CLASS_OF.get(code, BackendError)(message)


def _subclasses(cls: type[TrtServeError]) -> list[type[TrtServeError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


# Each class that names its own code (Retryable, never raised, does not).
_CLASS_OF: dict[int, type[TrtServeError]] = {
    c.error_code: c for c in _subclasses(TrtServeError) if "error_code" in vars(c)
}


__all__ = [
    "ErrorCode",
    "BackendError",
    "DeadlineUnmeetable",
    "InflightFull",
    "InvalidRequest",
    "ModelControlDisabled",
    "ModelNotFound",
    "ModelNotReady",
    "Overloaded",
    "QueueFull",
    "RequestTimeout",
    "ResponseTooLarge",
    "Retryable",
    "ShuttingDown",
    "TrtServeError",
    "Unsupported",
    "error_for",
]
