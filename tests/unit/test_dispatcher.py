"""Dispatcher behaviour on a fake clock with a scripted engine: exact, no real waiting."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from trtserve.batching.dispatcher import Dispatcher, stage_ahead
from trtserve.batching.policy import DEADLINE_MARGIN_S, DEADLINE_MARGIN_SHARE
from trtserve.batching.wait import FULL_HORIZON_S
from trtserve.config import BatchingPolicy, QueuePolicy, TimeoutAction
from trtserve.errors import BackendError, QueueFull, RequestTimeout, ShuttingDown
from trtserve.testing import FakeBackend, FakeClock, rows, settle


def make(policy: BatchingPolicy, **backend_kw) -> tuple[FakeClock, FakeBackend, Dispatcher]:
    clock = FakeClock()
    backend = FakeBackend(clock, **backend_kw)
    dispatcher = Dispatcher(backend, policy, clock=clock)
    dispatcher.start()
    return clock, backend, dispatcher


async def test_idle_slot_runs_a_single_request_at_once():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    fut = d.submit(rows(1))
    await settle()
    assert backend.batches == [(clock.now(), backend.batches[0][1])]  # started with no time passing
    assert backend.sizes() == [1]
    await clock.advance(0.010)
    assert fut.done()
    np.testing.assert_array_equal(fut.result()[0]["y"], [[2.0]])


async def test_batches_grow_while_the_slot_is_busy():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    first = d.submit(rows(1))
    await settle()
    later = [d.submit(rows(i)) for i in range(2, 7)]  # arrive while batch 1 runs
    await settle()
    assert backend.sizes() == [1]
    await clock.advance(0.010)
    assert first.done()
    assert backend.sizes() == [1, 5]
    assert backend.ids()[1] == [2, 3, 4, 5, 6]
    await clock.advance(0.010)
    for i, fut in enumerate(later, start=2):
        np.testing.assert_array_equal(fut.result()[0]["y"], [[2.0 * i]])


async def test_batch_never_exceeds_max_batch_size_in_rows():
    clock, backend, d = make(BatchingPolicy(max_batch_size=4))
    d.submit(rows(0))
    await settle()
    futs = [d.submit(rows(i, n=3)) for i in (1, 2, 3)]  # 9 rows queued behind a busy slot
    await clock.advance(0.010)
    await clock.advance(0.010)
    await clock.advance(0.010)
    await clock.advance(0.010)
    assert max(backend.sizes()) <= 4
    assert sum(backend.sizes()) == 1 + 9
    for i, fut in zip((1, 2, 3), futs):
        np.testing.assert_array_equal(fut.result()[0]["y"], np.full((3, 1), 2.0 * i))


async def test_oversized_request_is_split_and_gathered_in_order():
    clock, backend, d = make(BatchingPolicy(max_batch_size=4))
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    fut = d.submit([{"x": x}])
    for _ in range(3):
        await clock.advance(0.010)
    assert backend.sizes() == [4, 4, 2]
    np.testing.assert_array_equal(fut.result()[0]["y"], 2 * x)


async def test_a_split_request_is_gathered_in_row_order_when_its_later_piece_finishes_first():
    """C15's kind: on two slots the batch with the request's last rows can finish before the
    batch with its first rows; the answer is still in row order (it came back rotated)."""
    clock, backend, d = make(BatchingPolicy(max_batch_size=4), slots=2,
                             latency=lambda rows: 0.050 if rows == 4 else 0.010)
    x = np.arange(6, dtype=np.float32).reshape(6, 1)
    fut = d.submit([{"x": x}])
    await clock.advance(0.020)  # rows 4-5 (10 ms) are done, rows 0-3 (50 ms) still run
    assert backend.sizes() == [4, 2] and not fut.done()
    await clock.advance(0.040)
    np.testing.assert_array_equal(fut.result()[0]["y"], 2 * x)


async def test_max_queue_delay_waits_for_more_rows_then_dispatches():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8, max_queue_delay=0.100, adaptive=False))
    d.submit(rows(1))
    await clock.advance(0.020)
    d.submit(rows(2))
    await clock.advance(0.050)
    assert backend.sizes() == []  # 70 ms after the first row: still waiting
    await clock.advance(0.031)  # the oldest row reaches 100 ms
    assert backend.sizes() == [2]
    assert backend.batches[0][0] == pytest.approx(1000.100, abs=1e-9)


async def test_full_batch_dispatches_before_the_queue_delay():
    clock, backend, d = make(BatchingPolicy(max_batch_size=3, max_queue_delay=1.0, adaptive=False))
    for i in range(3):
        d.submit(rows(i))
    await settle()
    assert backend.sizes() == [3]
    assert backend.batches[0][0] == clock.now()


async def test_deadline_sends_a_partial_batch_early():
    # Queue delay 1 s, but a row due in 200 ms: with 10 ms predicted run time the batch must
    # go by t + 200 − 10 ms − the safety margin, not wait the full second.
    clock, backend, d = make(BatchingPolicy(max_batch_size=8, max_queue_delay=1.0, adaptive=False))
    d.latency.observe(1, 0.010)
    d.latency.observe(8, 0.010)
    start = clock.now()
    fut = d.submit(rows(1), deadline=start + 0.200)
    last_start = start + 0.200 - 0.010 - DEADLINE_MARGIN_S
    await clock.advance(last_start - start - 0.005)
    assert backend.sizes() == []
    await clock.advance(0.010)
    assert backend.sizes() == [1]
    assert backend.batches[0][0] == pytest.approx(last_start, abs=1e-9)
    await clock.advance(0.010)
    assert fut.result()[0]["y"][0, 0] == 2.0


async def test_the_deadline_margin_is_a_share_of_a_short_budget():
    # A 20 ms budget: the margin is 25 % of it (5 ms), not the full 10 ms, so a fixed timer can
    # still wait: the batch goes at t + 20 − 2 − 5 ms.
    clock, backend, d = make(BatchingPolicy(max_batch_size=8, max_queue_delay=1.0, adaptive=False))
    d.latency.observe(1, 0.002)
    d.latency.observe(8, 0.002)
    start = clock.now()
    d.submit(rows(1), deadline=start + 0.020)
    last_start = start + 0.020 - 0.002 - DEADLINE_MARGIN_SHARE * 0.020
    await clock.advance(last_start - start - 0.001)
    assert backend.sizes() == []
    await clock.advance(0.002)
    assert backend.sizes() == [1]
    assert backend.batches[0][0] == pytest.approx(last_start, abs=1e-9)


async def test_expired_requests_are_answered_and_never_run():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8), latency=lambda r: 1.0)
    d.submit(rows(0))  # occupies the only slot for 1 s
    await settle()
    doomed = [d.submit(rows(i), deadline=clock.now() + 0.5) for i in (1, 2, 3)]
    kept = d.submit(rows(9), deadline=clock.now() + 5.0)
    await clock.advance(0.5)
    for fut in doomed:
        assert isinstance(fut.exception(), RequestTimeout)
    assert len(d.queue) == 1
    await clock.advance(0.5)
    await clock.advance(1.0)
    assert kept.result()[0]["y"][0, 0] == 18.0
    assert [i for batch in backend.ids() for i in batch] == [0, 9]
    assert d.stats.expired_before_run == 3


async def test_a_deadline_already_too_close_is_refused_at_submit():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    d.latency.observe(1, 0.050)
    with pytest.raises(RequestTimeout):
        d.submit(rows(1), deadline=clock.now() + 0.010)
    assert len(d.queue) == 0


async def test_delay_action_keeps_expired_requests_behind_everything_else():
    delay = BatchingPolicy(max_batch_size=1, default_queue=QueuePolicy(timeout_action=TimeoutAction.DELAY))
    clock, backend, d = make(delay, latency=lambda r: 1.0)
    d.submit(rows(0))
    await settle()
    late = d.submit(rows(1), deadline=clock.now() + 0.5)
    on_time = d.submit(rows(2))
    for _ in range(4):
        await clock.advance(1.0)
    assert late.done() and not late.cancelled() and late.exception() is None
    assert on_time.done() and on_time.exception() is None
    assert [b[0] for b in backend.ids()] == [0, 2, 1]


async def test_cancelled_request_leaves_the_queue_at_once_and_never_runs():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    d.submit(rows(0))
    await settle()
    gone = d.submit(rows(1))
    stays = d.submit(rows(2))
    gone.cancel()
    await settle()
    assert len(d.queue) == 1
    await clock.advance(0.010)
    await clock.advance(0.010)
    assert backend.ids() == [[0], [2]]
    assert stays.result()[0]["y"][0, 0] == 4.0


async def test_priority_then_deadline_then_arrival_order():
    clock, backend, d = make(BatchingPolicy(max_batch_size=1, priority_levels=3, default_priority=2))
    d.submit(rows(0))
    await settle()
    d.submit(rows(1), priority=3)
    d.submit(rows(2))  # default level 2
    d.submit(rows(3), priority=1)
    d.submit(rows(4), priority=2, deadline=clock.now() + 10)
    d.submit(rows(5), priority=1)
    for _ in range(6):
        await clock.advance(0.010)
    assert [b[0] for b in backend.ids()] == [0, 3, 5, 4, 2, 1]


async def test_variable_length_rows_are_padded_and_cut_back():
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    d.submit(rows(0))
    await settle()
    short = d.submit(rows(1, length=2))
    long = d.submit(rows(2, length=5))
    await clock.advance(0.010)
    await clock.advance(0.010)
    (_, batch) = backend.batches[1]
    assert [p["x"].shape for p in batch.parts] == [(1, 2), (1, 5)]
    np.testing.assert_array_equal(short.result()[0]["y"], [[2.0, 2.0]])
    np.testing.assert_array_equal(long.result()[0]["y"], [[4.0, 2.0, 4.0, 6.0, 8.0]])


async def test_engine_failure_fails_only_that_batch_and_the_slot_keeps_serving():
    clock, backend, d = make(
        BatchingPolicy(max_batch_size=8), fail_when=lambda b: any(p["x"][0, 0] == 1 for p in b.parts)
    )
    bad = d.submit(rows(1))
    await settle()
    good = d.submit(rows(2))
    await clock.advance(0.010)
    await clock.advance(0.010)
    assert isinstance(bad.exception(), BackendError)
    assert good.result()[0]["y"][0, 0] == 4.0


def break_once(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make the dispatcher module's ``name`` raise ZeroDivisionError("a bug") on its next call
    (a bug in trtserve's own code), then work again."""
    import trtserve.batching.dispatcher as dispatcher_module

    real = getattr(dispatcher_module, name)
    calls = iter([True])

    def broken_once(*args, **kwargs):
        if next(calls, False):
            raise ZeroDivisionError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatcher_module, name, broken_once)


async def test_a_bug_in_the_dispatch_loop_answers_what_it_held_and_the_loop_serves_on(monkeypatch, caplog):
    """A loop that raises must not leave its callers waiting forever: the queued requests are
    answered INTERNAL naming the error, the running batch still delivers, the failure is logged
    and counted, and the next request is served."""
    clock, backend, d = make(BatchingPolicy(max_batch_size=1))
    running = d.submit(rows(1))
    await settle()
    queued = [d.submit(rows(i)) for i in (2, 3)]
    await settle()
    break_once(monkeypatch, "decide")
    await clock.advance(0.010)  # the running batch returns: the loop's next decision raises
    assert running.result()[0]["y"][0, 0] == 2.0
    for fut in queued:
        with pytest.raises(BackendError, match=r"dispatcher of model failed \(ZeroDivisionError: a bug\)"):
            fut.result()
    assert "the dispatch loop failed" in caplog.text
    assert d.stats.loop_failures == 1
    later = d.submit(rows(5))
    await clock.advance(0.010)
    assert later.result()[0]["y"][0, 0] == 10.0
    await d.aclose()


async def test_a_bug_while_launching_a_batch_answers_its_requests_and_keeps_the_slot(monkeypatch, caplog):
    """A launch that raises after its rows left the queue: those requests are answered INTERNAL
    (not left neither queued nor running), and the slot serves the next request."""
    clock, backend, d = make(BatchingPolicy(max_batch_size=8))
    break_once(monkeypatch, "Batch")
    first = d.submit(rows(1))
    await settle()
    with pytest.raises(BackendError, match="ZeroDivisionError: a bug"):
        first.result()
    assert d.stats.loop_failures == 1 and d.idle_slots == 1
    later = d.submit(rows(2))
    await clock.advance(0.010)
    assert later.result()[0]["y"][0, 0] == 4.0
    await d.aclose()


async def test_full_queue_refuses_without_blocking():
    clock, backend, d = make(BatchingPolicy(max_batch_size=1, default_queue=QueuePolicy(max_queue_size=2)))
    d.submit(rows(0))
    await settle()
    d.submit(rows(1))
    d.submit(rows(2))
    with pytest.raises(QueueFull, match="queue is full"):
        d.submit(rows(3))


async def test_several_slots_run_batches_concurrently():
    clock, backend, d = make(BatchingPolicy(max_batch_size=2), slots=2)
    futs = [d.submit(rows(i)) for i in range(4)]
    await settle()
    assert backend.sizes() == [2, 2]
    assert backend.max_running == 2
    await clock.advance(0.010)
    assert all(f.done() for f in futs)


async def test_close_finishes_queued_work_and_refuses_new():
    clock, backend, d = make(BatchingPolicy(max_batch_size=1))
    futs = [d.submit(rows(i)) for i in range(3)]
    closing = asyncio.ensure_future(d.aclose())
    await settle()
    with pytest.raises(ShuttingDown):
        d.submit(rows(9))
    for _ in range(3):
        await clock.advance(0.010)
    await closing
    assert [f.result()[0]["y"][0, 0] for f in futs] == [0.0, 2.0, 4.0]


async def test_the_hang_warning_says_how_long_the_batch_has_run(caplog):
    """C28: the warning gave the time since the hang limit ("has run one batch for 0.0 s")."""
    clock, _, d = make(BatchingPolicy(max_batch_size=4), latency=lambda r: 100.0)
    d.submit(rows(1))
    await settle()
    await clock.advance(4.0)
    with caplog.at_level("WARNING", logger="trtserve.batching.dispatcher"):
        await clock.advance(8.0)  # past the 10 s hang limit
    (message,) = [r.getMessage() for r in caplog.records if "has run one batch" in r.getMessage()]
    ran = float(message.split("has run one batch for ")[1].split(" s")[0])
    assert 10.0 <= ran <= 12.0, message
    assert "past the hang limit of 10.0 s" in message
    assert d.unhealthy_slots == {0}


async def test_no_deadline_means_no_expiry():
    clock, backend, d = make(BatchingPolicy(max_batch_size=1), latency=lambda r: 100.0)
    d.submit(rows(0))
    await settle()
    waiting = d.submit(rows(1), deadline=math.inf)
    await clock.advance(100.0)
    await clock.advance(100.0)
    assert waiting.result()[0]["y"][0, 0] == 2.0


async def test_a_hung_engine_answers_callers_at_their_deadline_and_marks_the_slot():
    clock, backend, d = make(BatchingPolicy(max_batch_size=4), latency=lambda r: 100.0)
    running = d.submit(rows(1), deadline=clock.now() + 1.0)
    await settle()
    queued = d.submit(rows(2), deadline=clock.now() + 2.0)
    await clock.advance(1.0)
    assert isinstance(running.exception(), RequestTimeout)  # answered while the batch still runs
    assert d.stats.finished_late == 1
    await clock.advance(1.0)
    assert isinstance(queued.exception(), RequestTimeout)  # the model is not wedged
    assert d.healthy
    await clock.advance(9.0)
    assert not d.healthy and d.unhealthy_slots == {0}
    await clock.advance(90.0)  # the engine finally returns
    assert d.healthy
    later = d.submit(rows(3))
    await clock.advance(100.0)
    assert later.result()[0]["y"][0, 0] == 6.0


async def test_a_queue_held_full_by_the_queue_delay_is_full_in_the_hint():
    """A slot idle, the queue at max_queue_size, its batch held by the fixed delay: front ends
    read 'full' from the hint (and refuse before decoding) until the dispatcher looks again."""
    clock, backend, d = make(BatchingPolicy(max_batch_size=8, max_queue_delay=0.100, adaptive=False,
                                            default_queue=QueuePolicy(max_queue_size=1)))
    d.submit(rows(1))
    await clock.advance(0.001)
    assert backend.sizes() == []
    ((level, until),) = d.hint().full
    assert 0 < until - clock.now() <= FULL_HORIZON_S
    await clock.advance(0.100)
    assert backend.sizes() == [1]
    await clock.advance(0.002)
    assert d.hint().full == ()  # the batch ran: room again


async def _bulk_with_small_callers(small_every: float | None) -> tuple[float, list[float], list[int]]:
    """A 2 000-row request at t=0 on a GPU-shaped engine (4 ms + 0.1 ms a row, cap 32), and, with
    ``small_every``, one-row requests of the same priority and no tighter deadline every
    ``small_every`` seconds while it runs. Returns the large request's completion time, each
    small request's wait (answer − arrival) and the batch sizes; seconds."""
    clock, backend, d = make(BatchingPolicy(max_batch_size=32), latency=lambda n: 0.004 + 0.0001 * n)
    answered: dict[int, float] = {}

    def submit(request_id: float, n: int) -> asyncio.Future:
        future = d.submit(rows(request_id, n=n))
        future.add_done_callback(lambda f: answered.setdefault(id(f), clock.now()))
        return future

    start = clock.now()
    big = submit(1.0, 2000)
    small: list[tuple[float, asyncio.Future]] = []
    while not big.done():
        await clock.advance(small_every or 0.010)
        if small_every is not None and not big.done():
            small.append((clock.now(), submit(2.0, 1)))
    await clock.advance(0.100)
    assert all(f.done() for _, f in small)
    return answered[id(big)] - start, [answered[id(f)] - t for t, f in small], backend.sizes()


async def test_a_small_request_does_not_wait_behind_a_large_one():
    """Fair between requests (policy._fill): a one-row request arriving during a 2 000-row
    request of the same priority is answered within about two batch run times of arriving, and
    the large request keeps at least 90 % of its throughput (issue 36, item 2)."""
    alone, _, _ = await _bulk_with_small_callers(None)
    shared, waits, sizes = await _bulk_with_small_callers(0.020)
    full = 0.004 + 0.0001 * 32  # one full batch
    assert len(waits) >= 10
    # The batch running when it came, then its own; one that came while the next full batch was
    # being staged (the running batch's last stage_ahead seconds) runs after that one too.
    assert max(waits) <= 2 * full + stage_ahead(full)
    assert alone / shared >= 0.9
    assert max(sizes) == 32
