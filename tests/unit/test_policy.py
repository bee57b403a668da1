"""The dispatch decision, table-driven: :func:`trtserve.batching.policy.decide` on hand-built
queues, with no event loop, no clock and no dispatcher.

Every table row is one scenario: the queue, the :class:`Inputs`, the policy, the latency model
and the :class:`Decision` expected (which entries expire, which (entry, rows) form the batch in
which order, and ``wake_at``). The tables follow the rules of ``policy.py``'s docstring and
DESIGN.md's "Dispatch policy".

Times are multiples of ``U = 2**-10`` s (about 1 ms) around ``NOW = 100.0``, and latency models are
seeded with one first observation per (rows, length) bucket, so predictions, deadlines and
wake times are exact floats: a boundary row really sits on the boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import (
    DEADLINE_MARGIN_S,
    DEADLINE_MARGIN_SHARE,
    URGENT_RUNS,
    Decision,
    Inputs,
    decide,
    ends_hold,
    margin,
    top_up,
)
from trtserve.batching.queue import QueueEntry
from trtserve.config import BatchingPolicy, QueuePolicy, TimeoutAction

U = 2.0**-10
NOW = 100.0


# -- building blocks ------------------------------------------------------------------------


class _Unresolved:
    """Stands in for the caller's future: decide() never reads it (it only orders, expires and
    selects), and an asyncio.Future would need an event loop."""

    def done(self) -> bool:
        return False


@dataclass(frozen=True)
class E:
    """A queue entry to build: name, rows, absolute deadline and arrival, priority, row length."""

    name: str
    rows: int = 1
    deadline: float = math.inf
    arrival: float = NOW
    priority: int = 1
    length: int = 1
    level: int | None = None  # admitted level; defaults to ``priority`` (differs once DELAYed)

    def build(self) -> QueueEntry:
        segment = {"x": np.zeros((self.rows, self.length), np.float32)}
        level = self.priority if self.level is None else self.level
        return QueueEntry([segment], level, self.priority, self.deadline, self.arrival, _Unresolved())


def affine(a: float, b: float, lengths: tuple[int, ...] = (1,)) -> Callable[[], LatencyModel]:
    """A model that predicts exactly ``(a + b·rows)·U`` at each of ``lengths`` (powers of two):
    one first observation at rows 1 and 8 each; interpolation and the extrapolated slope are
    exact on dyadic numbers."""

    def make() -> LatencyModel:
        m = LatencyModel()
        for length in lengths:
            m.observe(1, (a + b) * U, length)
            m.observe(8, (a + 8 * b) * U, length)
        return m

    return make


def points(*rows_seconds: tuple[int, float], length: int = 1) -> Callable[[], LatencyModel]:
    """A model through the given (rows, seconds) centroids, each a first observation."""

    def make() -> LatencyModel:
        m = LatencyModel()
        for r, s in rows_seconds:
            m.observe(r, s, length)
        return m

    return make


def noisy_low() -> LatencyModel:
    """Batch of one measured at 10U, then once at 30U: mean 14U, low estimate 10.4U."""
    m = LatencyModel()
    m.observe(1, 10 * U)
    m.observe(1, 30 * U)
    assert m.predict(1) == pytest.approx(14 * U) and m.lower_bound(1) == pytest.approx(10.4 * U)
    return m


LAT = affine(9, 1)  # p(n) = (9 + n)·U: p(1) = 10U, p(2) = 11U, p(8) = 17U
# A curve that dips after one row (p(1) = 16U, p(n ≥ 2) = 8U).
DIP = points((1, 16 * U), (2, 8 * U))

GO = BatchingPolicy(max_batch_size=8, adaptive=False)  # fixed timer, max_queue_delay 0: never waits
TIMER = BatchingPolicy(max_batch_size=8, adaptive=False, max_queue_delay=1.0)
ADAPT = BatchingPolicy(max_batch_size=8)  # adaptive, no max_queue_delay bound
LEVELS = BatchingPolicy(max_batch_size=8, adaptive=False, priority_levels=3, default_priority=1, priority_aging=0.5)


def inputs(free_slots: int = 1, slots: int = 1, arrival_rate: float = 0.0, cap: int = 8, now: float = NOW) -> Inputs:
    return Inputs(now, free_slots, slots, arrival_rate, cap)


class After:
    """Expected ``wake_at``: any time strictly after ``t`` (where the rules fix no exact time)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and other > self.t

    def __repr__(self) -> str:
        return f"After({self.t})"


@dataclass(frozen=True)
class Row:
    queue: tuple[E, ...]
    expired: tuple[str, ...] = ()
    batch: tuple[tuple[str, int], ...] = ()
    wake_at: float | After | None = None
    inputs: Inputs = field(default_factory=inputs)
    policy: BatchingPolicy = GO
    latency: Callable[[], LatencyModel] = LAT


def row(name: str, *queue: E, marks=(), **kw) -> object:
    """One table row: a pytest.param with id ``name``."""
    return pytest.param(Row(tuple(queue), **kw), id=name, marks=marks)


def run(r: Row) -> tuple[Decision, dict[int, str]]:
    built = [e.build() for e in r.queue]  # seq follows the listing: list ties in arrival order
    entries = sorted(built, key=lambda e: e.key)  # RequestQueue's invariant
    names = {id(q): e.name for q, e in zip(built, r.queue)}
    return decide(entries, r.inputs, r.policy, r.latency()), names


def check(r: Row) -> None:
    d, names = run(r)
    got = (
        tuple(names[id(e)] for e in d.expired),
        tuple((names[id(e)], n) for e, n in d.batch),
        d.wake_at,
    )
    wake = r.wake_at if r.wake_at is None or isinstance(r.wake_at, After) else pytest.approx(r.wake_at, abs=1e-12)
    assert got == (r.expired, r.batch, wake)


# -- 1. expire --------------------------------------------------------------------------------

REJECT_1_DELAY_2 = BatchingPolicy(
    max_batch_size=8, adaptive=False, priority_levels=2, default_priority=1,
    priority_queues={
        1: QueuePolicy(timeout_action=TimeoutAction.REJECT),
        2: QueuePolicy(timeout_action=TimeoutAction.DELAY),
    },
)



def _per_length() -> LatencyModel:
    """LAT at length 1; (39 + n)·U at length 64."""
    m = LAT()
    m.observe(1, 40 * U, 64)
    m.observe(8, 47 * U, 64)
    return m


EXPIRY = [
    row("deadline-before-last-start-expires", E("a", deadline=NOW + 9 * U), E("b"),
        expired=("a",), batch=(("b", 1),)),
    row("reject-and-delay-levels-are-both-returned-expired",
        E("a", deadline=NOW + 5 * U, priority=1), E("b", deadline=NOW + 5 * U, priority=2),
        E("c", deadline=NOW + 100 * U, priority=2),
        policy=REJECT_1_DELAY_2, expired=("a", "b"), batch=(("c", 1),)),
    row("a-delayed-entry-never-expires-and-runs-last",  # DELAY moved it to level 3, deadline inf
        E("late", arrival=NOW - 0.25, priority=3, level=2), E("fresh", priority=1),
        policy=REJECT_1_DELAY_2, batch=(("fresh", 1), ("late", 1))),
    row("no-deadline-never-expires", E("a", arrival=NOW - 1e6), batch=(("a", 1),)),
    row("exactly-at-last-start-with-a-free-slot-runs", E("a", deadline=NOW + 10 * U),
        batch=(("a", 1),)),
    row("a-row-left-out-at-exactly-its-last-start-expires",  # alone it would start now; in b, c's batch it is late
        E("tight", deadline=NOW + 10 * U), E("b"), E("c"), expired=("tight",), batch=(("b", 1), ("c", 1))),
    row("exactly-at-last-start-without-a-free-slot-expires", E("a", deadline=NOW + 10 * U),
        inputs=inputs(free_slots=0), expired=("a",)),
    row("just-before-last-start-without-a-free-slot-waits-for-it", E("a", deadline=NOW + 11 * U),
        inputs=inputs(free_slots=0), wake_at=NOW + U),
    row("last-start-is-per-length",  # length 64 runs 40U alone, length 1 10U
        E("short", deadline=NOW + 30 * U), E("long", deadline=NOW + 30 * U, length=64),
        latency=_per_length, expired=("long",), batch=(("short", 1),)),
    row("expiry-uses-the-low-estimate-not-the-mean",  # mean 14U would expire it; low 10.4U does not
        E("a", deadline=NOW + 12 * U), latency=noisy_low, batch=(("a", 1),)),
    row("an-unmeasured-length-is-not-scaled-up-for-expiry",  # predict would say 640U
        E("a", deadline=NOW + 20 * U, length=64), batch=(("a", 1),)),
    row("unmeasured-model-expires-only-past-deadlines",
        E("a", deadline=NOW - U), E("b", deadline=NOW), latency=LatencyModel,
        expired=("a",), batch=(("b", 1),)),
]


@pytest.mark.parametrize("r", EXPIRY)
def test_expire(r: Row) -> None:
    check(r)


# -- 2. select: order ---------------------------------------------------------------------------

ORDER = [
    row("priority-first", E("low", priority=2), E("high", priority=1), policy=LEVELS,
        batch=(("high", 1), ("low", 1))),
    row("then-deadline", E("none"), E("soon", deadline=NOW + 100 * U), E("later", deadline=NOW + 200 * U),
        batch=(("soon", 1), ("later", 1), ("none", 1))),
    row("then-arrival", E("first", arrival=NOW - U), E("second"), batch=(("first", 1), ("second", 1))),
    row("priority-beats-an-earlier-deadline",
        E("low-urgent", priority=2, deadline=NOW + 50 * U), E("high", priority=1), policy=LEVELS,
        batch=(("high", 1), ("low-urgent", 1))),
    row("cap-one-takes-the-most-urgent", E("low", priority=3), E("mid", priority=2), E("high", priority=1),
        policy=LEVELS, inputs=inputs(cap=1), batch=(("high", 1),)),
    row("aged-request-goes-ahead-of-every-level",  # priority_aging 0.5 s
        E("old-low", priority=3, arrival=NOW - 0.75), E("high", priority=1), policy=LEVELS,
        batch=(("old-low", 1), ("high", 1))),
    row("aged-requests-in-arrival-order",
        E("oldest-low", priority=3, arrival=NOW - 0.875), E("old-mid", priority=2, arrival=NOW - 0.75),
        E("high", priority=1), policy=LEVELS,
        batch=(("oldest-low", 1), ("old-mid", 1), ("high", 1))),
    row("aging-starts-exactly-at-priority-aging", E("low", priority=3, arrival=NOW - 0.5), E("high", priority=1),
        policy=LEVELS, inputs=inputs(cap=1), batch=(("low", 1),)),
    row("just-under-priority-aging-keeps-its-level", E("low", priority=3, arrival=NOW - 0.5 + U),
        E("high", priority=1), policy=LEVELS, inputs=inputs(cap=1), batch=(("high", 1),)),
    row("a-delayed-request-does-not-age-ahead-of-live-ones",
        # DELAYed (level 1 → lowest, 4; no deadline), queued long enough to count as aged.
        # TimeoutAction.DELAY: "behind every other request; it runs when nothing else waits".
        E("delayed", priority=LEVELS.lowest_priority, level=1, arrival=NOW - 0.75), E("fresh", priority=2),
        policy=LEVELS, inputs=inputs(cap=1), batch=(("fresh", 1),)),
]


@pytest.mark.parametrize("r", ORDER)
def test_selection_order(r: Row) -> None:
    check(r)


# -- 2. select: the batch cap and splitting --------------------------------------------------------

CAP = [
    row("fills-up-to-the-cap-splitting-the-last-request", E("a", rows=3), E("b", rows=3), E("c", rows=3),
        batch=(("a", 3), ("b", 3), ("c", 2))),
    row("an-oversized-request-is-split", E("big", rows=10), inputs=inputs(cap=4), batch=(("big", 4),)),
    # Fair between requests (policy._fill): a request larger than the cap shares the batch.
    row("a-later-small-request-joins-an-oversized-one-at-once", E("big", rows=10), E("small"),
        inputs=inputs(cap=4), batch=(("big", 3), ("small", 1))),
    row("an-oversized-request-keeps-half-of-the-batch-while-others-wait",
        E("big", rows=10), E("s1"), E("s2"), E("s3"), E("s4"), inputs=inputs(cap=4),
        batch=(("big", 2), ("s1", 1), ("s2", 1))),
    row("an-oversized-request-alone-fills-the-batch", E("big", rows=10), inputs=inputs(cap=4), batch=(("big", 4),)),
    row("a-more-urgent-level-is-not-shared", E("big", rows=10, priority=1), E("small", priority=2),
        policy=LEVELS, inputs=inputs(cap=4), batch=(("big", 4),)),
    # Near its deadline (within URGENT_RUNS full batches: 2·p(4) = 26U) the large request comes first, whole.
    row("an-oversized-request-near-its-deadline-is-not-shared", E("big", rows=10, deadline=NOW + 26 * U), E("small"),
        inputs=inputs(cap=4), latency=LAT, batch=(("big", 4),)),
    row("an-oversized-request-far-from-its-deadline-shares", E("big", rows=10, deadline=NOW + 1000 * U), E("small"),
        inputs=inputs(cap=4), latency=LAT, batch=(("big", 3), ("small", 1))),
    row("the-cap-comes-from-inputs-not-max-batch-size", E("a"), E("b"), E("c"), inputs=inputs(cap=2),
        batch=(("a", 1), ("b", 1))),
]


@pytest.mark.parametrize("r", CAP)
def test_batch_cap(r: Row) -> None:
    check(r)


# -- 2. select: length bucketing ------------------------------------------------------------------

# The same run time at every length measured (4, 8, 64): bucketing is about padding, and the
# urgency horizon is URGENT_RUNS · p(cap) = 2 · 11U = 22U at cap 2.
FLAT_LENGTHS = affine(9, 1, lengths=(4, 8, 64))
CAP2 = inputs(cap=2)
assert URGENT_RUNS == 2.0

BUCKETING = [
    row("closest-length-joins-the-head", E("a", length=4), E("b", length=64), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("c", 1))),
    row("off-keeps-queue-order", E("a", length=4), E("b", length=64), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS,
        policy=BatchingPolicy(max_batch_size=8, adaptive=False, length_bucketing=False),
        batch=(("a", 1), ("b", 1))),
    row("not-when-everything-fits", E("a", length=4), E("b", length=64), E("c", length=4),
        inputs=inputs(cap=3), latency=FLAT_LENGTHS, batch=(("a", 1), ("b", 1), ("c", 1))),
    row("distance-is-in-powers-of-two", E("a", length=5), E("b", length=8), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("c", 1))),  # 5 and 4 share a bucket, 8 does not
    row("one-power-of-two-bucket-is-one-distance", E("a", length=5), E("b", length=7), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("b", 1))),  # 4, 5, 7: a tie, so queue order
    row("ties-keep-queue-order", E("a", length=4), E("b", length=64), E("c", length=8), E("d", length=8),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("c", 1))),
    row("priority-before-length", E("a", length=4), E("b", length=64), E("c", length=4, priority=2),
        policy=LEVELS, inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("b", 1))),
    # The head (a) is the most urgent; b's length is far from it, c's is the head's.
    row("an-urgent-row-is-never-passed-over",
        E("a", length=4, deadline=NOW + 15 * U), E("b", length=64, deadline=NOW + 20 * U), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("b", 1))),
    row("urgent-at-exactly-urgent-runs-times-p-cap",
        E("a", length=4, deadline=NOW + 15 * U), E("b", length=64, deadline=NOW + 22 * U), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("b", 1))),
    row("just-past-the-horizon-is-not-urgent",
        E("a", length=4, deadline=NOW + 15 * U), E("b", length=64, deadline=NOW + 23 * U), E("c", length=4),
        inputs=CAP2, latency=FLAT_LENGTHS, batch=(("a", 1), ("c", 1))),
    row("aged-rows-join-before-fresh-higher-priority-ones",
        # Aging puts a request "ahead of every priority level": bucketing may choose among equal
        # lengths, but must not hand the aged request's place to a fresh priority-1 one.
        E("old-a", priority=2, length=4, arrival=NOW - 0.875), E("old-b", priority=2, length=4, arrival=NOW - 0.75),
        E("fresh", priority=1, length=4), E("long", priority=1, length=64),
        policy=LEVELS, inputs=CAP2, latency=FLAT_LENGTHS, batch=(("old-a", 1), ("old-b", 1))),
    row("aged-rows-are-length-bucketed-among-themselves",
        E("old-a", priority=2, length=4, arrival=NOW - 0.875),
        E("old-long", priority=2, length=64, arrival=NOW - 0.8125),
        E("old-b", priority=3, length=4, arrival=NOW - 0.75), E("fresh", priority=1, length=4),
        policy=LEVELS, inputs=CAP2, latency=FLAT_LENGTHS, batch=(("old-a", 1), ("old-b", 1))),
]


@pytest.mark.parametrize("r", BUCKETING)
def test_length_bucketing(r: Row) -> None:
    check(r)


# -- 2. select: rows that would finish late -------------------------------------------------------

ON_TIME = [
    row("the-largest-batch-whose-rows-all-finish-in-time",  # 3 rows (12U) would make tight late; 2 (11U) do not
        E("tight", deadline=NOW + 11 * U), E("b"), E("c"), batch=(("tight", 1), ("b", 1))),
    row("a-row-that-would-finish-late-is-left-out",  # with 3 of 4 on time at 13U, 3 rows run
        E("tight", deadline=NOW + 11 * U), E("b"), E("c"), E("d"), batch=(("b", 1), ("c", 1), ("d", 1))),
    row("under-overload-the-batch-shrinks-only-as-far-as-it-must",
        # every row's deadline at 13U: 8 rows (17U) would all be late, 4 (13U) are all on time
        *(E(f"r{i}", deadline=NOW + 13 * U) for i in range(8)), batch=tuple((f"r{i}", 1) for i in range(4))),
    row("finishing-exactly-at-the-deadline-is-on-time", E("tight", deadline=NOW + 12 * U), E("b"), E("c"),
        batch=(("tight", 1), ("b", 1), ("c", 1))),
    row("judged-at-the-low-estimate",  # mean of 2 rows 14U + ... would drop it; low 10.4U·2 does not
        E("a", deadline=NOW + 21 * U), E("b"), latency=noisy_low, batch=(("a", 1), ("b", 1))),
    row("when-all-would-be-late-the-most-urgent-runs-alone",
        E("a", deadline=NOW + 10.5 * U), E("b", deadline=NOW + 10.5 * U), batch=(("a", 1),)),
    row("a-row-that-fits-only-alone-runs-alone-at-once",  # alone 10U fits 10.5U, with b (11U) not; no slack to wait
        E("tight", deadline=NOW + 10.5 * U), E("b"), policy=TIMER, batch=(("tight", 1),)),
]


@pytest.mark.parametrize("r", ON_TIME)
def test_rows_that_would_finish_late(r: Row) -> None:
    check(r)


# -- 3. go now ------------------------------------------------------------------------------------

GO_NOW = [
    row("a-full-batch-goes-even-under-a-timer", *(E(f"r{i}") for i in range(8)), policy=TIMER,
        batch=tuple((f"r{i}", 1) for i in range(8))),
    row("a-full-batch-goes-even-under-adaptive", E("a", rows=8), policy=ADAPT,
        inputs=inputs(arrival_rate=1e6), batch=(("a", 8),)),
    row("fixed-timer-with-zero-max-queue-delay-never-waits", E("a"), batch=(("a", 1),)),
    row("the-largest-preferred-size-goes",
        E("a", rows=4),
        policy=BatchingPolicy(max_batch_size=8, adaptive=False, max_queue_delay=1.0, preferred_batch_sizes=(2, 4)),
        batch=(("a", 4),)),
    row("the-oldest-row-reached-max-queue-delay", E("a", arrival=NOW - 1.0), E("b"), policy=TIMER,
        batch=(("a", 1), ("b", 1))),
    row("no-deadline-slack-left-to-wait",  # 40 ms budget, margin 10 ms: 30 ms − 15U − p(8) < 0
        E("a", arrival=NOW - 15 * U, deadline=NOW + 0.040 - 15 * U), policy=TIMER, batch=(("a", 1),)),
    row("no-free-slot-no-batch-but-a-wake-at-the-next-last-start",
        E("a", deadline=NOW + 50 * U), E("b", deadline=NOW + 30 * U), E("c"),
        inputs=inputs(free_slots=0), policy=TIMER, wake_at=NOW + 20 * U),
    row("no-free-slot-and-no-deadline-waits-for-an-event", E("a"), inputs=inputs(free_slots=0), policy=TIMER),
    row("empty-queue-nothing-to-do", inputs=inputs(), policy=TIMER),
]


@pytest.mark.parametrize("r", GO_NOW)
def test_go_now(r: Row) -> None:
    check(r)


# -- 4. wait: fixed timer ---------------------------------------------------------------------------

TIMER_125 = BatchingPolicy(max_batch_size=8, adaptive=False, max_queue_delay=0.125)

FIXED_WAIT = [
    row("until-the-oldest-row-reaches-max-queue-delay", E("a", arrival=NOW - 0.0625), E("b"), policy=TIMER_125,
        wake_at=NOW + 0.0625),
    row("a-smaller-preferred-size-keeps-waiting",
        E("a", rows=2, arrival=NOW - 0.25),
        policy=BatchingPolicy(max_batch_size=8, adaptive=False, max_queue_delay=1.0, preferred_batch_sizes=(2, 4)),
        wake_at=NOW + 0.75),
    row("a-multi-row-request-waits-from-its-arrival",
        E("big", rows=10, arrival=NOW - 0.0625), policy=TIMER_125, inputs=inputs(cap=16), wake_at=NOW + 0.0625),
]


@pytest.mark.parametrize("r", FIXED_WAIT)
def test_fixed_timer_wait(r: Row) -> None:
    check(r)


# -- 4. wait: adaptive --------------------------------------------------------------------------------
# The target is the smallest n ≥ rows at which the engine keeps up (λ·p(n) ≤ n per slot) and
# the host keeps up (other + λ·h/n ≤ HOST_TARGET); the wait for it is (n − rows)/λ. For the
# engine alone the wait is taken only if the queued rows finish no later for it
# ((n − rows)/λ + p(n) ≤ p(rows), as on DIP) or no size up to the cap keeps up (overload).

ADAPTIVE = [
    row("no-arrivals-go-now", E("a"), policy=ADAPT, batch=(("a", 1),)),
    row("arrivals-slower-than-the-batch-runs-go-now",  # 64/s against p(1) = 10U ≈ 102 rows/s
        E("a"), policy=ADAPT, inputs=inputs(arrival_rate=64.0), batch=(("a", 1),)),
    row("arrivals-faster-than-the-engine-at-this-size-wait",
        # BatchingPolicy.adaptive: "wait for more rows only while the engine, at the batch size
        # queued now, runs fewer rows per second than arrive". One row at p(1) = 10U runs 102
        # rows/s; 512/s arrive, so every further row lowers the slot time per row.
        # No size up to the cap keeps up ((9 + n)·U·512/s > n for n ≤ 8): wait for a full batch,
        # 7 rows at 512/s away.
        E("a"), policy=ADAPT, inputs=inputs(arrival_rate=512.0), wake_at=NOW + 7 / 512),
    row("the-engine-does-not-wait-where-it-would-delay-the-queued-rows",
        # 128/s keeps up from n = 2, but the wait (8U) and p(2) = 11U finish after p(1) = 10U: go
        E("a"), policy=ADAPT, inputs=inputs(arrival_rate=128.0), batch=(("a", 1),)),
    row("waits-for-the-rows-that-lower-the-cost",  # λ = 128/s per slot: target 2 rows, 1/λ = 8U away
        E("a"), policy=ADAPT, latency=DIP, inputs=inputs(arrival_rate=128.0), wake_at=NOW + 8 * U),
    row("the-target-is-priced-at-the-rate-per-slot",
        # 256/s over 2 slots is 128/s each: the same target of 2 rows as above; the wake is
        # when the queue (fed at 256/s) should hold them.
        E("a"), policy=ADAPT, latency=DIP, inputs=inputs(arrival_rate=256.0, slots=2), wake_at=NOW + 4 * U),
    row("two-queued-rows-that-keep-up-go-now",  # 256/s on one slot: 256·p(2) = 2 ≤ 2
        E("a"), E("b"), policy=ADAPT, latency=DIP, inputs=inputs(arrival_rate=256.0), batch=(("a", 1), ("b", 1))),
    row("max-queue-delay-bounds-an-adaptive-wait",
        E("a", arrival=NOW - U), policy=BatchingPolicy(max_batch_size=8, max_queue_delay=4 * U), latency=DIP,
        inputs=inputs(arrival_rate=128.0), wake_at=NOW + 3 * U),
    row("a-wait-reaching-max-queue-delay-goes-now",
        E("a", arrival=NOW - 4 * U), policy=BatchingPolicy(max_batch_size=8, max_queue_delay=4 * U), latency=DIP,
        inputs=inputs(arrival_rate=128.0), batch=(("a", 1),)),
]


@pytest.mark.parametrize("r", ADAPTIVE)
def test_adaptive_wait(r: Row) -> None:
    check(r)


# -- 4. wait: adaptive, the host's share ----------------------------------------------------------
# LAT's engine keeps up at 64/s from one row (64·10U ≤ 1), so only the host can ask for a wait.

def host(share: float, batch_share: float, per_batch: float, rate: float = 64.0, **kw) -> Inputs:
    return Inputs(NOW, kw.get("free_slots", 1), kw.get("slots", 1), rate, kw.get("cap", 8),
                  host_share=share, host_batch_share=batch_share, host_per_batch=per_batch)


HOST = [
    row("a-host-with-room-runs-a-lone-row-at-once",  # 64/s · 1 ms per batch = 0.0625 ≤ 0.8 − 0.05
        E("a"), policy=ADAPT, inputs=host(0.1, 0.05, 0.001), batch=(("a", 1),)),
    row("an-unmeasured-host-cost-never-waits", E("a"), policy=ADAPT, inputs=host(1.0, 0.0, 0.0), batch=(("a", 1),)),
    row("a-busy-host-waits-for-the-size-that-fits-its-target",
        # other work 0.5 − 0.1 = 0.4; 64/s · 32U = 2 host-seconds per second at batch 1: n = ⌈2/0.4⌉ = 5
        E("a"), policy=ADAPT, inputs=host(0.5, 0.1, 32 * U), wake_at=NOW + 4 / 64),
    row("queued-rows-that-fit-the-host-target-go-now",
        *(E(f"r{i}") for i in range(5)), policy=ADAPT, inputs=host(0.5, 0.1, 32 * U),
        batch=tuple((f"r{i}", 1) for i in range(5))),
    row("a-host-full-of-other-work-leaves-the-batches-the-minimum-headroom",
        # other work 0.9 > HOST_TARGET: 64/s · 2U / 0.05 = 2.5, so 3 rows
        E("a"), policy=ADAPT, inputs=host(1.0, 0.1, 2 * U), wake_at=NOW + 2 / 64),
    row("a-host-wait-is-for-at-most-a-full-batch",  # the host would want 40 rows; the cap is 8
        E("a"), policy=ADAPT, inputs=host(0.5, 0.1, 256 * U), wake_at=NOW + 7 / 64),
    row("a-host-wait-is-bounded-by-deadline-slack",  # 5 rows wanted; 25U − 10 ms − p(5) = 25 − 10.24 − 14
        E("a", arrival=NOW - 0.1, deadline=NOW + 25 * U), policy=ADAPT, inputs=host(0.5, 0.1, 32 * U),
        wake_at=NOW + 25 * U - DEADLINE_MARGIN_S - 14 * U),
    row("the-fixed-timer-ignores-the-host", E("a"), policy=GO, inputs=host(1.0, 0.5, 32 * U), batch=(("a", 1),)),
]


@pytest.mark.parametrize("r", HOST)
def test_adaptive_host_wait(r: Row) -> None:
    check(r)


# -- 3. cap by deadlines ------------------------------------------------------------------------------
# LAT: p(n) = (9 + n)·U. A tight budget of 32U: margin 8U, so a tight arrival leaves the batch
# 32 − 8 − p(1) = 14U: five rows.


def tight(budget: float, free_slots: int = 1, slots: int = 1, arrival_rate: float = 0.0) -> Inputs:
    return Inputs(NOW, free_slots, slots, arrival_rate, 8, tight_budget=budget)


EIGHT = tuple(E(f"r{i}") for i in range(8))

DEADLINE_CAP = [
    row("a-tight-budget-caps-the-batch", *EIGHT, inputs=tight(32 * U), batch=tuple((f"r{i}", 1) for i in range(5))),
    row("a-loose-budget-does-not", *EIGHT, inputs=tight(64 * U), batch=tuple((f"r{i}", 1) for i in range(8))),
    row("not-while-another-slot-stays-free", *EIGHT, inputs=tight(32 * U, free_slots=2, slots=2),
        batch=tuple((f"r{i}", 1) for i in range(8))),
    row("a-tight-budget-caps-an-oversized-request", E("big", rows=20), inputs=tight(32 * U), batch=(("big", 5),)),
    row("not-a-backlog-that-batches-of-five-would-make-miss",
        # 16 rows due at 40U: batches of five end the last at 4 × p(5) = 56U, batches of eight at 34U.
        *(E(f"b{i}", deadline=NOW + 40 * U) for i in range(16)), inputs=tight(32 * U),
        batch=tuple((f"b{i}", 1) for i in range(8))),
    row("nor-yields-where-batches-at-the-keep-up-size-make-it",
        # 12 rows due at 35U, arrivals at 0.39 rows/U: the engine keeps up at six rows (p(6) = 15U).
        # Batches of five make two rows late, of six none: six it is, not the cap's eight.
        *(E(f"b{i}", deadline=NOW + 35 * U) for i in range(12)), inputs=tight(32 * U, arrival_rate=0.39 / U),
        batch=tuple((f"b{i}", 1) for i in range(6))),
    row("the-rows-left-behind-cap-the-batch",
        # late's slack 25U − p(1) = 15U: six rows; that leaves h6, h7 behind, slack 14U: five.
        # Then h5's batch of one starts at 14U and ends at its deadline, 24U.
        *(E(f"h{i}", deadline=NOW + 24 * U) for i in range(8)), E("late", deadline=NOW + 25 * U),
        batch=tuple((f"h{i}", 1) for i in range(5))),
    row("a-lower-priority-row-left-behind-does-not-cap",  # priority 2 behind a priority-1 batch
        *(E(f"h{i}", priority=1) for i in range(8)), E("low", priority=2, deadline=NOW + 25 * U),
        policy=LEVELS, batch=tuple((f"h{i}", 1) for i in range(8))),
    row("a-row-that-cannot-wait-for-any-batch-does-not-cap",  # late's slack 9U < p(1): it cannot wait anyway
        *(E(f"h{i}", deadline=NOW + 18 * U) for i in range(8)), E("late", deadline=NOW + 19 * U),
        batch=tuple((f"h{i}", 1) for i in range(8))),
    row("the-head-runs-alone-if-only-a-batch-of-one-fits",  # 27U: 27 − 6.75 − 10 = 10.25U, p(1) = 10U
        *EIGHT, inputs=tight(27 * U), batch=(("r0", 1),)),
    row("a-budget-no-batch-can-protect-caps-nothing",  # 24U: 24 − 6 − 10 = 8U < p(1)
        *EIGHT, inputs=tight(24 * U), batch=tuple((f"r{i}", 1) for i in range(8))),
    row("a-capped-batch-goes-now-under-a-timer", *EIGHT, policy=TIMER, inputs=tight(32 * U),
        batch=tuple((f"r{i}", 1) for i in range(5))),
]


@pytest.mark.parametrize("r", DEADLINE_CAP)
def test_deadline_cap(r: Row) -> None:
    check(r)


# -- 4. wait: deadline slack, less the margin --------------------------------------------------------

SLACK = [
    row("deadline-slack-less-the-full-margin-caps-the-timer",  # 100 ms budget: margin 10 ms; p(8) = 17U
        E("a", deadline=NOW + 0.100), policy=TIMER, wake_at=NOW + 0.100 - DEADLINE_MARGIN_S - 17 * U),
    row("the-margin-is-a-quarter-of-a-short-budget",  # 32 ms budget: margin 8 ms, not 10
        E("a", arrival=NOW - 0.002, deadline=NOW + 0.030), policy=TIMER, wake_at=NOW + 0.030 - 0.008 - 17 * U),
    row("the-most-pressed-member-sets-the-slack",
        E("a", deadline=NOW + 0.100), E("b", deadline=NOW + 0.080), policy=TIMER,
        wake_at=NOW + 0.080 - DEADLINE_MARGIN_S - 17 * U),
    row("slack-is-priced-at-the-batch-waited-for",  # at cap 4 the wait prices p(4) = 13U, not p(8)
        E("a", deadline=NOW + 0.100), policy=TIMER, inputs=inputs(cap=4),
        wake_at=NOW + 0.100 - DEADLINE_MARGIN_S - 13 * U),
    # p(n) = n·U; an 8U budget: margin 2U. Last moment to wait: deadline − 2U − p(2).
    row("a-slack-ending-exactly-now-goes-now",
        E("a", arrival=NOW - 4 * U, deadline=NOW + 4 * U), policy=TIMER, inputs=inputs(cap=2),
        latency=points((1, U)), batch=(("a", 1),)),
    row("one-unit-more-slack-waits-one-unit",
        E("a", arrival=NOW - 3 * U, deadline=NOW + 5 * U), policy=TIMER, inputs=inputs(cap=2),
        latency=points((1, U)), wake_at=NOW + U),
    row("deadline-slack-caps-an-adaptive-wait",  # 8U to the next row, but 25U − 10 ms − p(2) ≈ 6.8U
        E("a", arrival=NOW - 0.1, deadline=NOW + 25 * U), policy=ADAPT, latency=DIP,
        inputs=inputs(arrival_rate=128.0), wake_at=NOW + 25 * U - DEADLINE_MARGIN_S - 8 * U),
]


@pytest.mark.parametrize("r", SLACK)
def test_deadline_slack(r: Row) -> None:
    check(r)


# -- invariants -----------------------------------------------------------------------------------

PROGRESS = [
    pytest.param(Row((E("tight", deadline=NOW + 10 * U + U), E("b")), policy=TIMER, inputs=inputs(now=NOW + U)),
                 id="left-out-row-at-its-last-start"),
    pytest.param(Row((E("a", deadline=NOW + 0.100),), policy=TIMER), id="timer-wait"),
    pytest.param(Row((E("a", arrival=NOW - 1.0 + U),), policy=TIMER), id="timer-one-unit-short"),
]


@pytest.mark.parametrize("r", PROGRESS)
def test_with_a_free_slot_a_decision_runs_a_batch_or_waits_for_a_later_time(r: Row) -> None:
    """Rows queued and a slot free: the decision runs a batch, or names a later time to look
    again. No wake time (``None``: wait for the next arrival) would stall the queued rows."""
    d, _ = run(r)
    assert d.batch or (d.wake_at is not None and d.wake_at > r.inputs.now), d


# -- margin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrival", "deadline", "expected"),
    [
        pytest.param(NOW, math.inf, DEADLINE_MARGIN_S, id="no-deadline"),
        pytest.param(NOW, NOW + 0.100, DEADLINE_MARGIN_S, id="long-budget"),
        pytest.param(NOW, NOW + DEADLINE_MARGIN_S / DEADLINE_MARGIN_SHARE, DEADLINE_MARGIN_S,
                     id="at-the-share-boundary"),
        pytest.param(NOW - 0.010, NOW + 0.010, 0.005, id="short-budget-a-quarter"),
        pytest.param(NOW, NOW + 0.004, 0.001, id="tiny-budget"),
    ],
)
def test_margin(arrival: float, deadline: float, expected: float) -> None:
    assert margin(E("a", arrival=arrival, deadline=deadline).build()) == pytest.approx(expected, abs=1e-12)


# -- arrivals during a wait ---------------------------------------------------------------------
# A decision to wait carries the arrivals that can change it (ends_hold); the dispatcher takes
# no new decision for the others. The check: decide() again on the queue with the arrivals
# added, at the time they come at the measured rate (k rows at λ: k/λ later; with no slot free,
# at once). Where ends_hold says no, the answer must still be a wait, ending no earlier; where
# it says yes, the answer must differ (a batch, an expiry or an earlier wake).

FAST = inputs(arrival_rate=512.0)  # no size keeps up: wait for a full batch of 8 (7 rows away)
BUSY = inputs(free_slots=0)


def _redecide(held: tuple[E, ...], arrivals: tuple[E, ...], at: Inputs, latency: LatencyModel) -> tuple[bool, bool]:
    """(ends_hold for the last of ``arrivals``, whether decide() on the queue with all of them
    changes its answer: a batch, an expiry or an earlier wake than the held decision's)."""
    before = decide(sorted((e.build() for e in held), key=lambda q: q.key), at, ADAPT, latency)
    assert not before.batch and before.hold is not None
    built = [e.build() for e in (*held, *arrivals)]
    added = sum(e.rows for e in arrivals)
    ends = ends_hold(before.hold, built[-1], added, latency)
    later = replace(at, now=at.now + added / at.arrival_rate) if at.arrival_rate else at
    after = decide(sorted(built, key=lambda q: q.key), later, ADAPT, latency)
    return ends, bool(after.batch or after.expired or after.wake_at < before.wake_at)


@pytest.mark.parametrize("arrivals, at, ends", [
    pytest.param((E("b"),), FAST, False, id="a-loose-row-below-the-target-changes-nothing"),
    pytest.param(tuple(E(f"r{i}") for i in range(6)), FAST, False, id="six-of-the-seven-rows-waited-for"),
    pytest.param(tuple(E(f"r{i}") for i in range(7)), FAST, True, id="the-seventh-row-sends-the-batch"),
    pytest.param((E("b", rows=7),), FAST, True, id="one-request-of-the-seven-rows"),
    pytest.param((E("b", deadline=NOW + 20 * U),), FAST, True, id="a-deadline-inside-the-wait-ends-it"),
    pytest.param((E("b", deadline=NOW + 10.0),), FAST, False, id="a-deadline-after-the-wait-changes-nothing"),
    pytest.param((E("b"),), BUSY, False, id="no-free-slot-a-loose-row-changes-nothing"),
    pytest.param(tuple(E(f"r{i}") for i in range(20)), BUSY, False, id="no-free-slot-rows-end-nothing"),
    pytest.param((E("b", deadline=NOW + 12 * U),), BUSY, True, id="no-free-slot-an-earlier-last-start-wakes"),
    pytest.param((E("b", deadline=NOW + 2.0),), BUSY, False, id="no-free-slot-a-later-last-start-changes-nothing"),
])
def test_an_arrival_ends_a_wait_exactly_when_it_changes_the_decision(arrivals, at, ends) -> None:
    got, changed = _redecide((E("a", deadline=NOW + 1.0),), arrivals, at, LAT())
    assert got is ends
    assert changed is ends


def test_an_arrival_longer_than_the_held_batch_ends_the_wait() -> None:
    # The batch's run time changes with its longest row, and with it the target and the wake:
    # the decision is taken again (here its wake moves from 13U to 16U away).
    got, _changed = _redecide((E("a", deadline=NOW + 40 * U),), (E("b", length=64),), FAST, _per_length())
    assert got


# -- top_up: rows joining a staged batch (4 rows, length 1, starting at NOW) --------------------


@pytest.mark.parametrize(
    "queue, cap, staged_deadline, tight, skips, joined",
    [
        pytest.param((E("a", 2),), 8, math.inf, math.inf, 0.0, (("a", 2),), id="room-for-all"),
        pytest.param((E("a", 6),), 8, math.inf, math.inf, 0.0, (("a", 4),), id="the-room-left-splits-a-request"),
        pytest.param((E("a", 1), E("b", 1)), 8, NOW + 14 * U, math.inf, 0.0, (("a", 1),),
                     id="a-member's-deadline-stops-the-growth"),
        pytest.param((E("a", 2, deadline=NOW + 14 * U),), 8, math.inf, math.inf, 0.0, (),
                     id="a-joiner's-own-deadline-too"),
        pytest.param((E("a", 2, deadline=NOW + 14 * U),), 8, math.inf, math.inf, 1 * U, (("a", 2),),
                     id="the-skipped-hop-counts"),
        pytest.param((E("a", 8),), 16, math.inf, 40 * U, 0.0, (), id="a-tight-arrival-after-its-start-could-not-wait"),
        pytest.param((E("a", 7),), 16, math.inf, 40 * U, 0.0, (("a", 7),), id="within-the-tight-limit"),
        pytest.param((E("a", 1, deadline=NOW + 5 * U),), 8, math.inf, math.inf, 0.0, (), id="expired-rows-never-join"),
    ],
)
def test_rows_join_a_staged_batch_while_it_still_meets_every_deadline(queue, cap, staged_deadline, tight, skips,
                                                                      joined) -> None:
    """p(n) = (9 + n)·U: the staged batch alone finishes at NOW + 13U. The tight budget 40U allows
    a run of 40U − 10U margin − 10U for a batch of one = 20U, p(11)."""
    built = [e.build() for e in queue]
    names = {id(b): e.name for e, b in zip(queue, built)}
    chosen = top_up(built, replace(inputs(cap=cap), tight_budget=tight), GO, LAT(), rows=4, length=1,
                    deadline=staged_deadline, skips=skips)
    assert tuple((names[id(e)], n) for e, n in chosen) == joined
