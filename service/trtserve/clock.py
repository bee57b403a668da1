"""Time as an interface: the only module that reads the system clock.

All times in trtserve are seconds on a monotonic clock (``float``). Deadlines, queue delays and
measured run times are differences of :meth:`Clock.now` readings. Tests inject
:class:`trtserve.testing.FakeClock`, which moves only when told to, so dispatcher tests need no
real waiting.
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
