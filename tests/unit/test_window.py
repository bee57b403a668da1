"""The concurrency window's control law (trtserve.frontend.window), on a fake clock, and the HTTP
door's transport hold's order and expiry (trtserve.frontend.http.hold) with fake connections.

Issue 36 item 3: the window grows while requests wait for it and those let in finish well inside
their deadlines, shrinks when they come close to them, and stays put in between; a held request
runs in arrival order while the backlog is within a window and newest first beyond it; one held
past its deadline is answered by the ``expired`` application without running.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from trtserve.frontend.http.hold import TransportHold, budget_seconds
from trtserve.frontend.window import ConcurrencyWindow


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def serve(window: ConcurrencyWindow, clock: Clock, ratio: float, *, held: bool, intervals: int = 1) -> list[int]:
    """``intervals`` decision intervals in which 10 requests let in show ``ratio`` (sojourn ÷
    budget), requests waiting for the window or not; the window after each."""
    limits = []
    for _ in range(intervals):
        clock.t += window.interval * 1.001
        if held:
            window.held()
        for _ in range(10):
            window.observe(ratio * 0.01, 0.01)
        limits.append(window.limit)
    return limits


def test_the_window_grows_while_requests_wait_and_those_let_in_are_early():
    clock = Clock()
    window = ConcurrencyWindow(clock, start=8)
    limits = serve(window, clock, 0.2, held=True, intervals=10)
    assert limits == sorted(limits) and limits[-1] == 63, limits  # 8 -> 63 in ten intervals, a second
    assert window.moves == 10 and "grew" in window.reason


def test_it_shrinks_when_those_let_in_come_close_to_their_deadlines_and_not_below_the_floor():
    clock = Clock()
    window = ConcurrencyWindow(clock, start=64, floor=4)
    limits = serve(window, clock, 0.95, held=True, intervals=30)
    assert limits[0] == 51 and limits[-1] == 4, limits
    assert "shrank" in window.reason


@pytest.mark.parametrize("ratio, held", [(0.65, True), (0.2, False), (0.6, False)])
def test_it_stays_in_the_dead_band_and_when_nothing_waits(ratio, held):
    clock = Clock()
    window = ConcurrencyWindow(clock, start=32)
    assert serve(window, clock, ratio, held=held, intervals=20) == [32] * 20
    assert window.moves == 0


def test_without_deadlines_a_waiting_request_grows_it_and_too_few_ratios_wait():
    clock = Clock()
    window = ConcurrencyWindow(clock, start=8, ceiling=12)
    for _ in range(5):
        clock.t += window.interval
        window.held()
        for _ in range(window.min_samples):
            window.observe(1.0, math.inf)  # no deadline: no ratio
    assert window.limit == 12  # grew, up to the ceiling
    window = ConcurrencyWindow(clock, start=8)
    clock.t += 1.0
    window.held()
    for _ in range(window.min_samples - 1):
        window.observe(0.99, 1.0)
    assert window.limit == 8  # seven answers are too few to decide on
    window.observe(0.99, 1.0)
    assert window.limit == 6


def test_bad_settings_are_refused_with_the_values():
    with pytest.raises(ValueError, match="floor <= start <= ceiling, got 4, 2, 8"):
        ConcurrencyWindow(Clock(), start=2, floor=4, ceiling=8)
    with pytest.raises(ValueError, match="interval must be > 0 seconds, got 0"):
        ConcurrencyWindow(Clock(), interval=0)


def test_the_deadline_header_gives_the_budget():
    assert budget_seconds([(b"host", b"x"), (b"trtserve-timeout-us", b"25000")]) == 0.025
    assert budget_seconds([(b"trtserve-timeout-us", b"soon")]) == math.inf  # refused 400 once it runs
    assert budget_seconds([]) == math.inf


class Cycle:
    def __init__(self, name: str, timeout_us: int | None = None, path: str = "/v2/models/m/infer") -> None:
        headers = [(b"trtserve-timeout-us", str(timeout_us).encode())] if timeout_us else []
        self.scope: dict[str, Any] = {"method": "POST", "path": path, "headers": headers}
        self.name = name


class Conn:
    """A connection whose requests finish when the test says so."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: list[tuple[str, str]]) -> None:
        self.loop, self.log = loop, log
        self.pending: dict[str, asyncio.Future[None]] = {}

    def run(self, cycle: Cycle, app: Any) -> asyncio.Future[None]:
        self.log.append((cycle.name, app))
        self.pending[cycle.name] = self.loop.create_future()
        return self.pending[cycle.name]

    def finish(self, name: str) -> None:
        self.pending.pop(name).set_result(None)


def hold_of(window_size: int) -> TransportHold:
    loop = asyncio.get_running_loop()
    window = ConcurrencyWindow(loop.time, start=window_size, floor=window_size, ceiling=window_size)
    return TransportHold(window, lambda method, path: path.endswith("/infer"), "expired")


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_held_requests_run_oldest_first_within_a_window_and_newest_first_beyond():
    log: list[tuple[str, str]] = []
    conn = Conn(asyncio.get_running_loop(), log)
    hold = hold_of(2)
    for name in "abcdef":
        assert hold.take(conn, Cycle(name), "app")
    assert [n for n, _ in log] == ["a", "b"] and hold.held == 4
    conn.finish("a")
    await settle()
    assert log[-1][0] == "f"  # 4 waiting, more than a window: the newest
    conn.finish("b")
    await settle()
    assert log[-1][0] == "e"  # 3 waiting: still the newest
    conn.finish("f")
    await settle()
    assert log[-1][0] == "c"  # 2 waiting, within a window: the oldest
    assert hold.running == 2 and hold.held == 1


async def test_a_held_request_past_its_deadline_goes_to_the_expired_app_and_others_are_not_held():
    log: list[tuple[str, str]] = []
    conn = Conn(asyncio.get_running_loop(), log)
    hold = hold_of(1)
    assert hold.take(conn, Cycle("blocker"), "app")
    late = Cycle("late", timeout_us=20_000)
    assert hold.take(conn, late, "app")
    assert not hold.take(conn, Cycle("health", path="/v2/health/ready"), "app")  # never held
    await asyncio.sleep(0.05)
    assert log[-1] == ("late", "expired") and hold.held == 0
    conn.finish("blocker")
    await settle()
    assert hold.running == 0


async def test_a_request_that_waited_runs_with_the_budget_it_has_left_and_a_closed_connection_takes_its_own():
    log: list[tuple[str, str]] = []
    loop = asyncio.get_running_loop()
    conn, other = Conn(loop, log), Conn(loop, log)
    hold = hold_of(1)
    hold.take(conn, Cycle("blocker"), "app")
    waited = Cycle("waited", timeout_us=10_000_000)
    hold.take(conn, waited, "app")
    hold.take(other, Cycle("gone"), "app")
    hold.forget(other)
    assert hold.held == 1
    conn.finish("blocker")
    await settle()
    assert [n for n, _ in log] == ["blocker", "waited"]
    (name, value), = waited.scope["headers"]
    assert name == b"trtserve-timeout-us" and 9_000_000 < int(value) < 10_000_000
