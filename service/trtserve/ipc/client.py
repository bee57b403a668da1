"""A front end's connection to the engine core (a ZeroMQ DEALER; the messages are
:mod:`trtserve.ipc.messages`).

:meth:`EngineClient.infer` sends one request's engine rows and waits for its outputs; if the
waiting task is cancelled (the call was cancelled or its deadline passed), a
:class:`~trtserve.ipc.messages.Cancel`
takes the rows out of the engine core's queue. Request outcomes are shipped to the engine core
in small batches (:meth:`EngineClient.record`), so ModelStatistics and the metrics count every
front end's requests; a query sends the outcomes recorded before it first, so a client that
asks right after its own request sees it counted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from trtserve.clock import Clock, MonotonicClock
from trtserve.datatypes import Tensors
from trtserve.errors import RequestTimeout, ShuttingDown, error_for
from trtserve.ipc import framing
from trtserve.ipc.admission import Ask, QueueHint, shed
from trtserve.ipc.channel import Channel, open_socket
from trtserve.ipc.engine import Engine, ModelInfo
from trtserve.ipc.messages import (
    Cancel,
    Error,
    Hello,
    Infer,
    Message,
    Outcome,
    Query,
    Records,
    Reply,
    Result,
    Table,
    decode,
    encode,
    spec_in,
    unpickled,
)
from trtserve.ipc.queries import EngineQuery

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineClient(Engine):
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
        self._outcomes: list[Outcome] = []
        # model → requests refused here, on the deadline, since the last flush
        self._refused: Counter[str] = Counter()
        self._hints: dict[str, QueueHint] = {}  # model → its queue, as the core's last answer said
        # ... and as it came (unpickled again only when it changes)
        self._hint_frames: dict[str, bytes] = {}
        self._active = 0
        self._sent_active = 0
        self._flush_scheduled = False
        self._handlers: dict[type, Callable[[Any, list[Any]], None]] = {
            Table: self._on_table, Result: self._on_result, Error: self._on_error, Reply: self._on_reply}

    async def connect(self) -> None:
        """Connect and say hello (the engine core answers with the model table once loaded)."""
        sock = open_socket(zmq.DEALER)
        sock.connect(self.address)
        self._channel = Channel(sock, self._receive)
        self._send(Hello(os.getpid(), self.index))

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
        self, model: str, version: str, segments: list[Tensors], ask: Ask,
    ) -> tuple[list[Tensors], float, str]:
        """Send one request's engine rows to the engine core and wait for its outputs
        (:meth:`Engine.infer <trtserve.ipc.engine.Engine.infer>`; the arrays view the reply's
        frames). Cancelled, it takes the rows out of the engine core's queue."""
        rid = next(self._ids)
        layout, frames = framing.pack(segments)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[list[Tensors], float, str]] = loop.create_future()
        self._pending[rid] = future
        self._send(Infer(rid, model, version, ask, layout), frames)
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                self._send(Cancel(rid))
            raise

    async def query(self, query: EngineQuery[T]) -> T:
        """Send ``query`` (the outcomes recorded so far go first) and wait for its reply
        (:meth:`Engine.query <trtserve.ipc.engine.Engine.query>`)."""
        self._flush()
        rid = next(self._ids)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._send(Query(rid, query))
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    def hint(self, model: str) -> QueueHint | None:
        """:meth:`Engine.hint <trtserve.ipc.engine.Engine.hint>`: from the core's last answer of
        ``model``."""
        return self._hints.get(model)

    def shed(self, model: str, ask: Ask, now: float) -> None:
        """:meth:`Engine.shed <trtserve.ipc.engine.Engine.shed>`, judged by the model's queue as
        the engine core's last answer described it (:meth:`QueueHint.refusal
        <trtserve.ipc.admission.QueueHint.refusal>`)."""
        refusal = shed(self._hints.get(model), model, ask, now)
        if refusal is not None:
            if isinstance(refusal, RequestTimeout):
                self._refused[model] += 1
                self._schedule_flush()
            raise refusal

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """Count one answered request (:meth:`Engine.record <trtserve.ipc.engine.Engine.record>`),
        sent with others on the next turn of the loop."""
        self._outcomes.append(Outcome(model, code, seconds, refusal, late))
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
        changed = self._outcomes or self._refused or self._active != self._sent_active
        if changed and self._channel is not None:
            outcomes, self._outcomes = tuple(self._outcomes), []
            refused, self._refused = dict(self._refused), Counter()
            self._sent_active = self._active
            self._send(Records(self._active, outcomes, refused))

    def _take_hint(self, model: str, hint: bytes) -> None:
        if model and self._hint_frames.get(model) != hint:
            self._hint_frames[model] = hint
            self._hints[model] = unpickled(hint)

    def _send(self, message: Message, frames: list[Any] | tuple[()] = ()) -> None:
        assert self._channel is not None
        self._channel.send((encode(message), *frames))

    def _receive(self, frames: list[Any]) -> None:
        message = decode(frames[0])
        self._handlers[type(message)](message, frames[1:])

    def _on_table(self, table: Table, _frames: list[Any]) -> None:
        self.set_table(table.loaded, table.ready, table.strict, {
            entry.name: ModelInfo(entry.name, entry.state, entry.reason, tuple(spec_in(*spec) for spec in entry.specs))
            for entry in table.models})

    def _waiting(self, rid: int) -> asyncio.Future[Any] | None:
        future = self._pending.pop(rid, None)
        return None if future is None or future.done() else future  # None: cancelled meanwhile

    def _on_result(self, result: Result, frames: list[Any]) -> None:
        self._take_hint(result.model, result.hint)
        future = self._waiting(result.rid)
        if future is not None:
            future.set_result((framing.unpack(result.layout, frames), result.deadline, result.version))

    def _on_error(self, error: Error, _frames: list[Any]) -> None:
        self._take_hint(error.model, error.hint)
        future = self._waiting(error.rid)
        if future is not None:
            future.set_exception(error_for(error.code, error.message))

    def _on_reply(self, reply: Reply, _frames: list[Any]) -> None:
        future = self._waiting(reply.rid)
        if future is None:
            return
        if reply.error is not None:
            future.set_exception(error_for(reply.error, reply.value))
        else:
            future.set_result(reply.value)


__all__ = ["EngineClient"]
