"""A clock for tests: :class:`FakeClock` moves only when told to, so code that waits on a
:class:`~trtserve.clock.Clock` (the dispatcher, the drain) runs without real waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from trtserve.clock import Cancellable


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
