"""A front end's admission, in-flight bound and graceful drain (C25).

Lifecycle of a request: *admitted* (counted in :attr:`Admission.active`) unless the front end
is draining or already holds :attr:`Admission.limit` requests, answered, released exactly once
however its task ends (answered, failed, cancelled). Draining refuses admission; :func:`drain`
waits for ``active`` to reach 0.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from ..clock import Clock
from ..errors import InflightFull, ShuttingDown, TrtServeError

log = logging.getLogger(__name__)

REFUSED = "the server is shutting down and accepts no new requests"
GRACE_EXPIRED = "the server's shutdown grace period ran out before this request finished"
# After the grace ran out, how long the UNAVAILABLE answers get to be written before the
# server stops.
FINAL_WRITE_S = 0.5
# Once all is answered, the longest the server waits for the last writes before it stops.
FINAL_STOP_S = 5.0


class Admission:
    """Which requests a front end has admitted and not answered yet.

    Args:
        on_change: called with :attr:`active` whenever it changes (the engine core sums the
            front ends' counts for ``trtserve_inflight_requests``).

    Attributes:
        draining: no new request is admitted.
        expired: the drain's grace ran out: the tasks still answering were cancelled and
            answer UNAVAILABLE.
        active: admitted requests not released yet (unary calls and stream messages).
        limit: most requests admitted at once (``--max-inflight-rpcs``); ``None``: no bound.
            Only inference requests count: health, metadata, statistics and model control
            are never refused by it, so an orchestrator's probes answer under overload.
        limit_source: what ``limit`` is, for the refusal's message.
    """

    def __init__(self, on_change: Callable[[int], None] | None = None) -> None:
        self.on_change = on_change
        self.draining = False
        self.expired = False
        self.active = 0
        self.limit: int | None = None
        self.limit_source = "--max-inflight-rpcs"
        self._quiet = asyncio.Event()  # set once draining and active == 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def admit(self) -> TrtServeError | None:
        """Admit one request (``None``), or the refusal to answer it with: ShuttingDown
        (UNAVAILABLE) while draining, InflightFull (RESOURCE_EXHAUSTED) at :attr:`limit`."""
        if self.draining:
            return ShuttingDown(REFUSED)
        if self.limit is not None and self.active >= self.limit:
            return InflightFull(
                f"overloaded: this front end already has {self.active} requests in progress, its bound "
                f"({self.limit_source}); retry on another server or later"
            )
        self.active += 1
        if self.on_change is not None:
            self.on_change(self.active)
        return None

    def track(self, task: asyncio.Task[Any]) -> None:
        """``task`` answers an admitted request: cancel it if the grace runs out."""
        self._tasks.add(task)

    def release(self, task: asyncio.Task[Any] | None) -> None:
        """An admitted request (answered by ``task``) is done: call exactly once per admission."""
        self.active -= 1
        if task is not None:
            self._tasks.discard(task)
        if self.on_change is not None:
            self.on_change(self.active)
        if self.draining and self.active == 0:
            self._quiet.set()

    def begin_drain(self) -> None:
        """Stop admitting."""
        self.draining = True
        if self.active == 0:
            self._quiet.set()

    async def wait_quiet(self, timeout: float | None) -> bool:
        """Wait (after :meth:`begin_drain`) until every admitted request is answered; False on timeout."""
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def abandon(self) -> int:
        """The grace ran out: cancel every task still answering (each answers UNAVAILABLE and
        its queued rows leave the engine core's queue). Returns how many there were."""
        self.expired = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)


class Drainable(Protocol):
    """What :func:`drain` needs of a front end's service."""

    admission: Admission
    clock: Clock

    async def begin_drain(self) -> None: ...


async def drain(server: grpc.aio.Server, service: Drainable, grace: float) -> None:
    """Graceful shutdown of one front end (C25), within ``grace`` seconds:

    1. at once: ServerReady false, health NOT_SERVING, new calls and new stream messages
       UNAVAILABLE (never NOT_FOUND: models stay loaded); ServerLive stays true;
    2. every admitted request, unary or inside a stream, is answered; each stream ends OK
       after its last answer;
    3. if the grace runs out first, the requests still in progress are answered UNAVAILABLE;
    4. then the gRPC server stops.

    The engine core keeps serving meanwhile; the supervisor closes it once every front end
    has drained.
    """
    clock, admission = service.clock, service.admission
    end = clock.now() + grace if math.isfinite(grace) else math.inf

    def left() -> float | None:
        return None if end == math.inf else max(0.0, end - clock.now())

    await service.begin_drain()
    if not await admission.wait_quiet(left()):
        log.warning("grace period of %.1f s ran out: %d request(s) answered UNAVAILABLE", grace, admission.abandon())
        await admission.wait_quiet(FINAL_WRITE_S)
    # Everything admitted is answered: what is left is writing the last stream messages
    # (and open health Watch calls, which never end by themselves), so a short stop.
    remaining = left()
    await server.stop(FINAL_STOP_S if remaining is None else min(max(remaining, FINAL_WRITE_S), FINAL_STOP_S))
