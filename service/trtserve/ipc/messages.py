"""The typed messages between front ends and the engine core, and their header encoding.

A message on the socket is a multipart ZeroMQ message: one *header* frame, then zero or more
*tensor* frames (:mod:`trtserve.ipc.framing`). The header is ``(kind, *fields)`` of one message
class below, pickled: plain values, tuples and this package's frozen classes only, never an
array. Both processes are trtserve, started by the same supervisor, and the socket directory is
private to the user (mode 0700), so the pickle carries no foreign input.

=========  =========================  ==================================================
kind       direction                  message
=========  =========================  ==================================================
HELLO      front end → core           :class:`Hello`
INFER      front end → core           :class:`Infer`, then the tensor frames
CANCEL     front end → core           :class:`Cancel`
RECORDS    front end → core           :class:`Records`
QUERY      front end → core           :class:`Query` (one of :mod:`trtserve.ipc.queries`)
TABLE      core → front end           :class:`Table` (again whenever a model changes)
RESULT     core → front end           :class:`Result`, then the output frames
ERROR      core → front end           :class:`Error`
REPLY      core → front end           :class:`Reply`
=========  =========================  ==================================================

Each side decodes a header with :func:`decode` and hands the message to one handler per kind.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
from typing import Any, NamedTuple

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.errors import ErrorCode
from trtserve.ipc.admission import Ask
from trtserve.ipc.framing import Layout
from trtserve.ipc.queries import EngineQuery
from trtserve.spec import ModelSpec


class Kind(enum.IntEnum):
    """The kind of a message: the first item of its header."""

    HELLO = 1
    INFER = 2
    CANCEL = 3
    RECORDS = 4
    QUERY = 5
    TABLE = 6
    RESULT = 7
    ERROR = 8
    REPLY = 9


class ModelState(enum.Enum):
    """Where a model is in its life: the strings Triton's RepositoryIndex uses. It crosses in a
    :class:`TableEntry` as itself."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


UNKNOWN_MODEL = "_unknown"
"""The model name an :class:`Outcome` carries for a request naming a model the server does not
serve (counted apart, so a client's typos cannot create metric series)."""


class Outcome(NamedTuple):
    """One request a front end answered.

    Attributes:
        model: its model name, or :data:`UNKNOWN_MODEL`.
        code: the gRPC status name of the answer (``"OK"``, ``"DEADLINE_EXCEEDED"``, ...).
        seconds: from decoding to the encoded answer.
        refusal: the reason it was refused at admission (``TrtServeError.refusal``), or None.
        late: answered OK after its deadline.
    """

    model: str
    code: str
    seconds: float
    refusal: str | None
    late: bool


class Hello(NamedTuple):
    """A front end connected: ``pid`` (the core watches it: a dead front end's requests leave
    the queue) and its front-end number ``index`` (kept across a restart)."""

    pid: int
    index: int


class Infer(NamedTuple):
    """One request's engine rows, followed by their tensor frames.

    Attributes:
        rid: request id, unique per front end.
        model, version: the model, and the version asked for (empty: the highest served
            when the rows arrive).
        ask: the request's timing as the front end read it
            (:class:`~trtserve.ipc.admission.Ask`; the engine core resolves it once).
        layout: the tensor frames' layout (:func:`trtserve.ipc.framing.pack`).
    """

    rid: int
    model: str
    version: str
    ask: Ask
    layout: Layout


class Cancel(NamedTuple):
    """Take request ``rid`` out of the queue (its caller went away)."""

    rid: int


class Records(NamedTuple):
    """What a front end answered since its last report.

    Attributes:
        active: requests in flight at that front end now.
        outcomes: one :class:`Outcome` per answered request.
        refused: model → requests refused on their deadline before crossing.
    """

    active: int
    outcomes: tuple[Outcome, ...]
    refused: dict[str, int]


class Query(NamedTuple):
    """Ask the engine core ``query`` (:mod:`trtserve.ipc.queries`); answered by a :class:`Reply`
    with the same ``rid``."""

    rid: int
    query: EngineQuery[Any]


class TableEntry(NamedTuple):
    """One model of a :class:`Table`.

    Attributes:
        name: the model's name.
        state: where the model is in its life.
        reason: why it is not ready (empty when it is).
        specs: per served version, ascending, its spec without ``config`` and the config
            serialized (:func:`spec_out`); empty unless READY.
    """

    name: str
    state: ModelState
    reason: str
    specs: tuple[tuple[Any, bytes], ...]


class Table(NamedTuple):
    """The engine core's model table.

    Attributes:
        loaded: the models loaded at start are loaded.
        ready: the engine core counts the server ready (``--strict-readiness``).
        strict: strict readiness (a model a front end cannot serve makes it not ready).
        models: every model the engine core knows.
    """

    loaded: bool
    ready: bool
    strict: bool
    models: tuple[TableEntry, ...]


class Result(NamedTuple):
    """A request's outputs, followed by their tensor frames.

    Attributes:
        rid: the request's id.
        deadline: the deadline the engine core resolved for it (monotonic seconds).
        layout: the output frames' layout.
        version: the version that answered.
        model: the model's name; ``hint``: its queue, a pickled
            :class:`~trtserve.ipc.admission.QueueHint` (pickled once per refresh, compared
            as bytes by the front end, read only when it changed).
    """

    rid: int
    deadline: float
    layout: Layout
    version: str
    model: str
    hint: bytes


class Error(NamedTuple):
    """A request failed: ``code`` is its error's class (:func:`trtserve.errors.error_for` makes it
    again), ``message`` its sentence; ``model`` and ``hint`` as in :class:`Result` when the model
    is known (else empty)."""

    rid: int
    code: ErrorCode
    message: str
    model: str = ""
    hint: bytes = b""


class Reply(NamedTuple):
    """The answer to :class:`Query` ``rid``: ``value``, or when ``error`` is set the failure of
    that :class:`~trtserve.errors.ErrorCode` with ``value`` as its sentence."""

    rid: int
    value: Any
    error: ErrorCode | None = None


Message = Hello | Infer | Cancel | Records | Query | Table | Result | Error | Reply
"""Any message of the table in the module docstring."""

KIND_OF: dict[type, Kind] = {
    Hello: Kind.HELLO, Infer: Kind.INFER, Cancel: Kind.CANCEL, Records: Kind.RECORDS, Query: Kind.QUERY,
    Table: Kind.TABLE, Result: Kind.RESULT, Error: Kind.ERROR, Reply: Kind.REPLY,
}
CLASS_OF: dict[int, Any] = {int(kind): cls for cls, kind in KIND_OF.items()}


def encode(message: Message) -> bytes:
    """The header frame of ``message``: ``(kind, *fields)`` pickled."""
    return pickle.dumps((KIND_OF[type(message)], *message), protocol=pickle.HIGHEST_PROTOCOL)


def decode(frame: Any) -> Message:
    """The message of a header frame (``bytes`` or a ``zmq.Frame``).

    Raises:
        KeyError: an unknown kind (a front end and a core of different trtserve versions).
    """
    kind, *fields = pickle.loads(frame.buffer if hasattr(frame, "buffer") else frame)
    return CLASS_OF[kind](*fields)


def spec_out(spec: ModelSpec) -> tuple[ModelSpec, bytes]:
    """A model spec as it crosses in a :class:`TableEntry`: its ``config`` message serialized
    (protobuf classes of generated modules do not pickle by reference)."""
    return dataclasses.replace(spec, config=None), spec.config.SerializeToString() if spec.config is not None else b""


def spec_in(spec: ModelSpec, config: bytes) -> ModelSpec:
    """The spec that :func:`spec_out` sent."""
    return dataclasses.replace(spec, config=mc.ModelConfig.FromString(config))


def pickled(value: Any) -> bytes:
    """``value`` pickled, for a header field sent as bytes (a queue hint)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpickled(data: bytes) -> Any:
    """The value :func:`pickled` made."""
    return pickle.loads(data)


__all__ = ["CLASS_OF", "KIND_OF", "UNKNOWN_MODEL", "Cancel", "Error", "Hello", "Infer", "Kind", "Message",
           "ModelState", "Outcome", "Query", "Records", "Reply", "Result", "Table", "TableEntry", "decode",
           "encode", "pickled", "spec_in", "spec_out", "unpickled"]
