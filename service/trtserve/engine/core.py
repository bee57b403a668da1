"""The engine core: one process holding every model's dispatcher and execution slots.

Front ends do everything per request (auth, decoding, validation, the handler's tokenizing,
encoding) and send the engine rows here over ZeroMQ (the contract: :mod:`trtserve.ipc`). The
core only admits (deadline, priority), batches and runs, so its timing decisions are not
delayed by request parsing.

One asyncio loop owns all state: the ROUTER socket's messages are handled on it, one at a
time, one handler per message class, and each request's future answers its front end when it
resolves. A cancelled call's :class:`~trtserve.ipc.messages.Cancel`, or the death of its front
end (watched through a pidfd), takes its rows out of the queue at once: they never run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import zmq

from trtserve.datatypes import Tensors
from trtserve.engine.lifecycle import LifecycleConfig, ModelLifecycle
from trtserve.engine.metrics import MetricsServer, RequestStats, TrtServeCollector
from trtserve.engine.model import EngineModel
from trtserve.engine.queries import CoreQueries
from trtserve.engine.registry import ModelRegistry
from trtserve.errors import ErrorCode, TrtServeError
from trtserve.ipc import framing
from trtserve.ipc.admission import QueueHint
from trtserve.ipc.channel import Channel, open_socket
from trtserve.ipc.messages import (
    Cancel,
    Error,
    Hello,
    Infer,
    Message,
    ModelState,
    Outcome,
    Query,
    Records,
    Reply,
    Result,
    Table,
    TableEntry,
    decode,
    encode,
    pickled,
    spec_out,
)
from trtserve.spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class FrontendPeer:
    """One connected front end, as the core knows it.

    Attributes:
        identity: its ZeroMQ routing id.
        pid: its process id (0 when unknown).
        index: its front-end number (kept across a restart).
        active: requests in flight there, as it last reported (for ``trtserve_inflight_requests``).
        pending: request id → the dispatcher future answering it.
    """

    identity: bytes
    pid: int = 0
    index: int = 0
    active: int = 0
    pending: dict[int, asyncio.Future[list[Tensors]]] = field(default_factory=dict)


class EngineCore:
    """Serves the models of ``registry`` to front ends connecting to ``address``.

    Args:
        registry: the live model registry (:class:`~trtserve.engine.registry.ModelRegistry`;
            its models are loaded by :meth:`load`).
        address: the ZeroMQ endpoint to bind (``ipc:///run/dir/engine.sock``); ``None`` for
            none: a front end in this process uses it directly
            (:class:`~trtserve.engine.local.LocalEngine`, ``trtserve serve --frontends 1``).
        metrics_host, metrics_port: serve Prometheus metrics there (port 0: ephemeral);
            ``metrics_port=None``: no endpoint.
        lifecycle: the model control mode and readiness rule (default: Triton's ``none``,
            strict); see :mod:`trtserve.engine.lifecycle`.

    Lifecycle: :meth:`start` (bind, answer), :meth:`load` (models ready; front ends get the
    model table), then :meth:`aclose` once every front end has drained: queued and running
    requests finish, the runtimes close. Whenever a model is loaded, reloaded or unloaded, the
    new table goes to every front end (and to each of :attr:`table_listeners`, the front end
    of this process).
    """

    def __init__(
        self,
        registry: ModelRegistry,
        address: str | None,
        *,
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        lifecycle: LifecycleConfig | None = None,
    ) -> None:
        self.registry = registry
        self.lifecycle = ModelLifecycle(registry, lifecycle)
        self.table_listeners: list[Callable[[], None]] = []
        registry.listeners.append(self._publish)
        self.address = address
        self.clock = registry.clock
        self.requests = RequestStats(registry.clock)
        self.peers: dict[bytes, FrontendPeer] = {}
        self.frontend_requests: Counter[int] = Counter()  # front-end number → infer messages
        self.local_active = 0  # requests in flight at a front end in this process
        self.loaded = False
        self.metrics: MetricsServer | None = None
        self._metrics_at = (metrics_host, metrics_port)
        self._channel: Channel | None = None
        self._hints: dict[str, tuple[QueueHint, bytes]] = {}  # model → its last queue hint, pickled
        self.queries = CoreQueries(registry, self.lifecycle, self.requests, lambda: self.loaded)
        self._handlers: dict[type, Callable[[FrontendPeer, Any, list[Any]], None]] = {
            Hello: self._on_hello, Infer: self._on_infer, Cancel: self._on_cancel,
            Records: self._on_records, Query: self._on_query,
        }

    @property
    def inflight(self) -> int:
        """Requests in flight over every front end (as each last reported)."""
        return self.local_active + sum(p.active for p in list(self.peers.values()))

    async def start(self) -> None:
        """Bind the socket and start answering (models may still be loading).

        Raises:
            zmq.ZMQError: the address cannot be bound.
            OSError: the metrics address cannot be bound.
        """
        host, port = self._metrics_at
        if port is not None:
            collector = TrtServeCollector(self.registry, self.requests, lambda: self.inflight, self.clock,
                                          frontends=lambda: dict(self.frontend_requests))
            self.metrics = MetricsServer(collector, host, port)
        if self.address is None:
            return
        sock = open_socket(zmq.ROUTER)
        sock.bind(self.address)
        self._channel = Channel(sock, self._receive)

    async def load(self) -> None:
        """Load the models the model control mode loads at start, then send the model table
        to the front ends."""
        await self.lifecycle.start()
        self.loaded = True
        self._publish()

    async def aclose(self) -> None:
        """Stop polling, finish everything queued and running, close the runtimes, then stop
        answering."""
        await self.lifecycle.aclose()
        await self.registry.aclose()
        if self._channel is not None:
            self._channel.close()
        if self.metrics is not None:
            self.metrics.close()

    # -- messages -----------------------------------------------------------------------

    def _receive(self, frames: list[Any]) -> None:
        identity, head, *tensors = frames
        peer = self.peers.get(identity.bytes)
        if peer is None:
            peer = self.peers[identity.bytes] = FrontendPeer(identity.bytes)
        message = decode(head)
        self._handlers[type(message)](peer, message, tensors)

    def _on_hello(self, peer: FrontendPeer, hello: Hello, _frames: list[Any]) -> None:
        peer.pid, peer.index = hello.pid, hello.index
        self.frontend_requests[peer.index] += 0  # the key exists before a scrape copies the counter
        self._watch(peer)
        if self.loaded:
            self._send_table(peer.identity)

    def _on_cancel(self, peer: FrontendPeer, cancel: Cancel, _frames: list[Any]) -> None:
        future = peer.pending.pop(cancel.rid, None)
        if future is not None:
            future.cancel()

    def _on_records(self, peer: FrontendPeer, records: Records, _frames: list[Any]) -> None:
        peer.active = records.active
        self.record(records.outcomes, records.refused)

    def _on_infer(self, peer: FrontendPeer, infer: Infer, frames: list[Any]) -> None:
        self.frontend_requests[peer.index] += 1
        served: EngineModel | None = None
        try:
            served = self.registry.get(infer.model, infer.version)
            future, deadline = served.submit(framing.unpack(infer.layout, frames), infer.ask)
        except TrtServeError as exc:
            self._send(peer.identity, Error(infer.rid, exc.error_code, str(exc), *self._hint(served)))
            return
        peer.pending[infer.rid] = future
        future.add_done_callback(partial(self._answer, peer, infer.rid, deadline, served))

    def _answer(self, peer: FrontendPeer, rid: int, deadline: float, served: EngineModel,
                future: asyncio.Future[list[Tensors]]) -> None:
        peer.pending.pop(rid, None)
        if future.cancelled():
            return  # the caller went away; nobody reads an answer
        exc = future.exception()
        if exc is not None:
            code = exc.error_code if isinstance(exc, TrtServeError) else ErrorCode.BACKEND_ERROR
            self._send(peer.identity, Error(rid, code, str(exc), *self._hint(served)))
            return
        layout, frames = framing.pack(future.result())
        result = Result(rid, deadline, layout, served.spec.version, *self._hint(served))
        self._send(peer.identity, result, frames)

    def record(self, outcomes: tuple[Outcome, ...] | list[Outcome], refused: dict[str, int]) -> None:
        """Count requests a front end answered (``outcomes``), and model → requests it refused
        on the deadline without sending (``refused``)."""
        for outcome in outcomes:
            self.requests.record(outcome.model, outcome.code, outcome.seconds, refusal=outcome.refusal,
                                 late=outcome.late)
        for model, count in refused.items():
            self.requests.refused_on_deadline(model, count)

    def _on_query(self, peer: FrontendPeer, query: Query, _frames: list[Any]) -> None:
        try:
            value = self.queries.answer(query.query)
        except Exception as exc:  # every query is answered: a bug becomes INTERNAL, not a hung call
            self._reply(peer, query.rid, exc, None)
            return
        if asyncio.iscoroutine(value):  # load, unload: answered when done, the loop serving meanwhile
            asyncio.ensure_future(value).add_done_callback(partial(self._replied, peer, query.rid))
            return
        self._reply(peer, query.rid, None, value)

    def table(self) -> list[tuple[str, ModelState, str, tuple[ModelSpec, ...]]]:
        """(name, state, reason, the specs of its served versions, ascending, when READY) of
        every model in the table."""
        return [(name, e.state, e.reason,
                 tuple(m.spec for m in e.versions.values()) if e.state is ModelState.READY else ())
                for name, e in sorted(self.registry.models.items())]

    def _replied(self, peer: FrontendPeer, rid: int, task: asyncio.Future[Any]) -> None:
        if not task.cancelled():  # cancelled: the core is closing
            self._reply(peer, rid, task.exception(), None if task.exception() else task.result())

    def _reply(self, peer: FrontendPeer, rid: int, exc: BaseException | None, value: Any) -> None:
        if exc is None:
            self._send(peer.identity, Reply(rid, value))
            return
        if not isinstance(exc, TrtServeError):
            log.error("engine core: query failed", exc_info=exc)
        code = exc.error_code if isinstance(exc, TrtServeError) else ErrorCode.BACKEND_ERROR
        self._send(peer.identity, Reply(rid, str(exc), code))

    def _publish(self) -> None:
        """Send the model table to every front end (once loaded)."""
        if not self.loaded:
            return
        for peer in list(self.peers.values()):
            self._send_table(peer.identity)
        for listener in list(self.table_listeners):
            listener()

    def _send_table(self, identity: bytes) -> None:
        models = tuple(TableEntry(name, state, reason, tuple(spec_out(s) for s in specs))
                       for name, state, reason, specs in self.table())
        table = Table(self.loaded, self.lifecycle.ready, self.lifecycle.config.strict_readiness, models)
        self._send(identity, table)

    def _send(self, identity: bytes, message: Message, frames: list[Any] | tuple[()] = ()) -> None:
        assert self._channel is not None
        self._channel.send((identity, encode(message), *frames))

    def _hint(self, served: EngineModel | None) -> tuple[str, bytes] | tuple[()]:
        """The last fields of a :class:`Result` or :class:`Error`: the model's name and its
        queue (:class:`~trtserve.ipc.admission.QueueHint`, pickled once per refresh of the
        dispatcher's hint), so that the front end refuses what cannot finish in time before
        it crosses."""
        if served is None:
            return ()
        hint = served.dispatcher.hint()
        cached = self._hints.get(served.spec.name)
        if cached is None or cached[0] is not hint:
            cached = self._hints[served.spec.name] = (hint, pickled(hint))
        return served.spec.name, cached[1]

    # -- front ends that die --------------------------------------------------------------

    def _watch(self, peer: FrontendPeer) -> None:
        """Forget ``peer`` when its process ends: its queued rows leave the queue unrun."""
        if peer.pid in (0, os.getpid()):
            return
        try:
            fd = os.pidfd_open(peer.pid)
        except (ProcessLookupError, OSError):
            self._gone(peer)
            return
        loop = asyncio.get_running_loop()

        def ended() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self._gone(peer)

        loop.add_reader(fd, ended)

    def _gone(self, peer: FrontendPeer) -> None:
        self.peers.pop(peer.identity, None)
        pending = list(peer.pending.values())
        peer.pending.clear()
        for future in pending:
            future.cancel()
        if pending:
            log.warning("front end (pid %d) is gone: %d of its request(s) left the queue", peer.pid, len(pending))


__all__ = ["EngineCore", "FrontendPeer"]
