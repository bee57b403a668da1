"""The dispatch decision: a pure function of the queue, the time and what has been measured.

:func:`decide` implements the dispatch policy of ``../shared/DESIGN.md``:

1. **Expire.** Every queued request whose deadline is earlier than ``now`` plus the predicted
   run time of a batch of one (of its length) can no longer be answered in time (at exactly
   that moment only if no slot is free to start it).
2. **Select** rows up to the batch cap in (priority, deadline, arrival) order, requests waiting
   longer than ``priority_aging`` first (not those ``TimeoutAction.DELAY`` moved last). When more rows wait than one batch holds and their
   lengths vary, the batch is filled with the rows closest in length to the most urgent one
   (length bucketing: less padding), except that rows near their deadline are never passed
   over.
   Rows that would finish after their deadline at the batch's predicted run time are left
   out (no engine time on an answer nobody reads).
3. **Go or wait.** With a free slot the batch goes now if it is full, or if waiting could
   not pay off: under the adaptive policy, unless the rows expected to arrive (measured
   arrival rate) lower the slot time per row, idle wait included, while the slot still keeps
   up with arrivals (see :func:`_target_rows`); under the fixed timer, when
   ``max_queue_delay`` is zero or the largest preferred size is reached. Otherwise it waits —
   for that batch size (adaptive) or for ``max_queue_delay`` (fixed) — but never past the
   moment a selected row would miss its deadline given the predicted run time of the larger
   batch, less a safety :func:`margin`. An arrival or a freed slot wakes the dispatcher sooner.

It reads no clock and changes nothing; the dispatcher applies the :class:`Decision`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import BatchingPolicy
from .latency import LatencyModel
from .queue import QueueEntry

# A row whose deadline is within this many predicted full-batch run times is "near its
# deadline": length bucketing never passes it over.
URGENT_RUNS = 2.0
# A wait for more rows ends this long before the last moment the predicted run time allows,
# so that a late wake-up of the event loop, the hand-off to the slot's thread and writing the
# answer do not push the batch's members past their deadlines (C10) ...
DEADLINE_MARGIN_S = 0.010
# ... but never more than this share of a request's own budget (deadline - arrival): a 10 ms
# margin on a 10 ms deadline would forbid every wait.
DEADLINE_MARGIN_SHARE = 0.25


@dataclass(frozen=True)
class Decision:
    """What the dispatcher does now.

    Attributes:
        expired: queued entries that can no longer meet their deadline (to reject, or to
            move behind everything else under ``TimeoutAction.DELAY``).
        batch: (entry, rows) to take into a batch and run now on a free slot, in order;
            empty for none.
        wake_at: when to decide again if no request arrives and no slot frees up first
            (monotonic seconds); ``None`` to wait for one of those events alone.
    """

    expired: tuple[QueueEntry, ...] = ()
    batch: tuple[tuple[QueueEntry, int], ...] = ()
    wake_at: float | None = None


@dataclass(frozen=True)
class Inputs:
    """What :func:`decide` knows besides the queue.

    Attributes:
        now: the current time (monotonic seconds).
        free_slots: execution slots idle now.
        slots: execution slots in all.
        arrival_rate: measured arrival rate, rows per second.
        cap: the batch cap in rows (``max_batch_size``, or the adaptive cap below it).
    """

    now: float
    free_slots: int
    slots: int
    arrival_rate: float
    cap: int


def decide(entries: Sequence[QueueEntry], inputs: Inputs, policy: BatchingPolicy, latency: LatencyModel) -> Decision:
    """Decide what to do with a model's queue.

    Args:
        entries: the queue, in (priority, deadline, arrival) order, each with rows queued.
        inputs: time, slots, arrival rate and batch cap.
        policy: the model's batching policy.
        latency: predicted run times.
    """
    now = inputs.now
    one = _OneRow(latency)
    # An entry's last start is deadline − p(1); the same float is the wake time, so a wake at
    # it always finds the entry expired or startable.
    expired = tuple(
        e for e in entries
        if e.deadline - one(e) < now or (e.deadline - one(e) == now and inputs.free_slots <= 0)
    )
    live: Sequence[QueueEntry] = entries
    if expired:
        gone = {id(e) for e in expired}
        live = [e for e in entries if id(e) not in gone]
    next_expiry = min((e.deadline - one(e) for e in live if e.deadline < math.inf), default=math.inf)
    expiry_wake = next_expiry if next_expiry < math.inf else None
    if not live or inputs.free_slots <= 0:
        return Decision(expired, (), expiry_wake)

    cap = inputs.cap
    batch = _on_time(_select(live, now, cap, policy, latency), now, latency)
    rows = sum(n for _, n in batch)
    length = max(e.length for e, _ in batch)
    if rows >= cap:
        return Decision(expired, batch, None)

    target = _target_rows(rows, length, inputs, policy, latency)
    if target <= rows:
        return Decision(expired, batch, None)
    wait_until = min(e.deadline - margin(e) for e, _ in batch) - latency.predict(target, length)
    if policy.adaptive:
        wait_until = min(wait_until, now + (target - rows) / inputs.arrival_rate)
    if policy.max_queue_delay > 0:
        wait_until = min(wait_until, min(e.arrival for e, _ in batch) + policy.max_queue_delay)
    if wait_until <= now:
        return Decision(expired, batch, None)
    wake = wait_until if expiry_wake is None else min(wait_until, expiry_wake)
    return Decision(expired, (), wake)


def margin(entry: QueueEntry) -> float:
    """Seconds a wait for more rows keeps clear of ``entry``'s deadline: :data:`DEADLINE_MARGIN_S`,
    at most :data:`DEADLINE_MARGIN_SHARE` of its budget (deadline − arrival)."""
    return min(DEADLINE_MARGIN_S, DEADLINE_MARGIN_SHARE * (entry.deadline - entry.arrival))


class _OneRow:
    """Least run time of a batch of one row of an entry's length (:meth:`LatencyModel.lower_bound`), cached per length."""

    def __init__(self, latency: LatencyModel) -> None:
        self._latency = latency
        self._cache: dict[int, float] = {}

    def __call__(self, entry: QueueEntry) -> float:
        t = self._cache.get(entry.length)
        if t is None:
            t = self._cache[entry.length] = self._latency.lower_bound(1, entry.length)
        return t


def adaptive_cap(latency: LatencyModel, policy: BatchingPolicy, length: int = 1, tolerance: float = 0.05) -> int:
    """The knee of the measured throughput curve: the smallest measured batch size whose rows/s
    is within ``tolerance`` of the best measured, among sizes whose predicted run time fits
    ``policy.latency_budget``; ``max_batch_size`` until anything is measured."""
    limit = policy.rows_per_batch
    curve = {b: t for b, t in latency.curve(length).items() if b <= limit and t > 0}
    fits = {b: t for b, t in curve.items() if t <= policy.latency_budget} or dict(sorted(curve.items())[:1])
    if not fits:
        return limit
    best = max(b / t for b, t in fits.items())
    return min(b for b, t in fits.items() if b / t >= (1 - tolerance) * best)


def _on_time(batch: tuple[tuple[QueueEntry, int], ...], now: float, latency: LatencyModel) -> tuple[tuple[QueueEntry, int], ...]:
    """Leave out of the batch the rows that would finish after their deadline even at the
    batch's least run time (:meth:`LatencyModel.lower_bound`; they stay queued: a smaller batch
    on another slot may still make it, else they expire unrun). A row that may still make it
    is kept: left out, it would wait for this batch and surely miss. If that leaves nothing,
    the most urgent entry runs alone."""
    rows = sum(n for _, n in batch)
    finish = now + latency.lower_bound(rows, max(e.length for e, _ in batch))
    kept = tuple((e, n) for e, n in batch if e.deadline >= finish)
    return kept or batch[:1]


def _target_rows(rows: int, length: int, inputs: Inputs, policy: BatchingPolicy, latency: LatencyModel) -> int:
    """The batch size worth waiting for; ``rows`` means go now.

    Adaptive: with arrivals at λ rows/s per slot, waiting for n rows takes w = (n − rows)/λ and
    then p(n). The wait pays only if it lowers the slot time per row, (w + p(n))/n < p(rows)/rows
    (the slot idles while it waits), and only if the slot still keeps up with arrivals over
    the wait and the run, n ≥ λ·(w + p(n)); otherwise running now and letting the next batch
    grow while this one runs is better (the simulator shows waiting then loses goodput).
    """
    cap = inputs.cap
    if not policy.adaptive:
        if policy.max_queue_delay <= 0:
            return rows
        if policy.preferred_batch_sizes and rows >= policy.preferred_batch_sizes[-1]:
            return rows
        return cap
    rate = inputs.arrival_rate / max(inputs.slots, 1)
    best_n, best_cost = rows, latency.predict(rows, length) / rows
    if rate * best_cost <= 1:
        # Arrivals no faster than this batch runs: since p(n) >= p(rows), the cost of n rows
        # is at least ((n - rows)/rate + p(rows))/n >= p(rows)/rows, so no wait can pay.
        return rows
    for n in range(rows + 1, cap + 1):
        busy = (n - rows) / rate + latency.predict(n, length)
        if n < rate * busy:
            break  # larger n only idles the slot longer
        if busy / n < best_cost:
            best_n, best_cost = n, busy / n
    return best_n


def _select(live: Sequence[QueueEntry], now: float, cap: int, policy: BatchingPolicy, latency: LatencyModel) -> tuple[tuple[QueueEntry, int], ...]:
    """Rows for the next batch: aged requests first, then queue order; length-bucketed when
    more rows wait than fit and some of them are not near their deadline."""
    # A request TimeoutAction.DELAY moved behind everything (its priority is no longer its
    # level) missed its deadline already: aging must not bring it back ahead of live ones.
    aged = [e for e in live if now - e.arrival >= policy.priority_aging and e.priority == e.level]
    order: Sequence[QueueEntry] = live
    seen = {id(e) for e in aged}
    if aged:
        aged.sort(key=lambda e: e.arrival)
        order = aged + [e for e in live if id(e) not in seen]
    total = 0
    for e in order:
        total += e.rows
        if total > cap:
            break
    if total <= cap or not policy.length_bucketing or len({e.length for e in order}) == 1:
        return _fill(order, cap)
    # Length bucketing: the head, then every row near its deadline, then the closest lengths
    # within each level, aged requests counting as a level ahead of all others.
    head = order[0]
    urgent_before = now + URGENT_RUNS * latency.predict(cap, head.length)
    urgent = [e for e in order[1:] if e.deadline <= urgent_before]
    rest = sorted(
        (e for e in order[1:] if e.deadline > urgent_before),
        key=lambda e: (
            (0, 0) if id(e) in seen else (1, e.priority),
            abs(e.length.bit_length() - head.length.bit_length()),
        ),
    )
    return _fill([head, *urgent, *rest], cap)


def _fill(order: Sequence[QueueEntry], cap: int) -> tuple[tuple[QueueEntry, int], ...]:
    batch: list[tuple[QueueEntry, int]] = []
    room = cap
    for e in order:
        if room <= 0:
            break
        n = min(e.rows, room)
        batch.append((e, n))
        room -= n
    return tuple(batch)
