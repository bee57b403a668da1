"""A front end's in-flight gate: which inference requests it has taken on, its in-flight
bound, and the refusal of new ones while it drains (any transport).

A request is *admitted* (counted in :attr:`InflightGate.active`) unless the front end is
draining or already holds :attr:`InflightGate.limit` requests, then answered, and released
exactly once however its task ends (answered, failed, cancelled). Draining refuses admission;
:func:`trtserve.frontend.drain.drain` waits for ``active`` to reach 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trtserve.errors import InflightFull, ShuttingDown, TrtServeError

log = logging.getLogger(__name__)

REFUSED = "the server is shutting down and accepts no new requests"
"""The message of a request refused while draining (UNAVAILABLE)."""
GRACE_EXPIRED = "the server's shutdown grace period ran out before this request finished"
"""The message of a request abandoned when the grace runs out (UNAVAILABLE)."""


class InflightGate:
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

    @contextmanager
    def held(self, task: asyncio.Task[Any] | None) -> Iterator[TrtServeError | None]:
        """Admit one request, answered by ``task``, for the duration of the block.

        Yields the refusal (:meth:`admit`), or None when admitted: then the request is tracked
        for the drain and released exactly once when the block ends, however it ends.
        """
        refusal = self.admit()
        if refusal is None and task is not None:
            self.track(task)
        try:
            yield refusal
        finally:
            if refusal is None:
                self.release(task)

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


__all__ = ["GRACE_EXPIRED", "REFUSED", "InflightGate"]
