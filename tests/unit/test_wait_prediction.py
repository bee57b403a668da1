"""The wait prediction that admission and the front ends refuse on (batching/wait.py, and the
hint's refusal in ipc/admission.py): pure functions of the queue, the slots' free times and a
latency model, no event loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtserve.batching.latency import LatencyModel
from trtserve.batching.queue import QueueEntry, RequestQueue
from trtserve.batching.wait import FULL_HORIZON_S, batch_floor, deadline_batch, fill, predict, queue_hint
from trtserve.config import BatchingPolicy, QueuePolicy
from trtserve.errors import DeadlineUnmeetable, Overloaded, QueueFull
from trtserve.ipc.admission import Ask, QueueHint, admit, shed


def affine(a: float = 0.010, b: float = 0.001, cap: int = 8) -> LatencyModel:
    """A latency model that measured a + b·rows seconds at every power of two up to ``cap``."""
    model = LatencyModel()
    rows = 1
    while rows <= cap:
        model.observe(rows, a + b * rows)
        rows *= 2
    return model


def entry(rows: int, priority: int = 1, deadline: float = math.inf) -> QueueEntry:
    return QueueEntry([{"x": np.zeros((rows, 1), np.float32)}], priority, priority, deadline, 0.0, None)


@pytest.mark.parametrize(
    "free_at, work, expected",
    [
        ([0.0], 0.5, 0.5),  # one slot: work after work
        ([0.0, 0.0], 1.0, 0.5),  # two idle slots share it
        ([0.0, 1.0], 0.5, 0.5),  # the second slot frees too late to help
        ([0.0, 1.0], 3.0, 2.0),  # ... then it does: 2 s on the first, 1 s on the second
        ([2.0, 2.0, 2.0], 0.0, 2.0),  # nothing to do: the first free slot
    ],
)
def test_fill_spreads_work_over_the_slots_as_they_free(free_at, work, expected):
    assert fill(free_at, work) == pytest.approx(expected)


def test_only_rows_at_the_same_or_a_more_urgent_level_with_an_earlier_deadline_are_ahead():
    latency = affine()
    queue = [entry(8, 1, 5.0), entry(8, 2, 1.0), entry(8, 2, 3.0), entry(8, 2, 9.0)]
    full = batch_floor(latency, 8, 1)
    assert full == pytest.approx(0.018)
    wait = predict(queue, 2, 4.0, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert wait.start == pytest.approx(3 * full)  # level 1, and the two of level 2 due sooner
    assert wait.finish == pytest.approx((3 * 8 + 1) * full / 8)  # its row at the full-batch rate
    urgent = predict(queue, 1, 0.5, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert urgent.start == 0.0 and urgent.finish == pytest.approx(latency.lower_bound(1))
    whole = predict(queue, math.inf, math.inf, 0, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert whole.start == pytest.approx(4 * full)


def test_running_batches_delay_the_start_and_the_request_needs_a_batch_of_its_own_rows():
    latency = affine()
    wait = predict([], 1, math.inf, 4, 1, now=10.0, free_at=[10.5], cap=8, latency=latency)
    assert wait.start == 10.5
    assert wait.finish == pytest.approx(10.5 + latency.lower_bound(4))
    assert wait.alone == pytest.approx(10.0 + latency.lower_bound(4))


@pytest.mark.parametrize(
    "deadline, expected",
    [
        (0.005, DeadlineUnmeetable),  # below one batch of its row even on an idle server
        (0.05, Overloaded),  # an idle server makes it (11 ms), this queue does not (5 x 18 ms)
        (0.2, None),
    ],
)
def test_the_refusal_says_which_limit_the_deadline_misses(deadline, expected):
    latency = affine()
    wait = predict([entry(8)] * 5, 1, math.inf, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    refusal = wait.refusal(deadline)
    assert type(refusal) is expected if expected else refusal is None
    if expected is Overloaded:
        assert f"predicted queue wait {5 * 18.0:.1f} ms" in str(refusal) and "remaining 50.0 ms" in str(refusal)


@pytest.mark.parametrize("budget, expected", [(math.inf, 8), (0.030, 8), (0.025, 4), (0.0225, 1), (0.001, 1)])
def test_the_deadline_caps_the_batch_a_queue_drains_in(budget, expected):
    # 10 ms + 1 ms per row: p(n) + p(1) <= budget  <=>  n <= (budget - 0.021) / 0.001
    assert deadline_batch(affine(), 8, 1, budget) == expected


def test_rows_ahead_at_its_level_drain_in_the_batches_that_leave_a_tight_request_time():
    latency = affine()
    ahead = [entry(1, 1, 0.024) for _ in range(8)]
    # Due in 25 ms, each batch ahead of it may take 25 - 11 = 14 ms: 4 rows, 3.5 ms a row.
    wait = predict(ahead, 1, 0.025, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert wait.start == pytest.approx(8 * 0.014 / 4)  # not 8 x 18 / 8 ms at the full-batch rate
    assert wait.finish == pytest.approx(8 * 0.014 / 4 + 0.018 / 8)  # its own row at the full rate
    assert isinstance(wait.refusal(0.025), Overloaded)  # the full-batch rate would admit it (20.25 ms)
    # With 30 ms to go, one full batch ahead (18 ms) still leaves it a batch of one: admitted.
    assert predict(ahead, 1, 0.030, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency).refusal(0.030) is None
    # Rows of a more urgent level are not capped for it.
    urgent = [entry(1, 0, 0.024) for _ in range(8)]
    assert predict(urgent, 1, 0.025, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency).start == pytest.approx(0.018)


def test_a_request_alone_is_not_capped_by_its_own_deadline():
    # 8 rows due in 25 ms on an idle server: one batch of 8 takes 18 ms.
    wait = predict([], 1, 0.025, 8, 1, now=0.0, free_at=[0.0], cap=8, latency=affine())
    assert wait.finish == pytest.approx(0.018) and wait.refusal(0.025) is None


def test_a_request_of_more_rows_than_measured_is_not_refused_on_an_extrapolation():
    latency = LatencyModel()
    latency.observe(1, 0.2)  # only batches of one measured: 200 ms
    wait = predict([], 1, 1.0, 8, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert wait.alone == pytest.approx(0.2)  # at least a batch of one's time, not 8 x 200 ms
    assert wait.refusal(1.0) is None


def test_one_measurement_is_not_scaled_up_in_proportion_to_rows():
    latency = LatencyModel()
    latency.observe(1, 0.2)  # one batch of one: 200 ms
    assert latency.lower_bound(8) == pytest.approx(1.6)  # the latency model's proportional guess
    assert batch_floor(latency, 8, 1) == pytest.approx(0.2)  # a full batch takes at least as long


def test_a_hint_refuses_what_the_queue_cannot_serve_in_time():
    latency = affine()
    policy = BatchingPolicy(max_batch_size=8)
    queue = RequestQueue()
    for e in (entry(8, 0, 1.0), entry(8, 0, 2.0), entry(8, 0, 3.0)):
        queue.push(e)
    hint = queue_hint(queue, policy, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert [p[2] for p in hint.points] == pytest.approx([0.018, 0.036, 0.054])
    assert hint.min_run == pytest.approx(0.011)
    assert hint.refusal("m", Ask(0, None, 2.5), 0.0) is None  # behind two entries: 36 ms, then 11 ms
    assert hint.refusal("m", Ask(0, None, 0.04), 0.0) is None  # due first (earliest deadline): nothing ahead
    assert isinstance(hint.refusal("m", Ask(0, 0.005, math.inf), 0.0), DeadlineUnmeetable)
    # Behind an entry due at 3 s whose rows are done at 3.2 s at the earliest:
    crowded = QueueHint(0.011, policy, 0.0, ((0, 3.0, 3.2),))
    refusal = crowded.refusal("m", Ask(0, None, 3.1), 0.0)
    assert isinstance(refusal, Overloaded)
    assert "the model 'm' is overloaded: predicted queue wait 3200.0 ms" in str(refusal)
    assert crowded.refusal("m", Ask(0, None, 3.1), 3.15) is not None  # as it ages it still holds...
    assert crowded.refusal("m", Ask(0, None, 3.5), 3.15) is None  # ... and lets through what now fits


def test_a_hint_says_how_long_a_full_queue_stays_full():
    latency = affine()
    policy = BatchingPolicy(max_batch_size=8, default_queue=QueuePolicy(max_queue_size=2))
    queue = RequestQueue()
    for e in (entry(1, 0, 5.0), entry(1, 0, 6.0)):
        queue.push(e, 2)
    busy = queue_hint(queue, policy, now=0.0, free_at=[0.3], cap=8, latency=latency)
    assert busy.full == ((0, 0.3),)
    assert isinstance(busy.refusal("m", Ask(0, None, math.inf), 0.1), QueueFull)
    assert busy.refusal("m", Ask(0, None, math.inf), 0.31) is None  # a batch started since: room again
    idle = queue_hint(queue, policy, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert idle.full == ()
    # A slot idle while the dispatcher holds the batch (a fixed queue delay ending at 2 ms):
    # full until then, and never more than FULL_HORIZON_S ahead.
    held = queue_hint(queue, policy, now=0.0, free_at=[0.0], cap=8, latency=latency, next_look=0.002)
    assert held.full == ((0, 0.002),)
    assert isinstance(held.refusal("m", Ask(0, None, math.inf), 0.001), QueueFull)
    later = queue_hint(queue, policy, now=0.0, free_at=[0.0], cap=8, latency=latency, next_look=1.0)
    assert later.full == ((0, FULL_HORIZON_S),)


def test_with_a_slot_idle_a_level_with_room_keeps_the_hint_from_saying_full():
    latency = affine()
    policy = BatchingPolicy(max_batch_size=8, priority_levels=2, default_priority=1,
                            priority_queues={1: QueuePolicy(max_queue_size=1)})
    queue = RequestQueue()
    queue.push(entry(1, 1, 5.0), 1)
    queue.push(entry(1, 2, 5.0))  # level 2 is unbounded: a request there may start a batch any time
    hint = queue_hint(queue, policy, now=0.0, free_at=[0.0], cap=8, latency=latency, next_look=0.002)
    assert hint.full == ()


def test_without_a_hint_only_a_deadline_already_passed_is_refused():
    assert isinstance(shed(None, "m", Ask(0, None, 1.0), 1.5), DeadlineUnmeetable)
    assert isinstance(shed(None, "m", Ask(0, 0.0, math.inf), 1.5), DeadlineUnmeetable)
    assert shed(None, "m", Ask(0, 0.1, math.inf), 1.5) is None


def test_the_timeout_parameter_counts_from_when_the_front_end_read_the_request():
    # Read at 1.0 with a 100 ms timeout, checked at 1.15 (after the handler's pre-processing,
    # say): already late, with or without a hint; counted from the check it would pass.
    assert isinstance(shed(None, "m", Ask(0, 0.1, math.inf, 1.0), 1.15), DeadlineUnmeetable)
    hint = QueueHint(0.001, BatchingPolicy(), 0.0)
    assert isinstance(hint.refusal("m", Ask(0, 0.1, math.inf, 1.0), 1.15), DeadlineUnmeetable)
    assert hint.refusal("m", Ask(0, 0.1, math.inf), 1.15) is None
    assert admit(BatchingPolicy(), Ask(0, 0.1), 1.0)[1] == pytest.approx(1.1)


def test_behind_a_queue_admission_reads_the_slow_end_and_an_idle_server_the_fast_end():
    """A noisy engine: batches of one take 10 ms at the fast end, 30 ms typically. Behind a
    queue the request must finish in time at the slow end (else the admitted queue is only
    served in time by fast runs); on an idle server the fast end decides, as before."""
    model = LatencyModel()
    for seconds in (0.010, 0.030, 0.030, 0.030, 0.030, 0.030, 0.030, 0.030):
        model.observe(1, seconds)
    assert model.lower_bound(1) < 0.014
    assert model.spread(1) > 2.0
    idle = predict([], 1, 0.015, 1, 1, now=0.0, free_at=[0.0], cap=1, latency=model)
    assert idle.refusal(0.015) is None  # a fast run makes it: admitted
    queued = predict([entry(1, deadline=0.030)], 1, 0.040, 1, 1, now=0.0, free_at=[0.0], cap=1, latency=model)
    assert queued.start == pytest.approx(model.lower_bound(1) * model.spread(1), rel=1e-6)  # 2 x mean - low
    assert isinstance(queued.refusal(0.040), Overloaded)  # two fast runs would fit 40 ms, typical ones not
    assert queued.refusal(queued.finish) is None


def test_the_spread_is_none_on_a_noiseless_engine_and_bounded_after_a_fast_outlier():
    model = affine()
    assert model.spread(1) == model.spread(8) == 1.0
    model = LatencyModel()
    model.observe(1, 1e-4)  # an instant warm-up, then 200 ms batches: the low estimate lags far behind
    model.observe(1, 1e-4)
    for _ in range(10):
        model.observe(1, 0.2)
    assert model.lower_bound(1) < model.predict(1) / 5
    assert model.spread(1) == 3.0  # the latency model's clip, not (2 x mean - low) / low


def test_a_large_request_ahead_at_the_same_level_counts_half_a_batch():
    """A request larger than the cap shares each batch with the requests behind it (policy._fill),
    so admission behind it counts half a batch of its rows, not all of them: a one-row request
    due in 1 s behind 2 000 queued rows due then too (4.5 s of work) is admitted; behind the same
    rows at a more urgent level it is refused."""
    latency = affine()
    bulk = entry(2000, 1, 1.0)
    same = predict([bulk], 1, 1.0, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert same.start == pytest.approx(4 * batch_floor(latency, 8, 1) / 8) and same.refusal(1.0) is None
    behind = predict([bulk], 2, 1.0, 1, 1, now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert isinstance(behind.refusal(1.0), Overloaded)
    queue = RequestQueue()
    queue.push(bulk)
    hint = queue_hint(queue, BatchingPolicy(max_batch_size=8), now=0.0, free_at=[0.0], cap=8, latency=latency)
    assert hint.refusal("m", Ask(0, None, 1.0), 0.0) is None
