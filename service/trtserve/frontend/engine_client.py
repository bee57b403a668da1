"""A front end's connection to the engine core (ZeroMQ DEALER; messages in :mod:`trtserve.engine.wire`).

:meth:`EngineClient.infer` sends one request's engine rows and waits for its outputs; if the
waiting task is cancelled (the gRPC call was cancelled or its deadline passed), a ``cancel``
message takes the rows out of the engine core's queue. Request outcomes are shipped to the
engine core in small batches (:meth:`EngineClient.record`), so ModelStatistics and the
metrics count every front end's requests; a query sends the outcomes recorded before it first,
so a client that asks right after its own request sees it counted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from ..batching import drain
from ..batching.drain import QueueHint
from ..batching.queue import Segment
from ..clock import Clock, MonotonicClock
from ..errors import ModelNotFound, ModelNotReady, RequestTimeout, ShuttingDown
from ..engine import wire
from ..engine.channel import Channel, open_socket
from ..spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """One model as the engine core reported it: state (Triton's RepositoryIndex names),
    the reason it is not ready, and when READY the specs of its served versions, ascending."""

    name: str
    state: str
    reason: str
    specs: tuple[ModelSpec, ...] = ()

    @property
    def spec(self) -> ModelSpec | None:
        """The highest version's spec (where a request without ``model_version`` goes)."""
        return self.specs[-1] if self.specs else None


class Engine(Protocol):
    """The engine core as a front end sees it: :class:`EngineClient` over ZeroMQ, or
    :class:`~trtserve.frontend.local.LocalEngine` in the same process."""

    models: dict[str, ModelInfo]
    loaded: asyncio.Event
    ready: bool
    strict: bool
    listeners: list[Callable[[], None]]

    def model(self, name: str) -> ModelInfo: ...

    async def infer(self, model: str, version: str, segments: list[Segment], *, priority: int = 0,
                    timeout: float | None = None, deadline: float = math.inf) -> tuple[list[Segment], float, str]: ...

    async def query(self, what: str, arg: Any = None) -> Any: ...

    def shed(self, model: str, priority: int, timeout: float | None, deadline: float, now: float) -> None: ...

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None: ...

    def set_active(self, active: int) -> None: ...

    async def aclose(self) -> None: ...


class EngineView:
    """What a front end knows of the engine core's models (both kinds of connection).

    Attributes:
        models: the model table (empty until :attr:`loaded` is set); replaced as a whole
            whenever the engine core sends a new one (a model loaded, reloaded, unloaded).
        loaded: set once the engine core has loaded its models and the table is here.
        ready: the engine core counts the server ready (``--strict-readiness``).
        strict: strict readiness: a model this front end cannot serve makes it not ready.
        listeners: called on the loop after each new table.
    """

    def __init__(self) -> None:
        self.models: dict[str, ModelInfo] = {}
        self.loaded = asyncio.Event()
        self.ready = False
        self.strict = True
        self.listeners: list[Callable[[], None]] = []

    def set_table(self, loaded: bool, ready: bool, strict: bool, models: dict[str, ModelInfo]) -> None:
        """Take a new model table from the engine core and tell the listeners."""
        self.models, self.ready, self.strict = models, ready, strict
        if loaded:
            self.loaded.set()
        for listener in list(self.listeners):
            listener()

    def model(self, name: str) -> ModelInfo:
        """The table entry of ``name``.

        Raises:
            ModelNotReady (UNAVAILABLE): the engine core has not sent its table yet.
            ModelNotFound (NOT_FOUND): no such model.
        """
        if not self.loaded.is_set():
            raise ModelNotReady("the server is still loading its models")
        info = self.models.get(name)
        if info is None:
            raise ModelNotFound(f"unknown model '{name}': the server serves no such model now (RepositoryIndex lists "
                                "the repository's models with their state, e.g. 'not loaded')")
        return info


class EngineClient(EngineView):
    """Talks to the engine core at ``address`` as front end number ``index`` (a restarted
    front end keeps its number; metrics count requests per number); ``clock`` is the
    monotonic clock deadlines are measured on.

    The model table is the one the engine core sent.
    """

    def __init__(self, address: str, index: int = 0, clock: Clock | None = None) -> None:
        super().__init__()
        self.address = address
        self.index = index
        self.clock = clock or MonotonicClock()
        self._channel: Channel | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._records: list[tuple[str, str, float, str | None, bool]] = []
        self._refused: Counter[str] = Counter()  # model → refused here, on the deadline, since the last flush
        self._hints: dict[str, QueueHint] = {}  # model → its queue, as the core's last answer said
        self._hint_frames: dict[str, bytes] = {}  # ... and as it came (read again only when it changes)
        self._active = 0
        self._sent_active = 0
        self._flush_scheduled = False

    async def connect(self) -> None:
        """Connect and say hello (the engine core answers with the model table once loaded)."""
        sock = open_socket(zmq.DEALER)
        sock.connect(self.address)
        self._channel = Channel(sock, self._receive)
        self._send(wire.header("hello", os.getpid(), self.index))

    async def aclose(self) -> None:
        """Stop receiving; every call still waiting fails with ShuttingDown (UNAVAILABLE)."""
        self._flush()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ShuttingDown("the front end is closing its connection to the engine core"))
        self._pending.clear()
        if self._channel is not None:
            self._channel.close()

    async def infer(
        self, model: str, version: str, segments: list[Segment], *, priority: int = 0,
        timeout: float | None = None, deadline: float = math.inf,
    ) -> tuple[list[Segment], float, str]:
        """Run one request's engine rows in the engine core.

        Args:
            model, version: the model, and the version asked for (empty: the highest the
                engine core serves when the rows arrive).
            segments: engine-input name → array with rows on axis 0, one dict per segment.
            priority: the ``priority`` parameter (1 is the most urgent; 0 for the default).
            timeout: the ``timeout`` parameter in seconds, or ``None``.
            deadline: the gRPC deadline, monotonic seconds (``math.inf``: none).

        Returns:
            (one output dict per segment, arrays viewing the reply's frames; the deadline the
            engine core resolved, monotonic seconds; the version that answered).

        Raises:
            DeadlineUnmeetable, Overloaded, QueueFull: refused here, without crossing
                (:meth:`shed`).
            InvalidRequest, QueueFull, Overloaded, RequestTimeout, ShuttingDown, BackendError,
            ModelNotReady, ModelNotFound: as the engine core answered.
        """
        self.shed(model, priority, timeout, deadline, self.clock.now())
        rid = next(self._ids)
        layout, frames = wire.pack(segments)
        future: asyncio.Future[tuple[list[Segment], float, str]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._send(wire.header("infer", rid, model, version, priority, timeout, deadline, layout), *frames)
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                self._send(wire.header("cancel", rid))
            raise

    async def query(self, what: str, arg: Any = None) -> Any:
        """Ask the engine core (``what`` as in ``EngineCore``'s query table); returns its value.

        Raises:
            TrtServeError: the engine core's error for this query (ModelNotFound, ...).
        """
        self._flush()
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._send(wire.header("query", rid, what, arg))
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    def shed(self, model: str, priority: int, timeout: float | None, deadline: float, now: float) -> None:
        """Refuse, without sending it, a request that cannot finish in time, judged by the
        model's queue as the engine core's last answer described it
        (:meth:`QueueHint.refusal <trtserve.batching.drain.QueueHint.refusal>`). Cheap: no
        tensor is decoded for it, so a front end calls it first.

        Args:
            priority, timeout: the request's parameters (timeout in seconds, or ``None``).
            deadline: the gRPC deadline, monotonic seconds (``math.inf``: none); ``now``: the
                time the ``timeout`` counts from.

        Raises:
            DeadlineUnmeetable (DEADLINE_EXCEEDED): even a batch of one started now would finish late.
            QueueFull (RESOURCE_EXHAUSTED): the model's queue at that level is full.
            Overloaded (RESOURCE_EXHAUSTED): the predicted queue wait exceeds the deadline.
            InvalidRequest (INVALID_ARGUMENT): a priority outside the model's levels.
        """
        refusal = drain.shed(self._hints.get(model), model, priority, timeout, deadline, now)
        if refusal is not None:
            if isinstance(refusal, RequestTimeout):
                self._refused[model] += 1
                self._schedule_flush()
            raise refusal

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """Count one answered request (sent with others on the next turn of the loop).

        Args:
            model: its model name (or ``metrics.UNKNOWN_MODEL``); ``code``: the gRPC status name.
            seconds: from decoding to the encoded answer.
            refusal: the reason it was refused at admission (``TrtServeError.refusal``), or None;
                ``late``: answered OK after its deadline.
        """
        self._records.append((model, code, seconds, refusal, late))
        self._schedule_flush()

    def set_active(self, active: int) -> None:
        """Requests in flight at this front end now (sent on the next turn of the loop)."""
        self._active = active
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if (self._records or self._refused or self._active != self._sent_active) and self._channel is not None:
            records, self._records = self._records, []
            refused, self._refused = dict(self._refused), Counter()
            self._sent_active = self._active
            self._send(wire.header("records", self._active, records, refused))

    def _take_hint(self, model: str, frame: bytes) -> None:
        if self._hint_frames.get(model) != frame:
            self._hint_frames[model] = frame
            (self._hints[model],) = wire.read_header(frame)

    def _send(self, *frames: Any) -> None:
        assert self._channel is not None
        self._channel.send(frames)

    def _receive(self, message: list[Any]) -> None:
        head, *frames = message
        self._handle(wire.read_header(head), frames)

    def _handle(self, head: tuple[Any, ...], frames: list[Any]) -> None:
        kind = head[0]
        if kind == "table":
            _, loaded, ready, strict, table = head
            self.set_table(loaded, ready, strict, {
                name: ModelInfo(name, state, reason, tuple(wire.spec_in(*spec) for spec in specs))
                for name, state, reason, specs in table})
            return
        future = self._pending.pop(head[1], None)
        if future is None or future.done():
            return  # cancelled meanwhile
        if kind == "result":
            _, _, deadline, layout, version, model, hint = head
            self._take_hint(model, hint)
            future.set_result((wire.unpack(layout, frames), deadline, version))
        elif kind == "error":
            if len(head) > 4:
                self._take_hint(head[4], head[5])
            future.set_exception(wire.error_of(head[2], head[3]))
        elif kind == "reply":
            _, _, ok, value = head
            if ok:
                future.set_result(value)
            else:
                future.set_exception(wire.error_of(*value))
