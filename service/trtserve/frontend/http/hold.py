"""The HTTP door's transport hold: inference requests beyond the front end's concurrency window
wait, parsed but not run, until a request in progress finishes; one still waiting at its
deadline is answered 504 without running.

A refusal made by the application costs the server about 0.4 ms of CPU per request, as much as
answering a small model's request (``trtserve bench --modes refusals``), so past capacity a
door that hands every request to the application spends its CPU refusing. Held here, a
request costs its parse (httptools, in C) and an entry in a list; the window
(:class:`~trtserve.frontend.window.ConcurrencyWindow`) decides how many run at once from how
close those it let in came to their deadlines.

Which requests: ``POST /v2/models/<m>[/versions/<v>]/infer`` and ``POST /v1/embeddings``, as
the application routes them (:meth:`RestApp.holdable <trtserve.frontend.http.app.RestApp.holdable>`).
Health, metadata, statistics, tokenization and model control are never held. A request's
deadline here is its ``trtserve-timeout-us`` header, µs from its arrival at the door (a
``timeout`` parameter in its body is read only once it runs, by admission: until then such a
request waits like one without a deadline). A request that runs after waiting runs with the
header rewritten to the budget it has left, so the application counts its deadline from the
same arrival.

Order: oldest first while the requests held are no more than the window (a burst is served in
arrival order); newest first beyond that, when the server is overloaded ("adaptive LIFO",
Maurer, *Fail at Scale*, ACM Queue 13(8), 2015): the requests that run then have their whole
deadline ahead of them instead of the stalest ones, which would expire in the server.

A held request leaves the hold when it runs, when its deadline passes (answered 504 by
``expired``: the application's error body, counted DEADLINE_EXCEEDED with reason ``window``),
when its client closes the connection (there is no one to answer), or when the front end
drains (it runs, and is refused 503 as every request then is). Touched only from the event
loop's thread.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from trtserve.frontend.window import ConcurrencyWindow

TIMEOUT_HEADER = "trtserve-timeout-us"
"""A request header carrying the request's deadline in microseconds from its arrival."""
_TIMEOUT = TIMEOUT_HEADER.encode()


class Runs(Protocol):
    """What the hold needs of a connection (:class:`~trtserve.frontend.http.protocol.BoundedProtocol`)."""

    def run(self, cycle: RequestResponseCycle, app: Any) -> asyncio.Task[None]:
        """Start answering ``cycle`` with the ASGI ``app``; the task that answers it."""
        ...


@dataclass(eq=False)
class _Held:
    conn: Runs
    cycle: RequestResponseCycle
    app: Any
    arrived: float
    budget: float  # seconds; inf: no deadline
    timer: asyncio.TimerHandle | None = None


def budget_seconds(headers: list[tuple[bytes, bytes]]) -> float:
    """The deadline budget a request's headers give, seconds (``math.inf``: none, or not a whole
    number of µs — the application refuses that one 400 once it runs)."""
    for name, value in headers:
        if name == _TIMEOUT:
            return int(value) / 1e6 if value.isdigit() and int(value) > 0 else math.inf
    return math.inf


class TransportHold:
    """The inference requests of one front end's HTTP door: those running (at most the window)
    and those held (see the module docstring).

    Args:
        window: the concurrency window (its clock is the event loop's, ``loop.time``).
        holdable: whether a request (method, path) is an inference request.
        expired: the ASGI application that answers a request whose deadline passed while held.

    Attributes:
        running: inference requests started and not finished.
    """

    def __init__(self, window: ConcurrencyWindow, holdable: Callable[[str, str], bool], expired: Any) -> None:
        self.window = window
        self.holdable = holdable
        self.expired = expired
        self.running = 0
        self._held: dict[_Held, None] = {}  # arrival order

    @property
    def held(self) -> int:
        """Requests waiting for the window."""
        return len(self._held)

    def take(self, conn: Runs, cycle: RequestResponseCycle, app: Any) -> bool:
        """Take a request whose headers are whole: start it now, or hold it, and return True; or
        return False when it is not an inference request (the connection starts it itself)."""
        scope = cycle.scope
        if not self.holdable(scope["method"], scope["path"]):
            return False
        entry = _Held(conn, cycle, app, self.window.clock(), budget_seconds(scope["headers"]))
        if self.running < self.window.limit and not self._held:
            self._start(entry)
            return True
        self._held[entry] = None
        self.window.held()
        if math.isfinite(entry.budget):
            entry.timer = asyncio.get_running_loop().call_later(entry.budget, self._expire, entry)
        return True

    def forget(self, conn: Runs) -> None:
        """``conn`` closed: its held requests leave (no one is left to answer them)."""
        for entry in [e for e in self._held if e.conn is conn]:
            self._drop(entry)

    def release_all(self) -> None:
        """The front end drains: every held request runs now (and is refused 503 by the application)."""
        for entry in list(self._held):
            self._drop(entry)
            self._start(entry, waited=True)

    def _start(self, entry: _Held, waited: bool = False) -> None:
        self.running += 1
        if waited and math.isfinite(entry.budget):  # the application counts the deadline from when it runs
            left = entry.budget - (self.window.clock() - entry.arrived)
            scope = entry.cycle.scope
            scope["headers"] = [(n, v) for n, v in scope["headers"] if n != _TIMEOUT]
            scope["headers"].append((_TIMEOUT, str(max(1, round(left * 1e6))).encode()))
        task = entry.conn.run(entry.cycle, entry.app)
        task.add_done_callback(lambda _task: self._finished(entry))

    def _finished(self, entry: _Held) -> None:
        self.running -= 1
        self.window.observe(self.window.clock() - entry.arrived, entry.budget)
        while self._held and self.running < self.window.limit:
            # Oldest first while the backlog is within one window, newest first beyond it.
            nxt = next(iter(self._held) if len(self._held) <= self.window.limit else reversed(self._held))
            self._drop(nxt)
            self._start(nxt, waited=True)

    def _expire(self, entry: _Held) -> None:
        entry.timer = None
        self._drop(entry)
        entry.conn.run(entry.cycle, self.expired)

    def _drop(self, entry: _Held) -> None:
        del self._held[entry]
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None


__all__ = ["TIMEOUT_HEADER", "TransportHold", "budget_seconds"]
