"""Admission against the queue ahead (``Dispatcher.submit`` with ``batching/wait.py``), on a
fake clock with a scripted engine of 10 ms + 1 ms per row: exact, no real waiting."""

from __future__ import annotations

import math

import pytest

from trtserve.batching.dispatcher import Dispatcher
from trtserve.config import BatchingPolicy
from trtserve.errors import DeadlineUnmeetable, Overloaded
from trtserve.testing import FakeBackend, FakeClock, rows, settle


async def learned(slots: int = 1) -> tuple[FakeClock, FakeBackend, Dispatcher]:
    """A dispatcher (max batch 4; priority levels 1 and 2, the default) whose latency model has
    measured batches of 1, 2 and 4 rows."""
    clock = FakeClock()
    backend = FakeBackend(clock, slots=slots, latency=lambda n: 0.010 + 0.001 * n)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=4, priority_levels=2, default_priority=2), clock=clock)
    d.start()
    for n in (1, 2, 4):
        fut = d.submit(rows(0, n=n))
        await clock.advance(0.1)
        assert fut.done()
    return clock, backend, d


async def test_a_deadline_the_queue_ahead_cannot_meet_is_refused_and_a_loose_one_admitted():
    clock, backend, d = await learned()
    # Ten batches of 14 ms at level 1: ahead of every request of level 2, whatever its deadline.
    queued = [d.submit(rows(i, n=4), priority=1, deadline=clock.now() + 10) for i in range(1, 11)]
    await settle()
    now = clock.now()
    # 20 ms: an idle slot would make it (11 ms); 140 ms of batches ahead do not.
    with pytest.raises(Overloaded, match=r"predicted queue wait 140\.0 ms"):
        d.submit(rows(99), deadline=now + 0.020)
    assert d.predict_wait(2, now + 0.020, 1).start - now == pytest.approx(0.140)
    with pytest.raises(DeadlineUnmeetable):
        d.submit(rows(98), priority=1, deadline=now + 0.005)  # 5 ms: not even on an idle slot
    urgent = d.submit(rows(97), priority=1, deadline=now + 0.030)  # due first at level 1: only the running batch ahead
    loose = d.submit(rows(96), deadline=now + 20)
    while not loose.done():
        await clock.advance(0.014)
    assert all(f.result() for f in queued) and urgent.result() and loose.result()
    assert sorted(i for ids in backend.ids() for i in ids if i >= 90) == [96, 97]  # the refused never ran


async def test_several_slots_drain_the_queue_in_parallel():
    clock, _backend, d = await learned(slots=2)
    for i in range(1, 11):
        d.submit(rows(i, n=4), deadline=clock.now() + 10)
    await settle()
    now = clock.now()
    wait = d.predict_wait(math.inf, math.inf, 0)
    # Two batches started at once; the other 8 x 14 ms go over the 2 slots as they free.
    assert wait.start - now == pytest.approx(0.014 + 0.056)
