"""Time as an interface: the only module that reads the system clock.

All times in trtserve are seconds on a monotonic clock (``float``). Deadlines, queue delays and
measured run times are differences of :meth:`Clock.now` readings. Tests inject
:class:`FakeClock`, which moves only when told to, so dispatcher tests need no real waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock with an awaitable "sleep until"."""

    def now(self) -> float:
        """Current time in seconds (monotonic; only differences are meaningful)."""

    async def sleep_until(self, when: float) -> None:
        """Return once ``now() >= when`` (at once if it already is). Cancellable."""

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` on the event loop once ``now() >= when``; cancel() to drop it."""


class Cancellable(Protocol):
    """A scheduled callback (what :meth:`Clock.call_at` returns)."""

    def cancel(self) -> object:
        """Drop the callback if it has not run yet."""
        ...


class MonotonicClock:
    """The production clock: :func:`time.monotonic` and ``asyncio.sleep``."""

    def now(self) -> float:
        """:func:`time.monotonic`, seconds."""
        return time.monotonic()

    async def sleep_until(self, when: float) -> None:
        """``asyncio.sleep`` until ``when`` (at once if it has passed)."""
        delay = when - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        """``loop.call_later`` at ``when``; the handle cancels it."""
        return asyncio.get_running_loop().call_later(max(when - time.monotonic(), 0.0), callback)


def wall_time_ns() -> int:
    """Nanoseconds since the Unix epoch, for reports that need calendar time (statistics'
    ``last_inference``); never used for deadlines or durations."""
    return time.time_ns()


class FakeClock:
    """A clock for tests: time moves only through :meth:`advance`.

    Coroutines blocked in :meth:`sleep_until` wake when an ``advance`` reaches their time,
    in time order. Time never goes backwards (``advance`` with a negative step raises
    ``ValueError``).
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        """The fake time, seconds."""
        return self._now

    async def sleep_until(self, when: float) -> None:
        """Return once :meth:`advance` reaches ``when`` (after one loop turn if it has passed)."""
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((when, fut))
        try:
            await fut
        finally:
            self._sleepers = [(t, f) for t, f in self._sleepers if f is not fut]

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` on the loop once the fake time reaches ``when`` (on the next turn if
        it already has); the returned future cancels it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: None if f.cancelled() else callback())
        if when <= self._now:
            fut.set_result(None)
        else:
            self._sleepers.append((when, fut))
        return fut

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and let every woken coroutine run."""
        if seconds < 0:
            raise ValueError(f"time can't go backwards (advance by {seconds})")
        target = self._now + seconds
        self._sleepers = [(t, f) for t, f in self._sleepers if not f.done()]  # cancelled timers
        await settle()  # let whatever is ready now run at the current time first
        while True:
            due = sorted(((t, f) for t, f in self._sleepers if t <= target and not f.done()), key=lambda tf: tf[0])
            if not due:
                break
            when, fut = due[0]
            self._now = max(self._now, when)
            fut.set_result(None)
            await settle()
        self._now = target
        await settle()


async def settle(rounds: int = 20) -> None:
    """Yield to the event loop ``rounds`` times so that ready callbacks and tasks run.

    Tests use it after an action, instead of sleeping, to reach the point where every task
    is blocked again.
    """
    for _ in range(rounds):
        await asyncio.sleep(0)
