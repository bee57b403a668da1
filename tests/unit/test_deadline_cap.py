"""Batches capped by deadlines (issue 16, item 2), through the dispatcher on a fake clock: a
tight request that arrives while a batch of loose rows runs must still be answered in time."""

from __future__ import annotations

import asyncio

import numpy as np

from trtserve.batching.dispatcher import Dispatcher
from trtserve.config import BatchingPolicy
from trtserve.errors import Overloaded
from trtserve.testing import FakeBackend, FakeClock, affine, rows, settle

LATENCY = affine(0.002, 0.002)  # p(1) = 4 ms, p(4) = 10 ms, p(16) = 34 ms
TIGHT, LOOSE = 0.020, 1.0


async def after(history: list[float]) -> tuple[FakeClock, FakeBackend, Dispatcher]:
    """A dispatcher (max batch 16, its curve measured) that has served ``history`` (budgets, one
    request each, alone, 50 ms apart); the batches it ran are forgotten."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=LATENCY)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=16), clock=clock)
    for b in (1, 2, 4, 8, 16):
        d.latency.observe(b, LATENCY(b))
    d.start()
    for i, budget in enumerate(history):
        d.submit(rows(i), deadline=clock.now() + budget)
        await clock.advance(0.050)
    backend.batches.clear()
    return clock, backend, d


async def tight_request_during_a_loose_batch(history: list[float]):
    """After ``history`` (:func:`after`), queue 16 loose rows behind a busy slot and send a tight
    request 1 ms after the slot frees. Returns (the tight request's future, failed with the
    refusal if admission refused it; the batch sizes run after the history)."""
    clock, backend, d = await after(history)
    d.submit(rows(100), deadline=clock.now() + LOOSE)  # occupies the slot for 4 ms
    await settle()
    loose = [d.submit(rows(200 + i), deadline=clock.now() + LOOSE) for i in range(16)]
    await clock.advance(0.005)  # the slot freed at 4 ms: the loose rows' batch started then
    try:
        tight = d.submit(rows(300), deadline=clock.now() + TIGHT)
    except Overloaded as refused:  # admission saw the queue ahead: refused at once
        tight = asyncio.get_running_loop().create_future()
        tight.set_exception(refused)
    await clock.advance(0.200)
    assert all(f.done() and f.exception() is None for f in loose)  # loose rows wait, never lost
    return tight, backend.sizes()


async def test_a_tight_request_arriving_during_a_batch_of_loose_rows_is_answered_in_time():
    # Half the recent traffic had a 20 ms budget: batches leave room for one (p(n) <= 20 - 5 - 4 ms).
    tight, sizes = await tight_request_during_a_loose_batch([TIGHT, LOOSE] * 20)
    assert tight.exception() is None
    np.testing.assert_array_equal(tight.result()[0]["y"], [[600.0]])
    assert sizes[0] == 1 and max(sizes[1:]) <= 4  # the loose rows ran in batches that fit


async def test_without_tight_traffic_the_loose_rows_run_in_one_full_batch():
    # Only loose budgets seen: one 16-row batch (34 ms) runs, and a tight request arriving
    # during it cannot be answered in time: admission refuses it at once, the predicted wait
    # being the batch's. (The cap is what protects it, not EDF order.)
    tight, sizes = await tight_request_during_a_loose_batch([LOOSE] * 40)
    assert isinstance(tight.exception(), Overloaded)
    assert "predicted queue wait" in str(tight.exception())
    assert sizes[:2] == [1, 16]


async def test_a_backlog_that_short_batches_would_make_miss_runs_in_full_batches():
    # The same tight traffic, then 64 rows due in 150 ms queued behind a busy slot. Batches of
    # four (10 ms) would end the last at 164 ms; batches of 16 (34 ms) end it at 140 ms. The
    # queued rows come before a tight request that may arrive: they run 16 at a time until the
    # rest fit in batches of four by their deadline, and then four at a time again, all in time.
    clock, backend, d = await after([TIGHT, LOOSE] * 20)
    d.submit(rows(100), deadline=clock.now() + LOOSE)  # occupies the slot for 4 ms
    await settle()
    backlog = [d.submit(rows(200 + i), deadline=clock.now() + 0.150) for i in range(64)]
    await clock.advance(0.200)
    assert [f.exception() for f in backlog] == [None] * 64
    assert backend.sizes() == [1, 16, 16, 16, 4, 4, 4, 4]
