"""Staging (``batching/dispatcher.py``): a busy slot's next full batch is handed to its thread
before the running one ends, so the hops between the slot's thread and the event loop do not
idle the engine. On a fake clock with a scripted engine whose every hand-off costs 1.5 ms each
way (the hops measured on 2 busy cores were 2.8–3.3 ms a batch): exact, no real waiting."""

from __future__ import annotations

import pytest

from trtserve.batching.dispatcher import Dispatcher, stage_ahead
from trtserve.config import BatchingPolicy, QueuePolicy, TimeoutAction
from trtserve.testing import FakeBackend, FakeClock, affine, rows, settle

HANDOFF = 0.0015
ENGINE = affine(0.004, 0.0001)  # the GPU-shaped engine of issue 36: 4 ms + 0.1 ms a row
FULL = ENGINE(64)


def make(cap: int = 64) -> tuple[FakeClock, FakeBackend, Dispatcher]:
    clock = FakeClock()
    backend = FakeBackend(clock, latency=ENGINE, handoff=HANDOFF)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=cap), clock=clock)
    d.start()
    return clock, backend, d


async def closed_loop(d: Dispatcher, clock: FakeClock, callers: int, n: int, seconds: float) -> int:
    """``callers`` callers of ``n`` rows, each sending again as soon as it has its answer, for
    ``seconds`` of fake time; returns the answers."""
    answers = 0
    stop = clock.now() + seconds

    def send(caller: int) -> None:
        d.submit(rows(caller, n=n)).add_done_callback(lambda _f: answered(caller))

    def answered(caller: int) -> None:
        nonlocal answers
        answers += 1
        if clock.now() < stop:
            send(caller)

    for caller in range(callers):
        send(caller)
    while clock.now() < stop:
        await clock.advance(0.0005)
    return answers


async def test_a_closed_loop_of_full_batches_keeps_the_engine_busy_through_the_hand_offs():
    """16 callers of 8 rows, cap 64: two full batches of rows in flight. Without staging every
    batch would wait 3 ms of hops after the one before (0.78 of the engine); staged, each starts
    when the one before it ends."""
    clock, backend, d = make()
    answers = await closed_loop(d, clock, callers=16, n=8, seconds=1.0)
    runs = [(start, start + ENGINE(b.rows)) for start, b in backend.batches]
    steady = runs[5:-5]
    gaps = [nxt[0] - end for (_, end), nxt in zip(steady, steady[1:])]
    assert max(gaps) == pytest.approx(0.0)
    assert all(b.rows == 64 for _, b in backend.batches[5:-5])
    busy = sum(end - start for start, end in steady) / (steady[-1][1] - steady[0][0])
    assert busy == pytest.approx(1.0)
    assert answers * 8 >= 0.97 * 1.0 / FULL * 64
    assert d.stats.staged_batches >= len(runs) - 10


async def test_a_staged_batch_short_of_the_cap_takes_the_rows_that_arrive_until_its_run_begins():
    """Staging commits nothing that waiting could make larger: a staged batch stays open, and
    rows arriving before the slot's thread begins it join it; rows arriving after wait for the
    next batch."""
    clock, backend, d = make(cap=16)
    start, _ = await busy_with_a_full_batch(d, clock)
    d.submit(rows(2, n=4))  # a quarter of a batch while the slot is busy
    run = d.latency.predict(8)  # the loop's view: the engine's 4.8 ms and both hops
    await clock.advance(run - stage_ahead(run) + 0.0001)  # past the stage point
    assert d.stats.staged_batches == 1
    assert d.snapshot().queued_rows == 4
    d.submit(rows(3, n=2))
    await settle()
    assert d.snapshot().queued_rows == 6 and not d.queue.entries  # joined the staged batch
    await clock.advance(start + HANDOFF + ENGINE(8) + 0.0001 - clock.now())  # its run has begun
    d.submit(rows(4, n=1))  # too late to join
    await clock.advance(0.05)
    assert backend.ids()[2:] == [[2.0] * 4 + [3.0] * 2, [4.0]]


async def test_a_request_arriving_before_the_stage_point_joins_the_staged_batch():
    """A batch is staged only in the running batch's last :func:`stage_ahead` seconds, so a
    more urgent request arriving before then goes into the next batch, ahead of rows queued
    earlier."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=ENGINE, handoff=HANDOFF)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=8, priority_levels=2, default_priority=2), clock=clock)
    d.start()
    await busy_with_a_full_batch(d, clock)
    queued = [d.submit(rows(2, n=8)) for _ in range(2)]  # two full batches wait
    run = d.latency.predict(8)  # as the loop sees a batch: with the hops
    await clock.advance(run - stage_ahead(run) - 0.0001)  # just before the stage point
    assert d.stats.staged_batches == 0
    urgent = d.submit(rows(9, n=1), priority=1)
    await clock.advance(0.0002)
    assert d.stats.staged_batches == 1
    await clock.advance(0.1)
    assert backend.ids()[2][0] == 9.0  # the staged batch started with the urgent row
    assert urgent.done() and all(f.done() for f in queued)


async def test_admission_counts_a_staged_batch_as_the_slots_work():
    clock, backend, d = make(cap=8)
    await busy_with_a_full_batch(d, clock)
    staged = d.submit(rows(2, n=8))
    run = d.latency.predict(8)
    await clock.advance(run - stage_ahead(run) + 0.0001)
    assert d.stats.staged_batches == 1 and not d.queue.entries
    # The running batch, then the staged one, both ahead of any arrival (at the low estimate):
    # the slot is free when the staged batch's answers are back, the hand-off it skipped not counted.
    wait = d.predict_wait(2, float("inf"), 1)
    while not staged.done():
        await clock.advance(0.0001)
    assert wait.start == pytest.approx(clock.now(), abs=0.0002)


async def test_the_latency_model_keeps_predicting_an_idle_slots_batch_through_a_backlog_of_staged_ones():
    """Staged batches skip the hand-off; admission and the deadline caps decide for batches that
    do not (the first after an idle spell), so the model learns a staged batch's run on the
    slot's thread plus the hand-off measured on the others."""
    clock, backend, d = make()
    await closed_loop(d, clock, callers=16, n=8, seconds=1.0)
    assert d.stats.staged_batches > 50
    assert d.latency.predict(64) == pytest.approx(FULL + 2 * HANDOFF, rel=0.02)


async def test_admission_stays_a_lower_bound_through_a_backlog_of_staged_batches():
    """Each staged batch is counted from the end of the slot's work before it; counted with the
    hand-off it skips, that end would drift a hand-off later per batch (300 ms after a second of
    this closed loop), and a request the server answers in 25 ms would be refused as Overloaded."""
    clock, backend, d = make()
    await closed_loop(d, clock, callers=16, n=8, seconds=1.0)
    assert d.stats.staged_batches > 50
    now = clock.now()
    wait = d.predict_wait(d.policy.level(0), now + 0.060, 8)
    late = d.submit(rows(99, n=8), deadline=now + 0.060)
    while not late.done():
        await clock.advance(0.0001)
    assert late.result()[0]["y"].shape == (8, 1)
    assert wait.finish <= clock.now() <= now + 0.060


async def warmed(d: Dispatcher, clock: FakeClock) -> None:
    """Run one batch of 8 rows (id 0), so the latency model has measured a batch (nothing is
    staged before)."""
    warm = d.submit(rows(0, n=8))
    await clock.advance(0.1)
    assert warm.done()


async def busy_with_a_full_batch(d: Dispatcher, clock: FakeClock):
    """:func:`warmed` (unless the model has measured a batch), then a batch of 8 rows (id 1) on
    the idle slot. Returns when it was handed over and its future."""
    if not d.latency.measured:
        await warmed(d, clock)
    start = clock.now()
    running = d.submit(rows(1, n=8))
    await settle()
    return start, running


async def staged_behind_a_running_batch(d: Dispatcher, clock: FakeClock, *requests):
    """Warm the latency model (unless it is), start one full batch, then queue ``requests``
    (``(id, rows, deadline)``) and advance past the stage point: they wait staged. Returns
    their futures."""
    await busy_with_a_full_batch(d, clock)
    futures = [d.submit(rows(i, n=n), deadline=deadline) for i, n, deadline in requests]
    run = d.latency.predict(8)
    await clock.advance(run - stage_ahead(run) + 0.0001)
    assert d.stats.staged_batches == 1 and not d.queue.entries
    return futures


async def test_a_request_cancelled_while_staged_is_withdrawn_and_its_neighbours_still_run():
    """A staged batch is still waiting: a caller that goes away takes its rows out of it (they
    cost no engine time), the other rows run and are answered. Staged rows count as queued."""
    clock, backend, d = make(cap=8)
    gone, kept = await staged_behind_a_running_batch(d, clock, (2, 4, float("inf")), (3, 4, float("inf")))
    assert (d.snapshot().queued_requests, d.snapshot().queued_rows) == (2, 8)
    gone.cancel()
    await settle()
    assert d.snapshot().queued_rows == 4
    await clock.advance(0.1)
    assert kept.result()[0]["y"].ravel().tolist() == [6.0] * 4
    assert backend.ids()[2] == [3.0] * 4  # the staged batch ran without the cancelled rows
    assert d.stats.batch_sizes[4] == 1


async def test_a_staged_batch_whose_callers_all_left_is_skipped_and_frees_its_slot():
    clock, backend, d = make(cap=8)
    (gone,) = await staged_behind_a_running_batch(d, clock, (2, 8, float("inf")))
    gone.cancel()
    await clock.advance(0.05)
    assert len(backend.batches) == 2  # the warm-up and the running batch: the staged one never started
    assert d.idle_slots == 1 and d.snapshot().queued_rows == 0
    after = d.submit(rows(4, n=1))
    await clock.advance(0.05)
    assert after.done() and backend.ids()[-1] == [4.0]


async def staged_behind_a_stall(policy: BatchingPolicy):
    """After a warm-up, the running batch stalls for a second (the engine takes 1 s) with a
    request of 8 rows and a deadline 50 ms away staged behind it. Returns (clock, backend,
    dispatcher, that request's future)."""
    clock = FakeClock()
    slow = {"on": False}
    backend = FakeBackend(clock, latency=lambda b: 1.0 if slow["on"] else ENGINE(b), handoff=HANDOFF)
    d = Dispatcher(backend, policy, clock=clock)
    d.start()
    await warmed(d, clock)
    slow["on"] = True
    (late,) = await staged_behind_a_running_batch(d, clock, (2, 8, clock.now() + 0.05))
    return clock, backend, d, late


async def test_a_deadline_passed_while_staged_behind_a_slow_batch_answers_not_run():
    """The running batch takes a second (a stalled engine); the staged request's deadline, 50 ms
    away, passes while it waits: DEADLINE_EXCEEDED saying it was not run, counted as expired
    before its run, and the batch of it is skipped when the slot is back."""
    clock, backend, d, late = await staged_behind_a_stall(BatchingPolicy(max_batch_size=8))
    await clock.advance(0.05)
    assert late.done()
    with pytest.raises(Exception, match="it was not run"):
        late.result()
    assert d.stats.expired_before_run == 1 and d.stats.finished_late == 0
    await clock.advance(2.5)
    assert all(2.0 not in ids for ids in backend.ids())  # its batch never started
    assert d.idle_slots == 1


async def test_under_delay_a_deadline_passed_while_staged_still_runs_and_is_answered():
    """TimeoutAction.DELAY answers no timeout: a request whose deadline passes while its rows wait
    staged behind a stalled batch runs when the slot is back, as a queued one would."""
    delay = BatchingPolicy(max_batch_size=8, default_queue=QueuePolicy(timeout_action=TimeoutAction.DELAY))
    clock, backend, d, late = await staged_behind_a_stall(delay)
    await clock.advance(0.05)
    assert not late.done()
    await clock.advance(2.5)
    assert late.result()[0]["y"].ravel().tolist() == [4.0] * 8
    assert d.stats.expired_before_run == 0 and d.stats.finished_late == 0


async def test_rows_arriving_after_a_withdrawn_batch_was_skipped_are_not_taken_into_it():
    """The staged batch lost every row to a cancel; the slot's thread skipped it, and the loop
    learns so a hop later. A request arriving in that hop must wait for a batch that runs, not
    join the skipped one (where it would never run nor be answered)."""
    clock, backend, d = make(cap=16)
    start, running = await busy_with_a_full_batch(d, clock)
    gone = d.submit(rows(2, n=4))
    run = d.latency.predict(8)
    await clock.advance(run - stage_ahead(run) + 0.0001)
    assert d.stats.staged_batches == 1
    gone.cancel()
    await settle()
    await clock.advance(start + HANDOFF + ENGINE(8) + 0.0002 - clock.now())  # skipped; the loop not told yet
    late = d.submit(rows(3, n=2))
    await clock.advance(0.1)
    assert running.done() and late.result()[0]["y"].ravel().tolist() == [6.0, 6.0]


async def test_rows_join_a_staged_batch_as_they_arrive_without_a_decision_of_the_loop(monkeypatch):
    """Joining costs the arrival a top-up, not a wake-up and decision of the loop: on a
    CPU-bound server a decision per arrival cost the 1-row closed loop a fifth of its rows/s."""
    import trtserve.batching.dispatcher as dispatcher_module

    clock, backend, d = make(cap=64)
    await busy_with_a_full_batch(d, clock)
    d.submit(rows(2, n=1))
    run = d.latency.predict(8)
    await clock.advance(run - stage_ahead(run) + 0.0001)
    assert d.stats.staged_batches == 1
    decisions = []
    real = dispatcher_module.decide
    monkeypatch.setattr(dispatcher_module, "decide", lambda *a, **k: decisions.append(1) or real(*a, **k))
    for i in range(3, 13):
        d.submit(rows(i, n=1))
        await settle()
    assert not d.queue.entries and d.snapshot().queued_rows == 11  # all joined
    assert decisions == []
    await clock.advance(0.1)
    assert backend.ids()[2] == [float(i) for i in range(2, 13)]
