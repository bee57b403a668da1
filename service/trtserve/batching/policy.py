"""The dispatch decision: a pure function of the queue, the time and what has been measured.

:func:`decide` implements the dispatch policy, in four steps:

1. **Expire.** Every queued request whose deadline is earlier than ``now`` plus the predicted
   run time of a batch of one (of its length) can no longer be answered in time (at exactly
   that moment only if it is not started now).
2. **Select** rows up to the batch cap in (priority, deadline, arrival) order, requests waiting
   longer than ``priority_aging`` first (not those ``TimeoutAction.DELAY`` moved last). When
   more rows wait than one batch holds and their lengths vary, the batch is filled with the rows
   closest in length to the most urgent one (length bucketing: less padding), except that rows
   near their deadline are never passed over. A request *larger than the cap* shares: while
   later requests of its priority level wait, it takes at most half of the batch (:func:`_fill`),
   so one bulk caller's rows interleave with everyone else's instead of queueing them all behind
   it; rows near their deadline still come first.
   Rows that would finish after their deadline at the batch's predicted run time are left
   out (no engine time on an answer nobody reads).
3. **Cap by deadlines.** When the batch takes the last free slot, its predicted run time must
   leave every queued row it leaves behind, and a tight request likely to arrive while it runs
   (the low quantile of recent budgets, :mod:`~trtserve.batching.budgets`), time for a batch of one after it:
   p(n) + p(1) ≤ slack (see :func:`_deadline_cap`). Loose rows wait for a later batch.
4. **Go or wait.** With a free slot the batch goes now if it is full, or if waiting could
   not pay off. Under the adaptive policy the batch size worth waiting for is the smallest at
   which both resources keep up with the measured arrival rate λ (:func:`_target_rows`): the
   engine (λ·p(n)/n per slot ≤ 1) and the host thread that does the per-batch work
   (other work + λ·h/n ≤ :data:`HOST_TARGET`, h the measured host CPU per batch,
   :mod:`~trtserve.batching.host`); a wait the engine alone asks for is taken only where it delays no queued row
   or no size up to the cap keeps up (:func:`_target_rows`). At low load both hold at the rows
   queued now, so a lone request runs at once.
   Under the fixed timer the batch goes when ``max_queue_delay`` is zero or the largest
   preferred size is reached. Otherwise it waits — for that batch size (adaptive) or for
   ``max_queue_delay`` (fixed) — but never past the moment a selected row would miss its
   deadline given the predicted run time of the larger batch, less a safety :func:`margin`.
   A freed slot wakes the dispatcher sooner, and so does an arrival that can change the wait
   (:func:`ends_hold`: it brings the rows waited for, its row is longer, or its deadline falls
   inside the wait);
   the others join the queue without a new decision.

It reads no clock and changes nothing; the dispatcher applies the :class:`Decision`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trtserve.batching.latency import LatencyModel
from trtserve.batching.queue import QueueEntry
from trtserve.config import BatchingPolicy

# A row whose deadline is within this many predicted full-batch run times is "near its
# deadline": length bucketing never passes it over.
URGENT_RUNS = 2.0
# A wait for more rows ends this long before the last moment the predicted run time allows,
# so that a late wake-up of the event loop, the hand-off to the slot's thread and writing the
# answer do not push the batch's members past their deadlines ...
DEADLINE_MARGIN_S = 0.010
# ... but never more than this share of a request's own budget (deadline - arrival): a 10 ms
# margin on a 10 ms deadline would forbid every wait.
DEADLINE_MARGIN_SHARE = 0.25
# The busy share of the host thread that the adaptive policy keeps its per-batch work under:
# above it, queues on the host (the requests not yet read) grow faster than waits for more
# rows cost (M/D/1: the queueing delay grows as ρ/(1 − ρ), 4 service times at 0.8) ...
HOST_TARGET = 0.8
# ... and, when per-request work alone fills the host past HOST_TARGET, the share the
# per-batch work may still take: batches grow until it is under this (more rows then buy
# under 5 % of the host).
HOST_MIN_HEADROOM = 0.05
# A request with more rows queued than the cap takes at most 1/LARGE_SHARE of a batch while later
# requests of its level wait (:func:`_fill`): the other requests' answers come within about two
# batch run times, and the large request keeps at least half of every batch.
LARGE_SHARE = 2


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
        hold: with a wait, which arrivals can change it (:class:`Hold`); ``None``: any.
    """

    expired: tuple[QueueEntry, ...] = ()
    batch: tuple[tuple[QueueEntry, int], ...] = ()
    wake_at: float | None = None
    hold: Hold | None = None


@dataclass(frozen=True)
class Hold:
    """Which arrivals can change a decision to wait (:func:`ends_hold`), so that an arrival
    that cannot costs the dispatcher no new decision. ``None`` in a :class:`Decision`: every
    arrival can (an empty queue, or a batch that went).

    Attributes:
        rows: rows the wait is for: the arrivals since the decision end it once they add this
            many (``math.inf`` with no slot free: rows end nothing, a freed slot does).
        length: the held batch's row length (elements): a longer row changes its run time
            (``math.inf`` with no slot free).
        run: the predicted run time (seconds) of the batch waited for; ``None`` with no slot
            free.
        until: the decision's wake time (monotonic seconds; ``math.inf`` for none).
    """

    rows: float
    length: float
    run: float | None
    until: float


def ends_hold(hold: Hold, entry: QueueEntry, added: int, latency: LatencyModel) -> bool:
    """Whether ``entry``, arriving while the dispatcher keeps ``hold``, can change the decision
    (``added``: rows arrived since it, ``entry``'s included): it brings the rows waited for,
    it is longer than the held batch, or its own deadline falls inside the wait (its last start,
    deadline − p(1), or, joining the held batch, deadline − margin − the batch's run time, before
    ``hold.until``). Any other arrival leaves :func:`decide`'s answer as it was, up to the
    arrival rate it reads (the wait then ends at the rows or the time first predicted)."""
    if added >= hold.rows or entry.length > hold.length:
        return True
    if entry.deadline == math.inf:
        return False
    start = entry.deadline - latency.lower_bound(1, entry.length)
    if hold.run is not None:
        start = min(start, entry.deadline - margin(entry) - hold.run)
    return start < hold.until


@dataclass(frozen=True)
class Inputs:
    """What :func:`decide` knows besides the queue.

    Attributes:
        now: the current time (monotonic seconds).
        free_slots: execution slots idle now.
        slots: execution slots in all.
        arrival_rate: measured arrival rate, rows per second.
        cap: the batch cap in rows (``max_batch_size``, or the adaptive cap below it).
        host_share: busy share of the host thread (0..1, may exceed 1 on a backlog),
            :meth:`HostMeter.share <trtserve.batching.host.HostMeter.share>`.
        host_batch_share: the part of ``host_share`` spent on per-batch work.
        host_per_batch: host CPU seconds one batch costs beside its engine run.
        tight_budget: the tight end of recent deadline budgets (deadline − arrival, seconds;
            ``math.inf`` for none), :class:`~trtserve.batching.budgets.DeadlineBudgets`.
    """

    now: float
    free_slots: int
    slots: int
    arrival_rate: float
    cap: int
    host_share: float = 0.0
    host_batch_share: float = 0.0
    host_per_batch: float = 0.0
    tight_budget: float = math.inf


def decide(entries: Sequence[QueueEntry], inputs: Inputs, policy: BatchingPolicy, latency: LatencyModel) -> Decision:
    """Decide what to do with a model's queue.

    Args:
        entries: the queue, in (priority, deadline, arrival) order, each with rows queued.
        inputs: time, slots, arrival rate and batch cap.
        policy: the model's batching policy.
        latency: predicted run times.

    Returns:
        The :class:`Decision`: what to expire, what to run now, and when to decide again.
    """
    now = inputs.now
    one = _OneRow(latency)
    # An entry's last start is deadline − p(1); the same float is the wake time, so a wake at
    # it always finds the entry expired or startable.
    expired = [
        e for e in entries
        if e.deadline - one(e) < now or (e.deadline - one(e) == now and inputs.free_slots <= 0)
    ]
    live: Sequence[QueueEntry] = _without(entries, expired)
    if not live:
        return Decision(tuple(expired), (), _next_expiry(live, one))
    if inputs.free_slots <= 0:
        wake = _next_expiry(live, one)
        return Decision(tuple(expired), (), wake, Hold(math.inf, math.inf, None, math.inf if wake is None else wake))

    cap = inputs.cap
    batch = _on_time(_select(live, now, cap, policy, latency), now, latency)
    if inputs.free_slots == 1:
        keep_up = _engine_rows(1, max(e.length for e, _ in batch), inputs, latency)
        cap, batch = _deadline_cap(batch, live, inputs, policy, latency, one, keep_up)
    # A row at exactly its last start that this batch leaves out can start no later: expired.
    chosen = {id(e) for e, _ in batch}
    at_last = [e for e in live if id(e) not in chosen and e.deadline - one(e) <= now]
    if at_last:
        expired += at_last
        live = _without(live, at_last)
    expiry_wake = _next_expiry(live, one)
    rows = sum(n for _, n in batch)
    length = max(e.length for e, _ in batch)
    if rows >= cap:
        return Decision(tuple(expired), batch, None)

    target = min(_target_rows(rows, length, inputs, policy, latency), cap)
    if target <= rows:
        return Decision(tuple(expired), batch, None)
    wait_until = min(e.deadline - margin(e) for e, _ in batch) - latency.predict(target, length)
    if policy.adaptive:
        wait_until = min(wait_until, now + (target - rows) / inputs.arrival_rate)
    if policy.max_queue_delay > 0:
        wait_until = min(wait_until, min(e.arrival for e, _ in batch) + policy.max_queue_delay)
    if wait_until <= now:
        return Decision(tuple(expired), batch, None)
    wake = wait_until if expiry_wake is None else min(wait_until, expiry_wake)
    return Decision(tuple(expired), (), wake, Hold(_held_rows(target, policy) - rows, length,
                                                   latency.predict(target, length), wake))


def _held_rows(target: int, policy: BatchingPolicy) -> int:
    """The queued rows at which a wait for ``target`` rows ends: ``target``, or the largest
    preferred batch size below it under the fixed timer (reaching it sends the batch)."""
    if not policy.adaptive and policy.preferred_batch_sizes:
        return min(target, policy.preferred_batch_sizes[-1])
    return target


def _without(entries: Sequence[QueueEntry], gone: Sequence[QueueEntry]) -> Sequence[QueueEntry]:
    if not gone:
        return entries
    ids = {id(e) for e in gone}
    return [e for e in entries if id(e) not in ids]


def _next_expiry(live: Sequence[QueueEntry], one: _OneRow) -> float | None:
    """The earliest last start (deadline − p(1)) among ``live``; ``None`` for none."""
    t = min((e.deadline - one(e) for e in live if e.deadline < math.inf), default=math.inf)
    return t if t < math.inf else None


def margin(entry: QueueEntry) -> float:
    """Seconds a wait for more rows keeps clear of ``entry``'s deadline: :data:`DEADLINE_MARGIN_S`,
    at most :data:`DEADLINE_MARGIN_SHARE` of its budget (deadline − arrival)."""
    return min(DEADLINE_MARGIN_S, DEADLINE_MARGIN_SHARE * (entry.deadline - entry.arrival))


class _OneRow:
    """Least run time of a batch of one row of an entry's length
    (:meth:`~trtserve.batching.latency.LatencyModel.lower_bound`), cached per length."""

    def __init__(self, latency: LatencyModel) -> None:
        self._latency = latency
        self._cache: dict[int, float] = {}

    def __call__(self, entry: QueueEntry) -> float:
        t = self._cache.get(entry.length)
        if t is None:
            t = self._cache[entry.length] = self._latency.lower_bound(1, entry.length)
        return t


def knee(curve: Mapping[int, float], budget: float = math.inf, tolerance: float = 0.05) -> int | None:
    """The knee of a throughput curve (batch size → seconds per batch): the smallest size whose
    rows/s is within ``tolerance`` of the best, among the sizes whose time fits ``budget``
    seconds (the smallest size alone where none does); ``None`` for a curve without a positive
    time."""
    timed = {b: t for b, t in curve.items() if t > 0}
    fits = {b: t for b, t in timed.items() if t <= budget} or dict(sorted(timed.items())[:1])
    if not fits:
        return None
    best = max(b / t for b, t in fits.items())
    return min(b for b, t in fits.items() if b / t >= (1 - tolerance) * best)


def _on_time(
    batch: tuple[tuple[QueueEntry, int], ...], now: float, latency: LatencyModel
) -> tuple[tuple[QueueEntry, int], ...]:
    """The largest batch within ``batch`` whose rows all finish by their deadlines at its
    least run time (:meth:`~trtserve.batching.latency.LatencyModel.lower_bound`): m rows, m as large as there are m rows
    with deadline ≥ now + p_low(m) (found by bisection: that count falls as m grows), taken in
    the selection's order. The rows left out stay queued (a smaller batch on another slot may
    still make it, else they expire unrun): no engine time on answers nobody reads, and under
    overload, when every queued row is near its deadline, the batch shrinks only as far as it
    must instead of to the most urgent row alone. If no row fits at all, the most urgent
    entry runs alone."""
    rows = sum(n for _, n in batch)
    length = max(e.length for e, _ in batch)

    def fitting(m: int) -> int:
        finish = now + latency.lower_bound(m, length)
        return sum(n for e, n in batch if e.deadline >= finish)

    if fitting(rows) >= rows:
        return batch
    lo, hi = 0, rows  # fitting(lo) >= lo; fitting(hi) < hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fitting(mid) >= mid:
            lo = mid
        else:
            hi = mid
    if lo == 0:
        return batch[:1]
    finish = now + latency.lower_bound(lo, length)
    kept: list[tuple[QueueEntry, int]] = []
    room = lo
    for e, n in batch:
        if room and e.deadline >= finish:
            kept.append((e, min(n, room)))
            room -= kept[-1][1]
    return tuple(kept)


def _target_rows(rows: int, length: int, inputs: Inputs, policy: BatchingPolicy, latency: LatencyModel) -> int:
    """The batch size worth waiting for; ``rows`` means go now.

    Adaptive: the smallest n ≥ ``rows`` (at most the cap) at which both resources a batch uses
    keep up with arrivals at λ rows/s, so that running at n does not build a queue that
    waiting would have avoided:

    * the engine: λ·p(n) ≤ n per slot (a slot running batches of n serves n/p(n) rows/s;
      what :attr:`~trtserve.config.BatchingPolicy.adaptive` documents: wait only while the
      engine, at the size queued now, runs fewer rows per second than arrive);
    * the host thread: its other work plus λ·h/n ≤ :data:`HOST_TARGET` (batches of n cost
      h seconds of host CPU each, λ/n of them per second), where the other work is the
      measured busy share less the part the per-batch work explains; when the other work
      alone is past the target, λ·h/n ≤ :data:`HOST_MIN_HEADROOM`.

    The host's target is waited for (its cost is host time that reading requests needs; a
    wait costs it nothing). The engine's alone is waited for only when no size up to the cap
    keeps up (overload: a full batch is the most the slot can do), or when the wait delays no
    queued row: (n − rows)/λ + p(n) ≤ p(rows), as where p dips; otherwise running now is at
    least as good, since the rows arriving meanwhile form the next, larger batch.

    With no arrivals, or both holding at ``rows``, it returns ``rows``: a lone request on an
    idle server runs at once.
    """
    cap = inputs.cap
    if not policy.adaptive:
        if policy.max_queue_delay <= 0:
            return rows
        if policy.preferred_batch_sizes and rows >= policy.preferred_batch_sizes[-1]:
            return rows
        return cap
    rate = inputs.arrival_rate
    if rate <= 0:
        return rows
    host_rows = 1
    if inputs.host_per_batch > 0:
        other = max(inputs.host_share - inputs.host_batch_share, 0.0)
        headroom = max(HOST_TARGET - other, HOST_MIN_HEADROOM)
        host_rows = math.ceil(rate * inputs.host_per_batch / headroom)
    if host_rows > rows:
        return _engine_rows(host_rows, length, inputs, latency)
    n = _engine_rows(rows, length, inputs, latency)
    if n <= rows:
        return rows
    if n == cap and _per_slot_overloaded(cap, length, inputs, latency):
        return cap
    # The engine alone: wait only if the queued rows' answers come no later for it.
    return n if (n - rows) / rate + latency.predict(n, length) <= latency.predict(rows, length) else rows


def _per_slot_overloaded(n: int, length: int, inputs: Inputs, latency: LatencyModel) -> bool:
    """Whether a slot running batches of ``n`` rows falls behind its share of the arrivals."""
    return inputs.arrival_rate / max(inputs.slots, 1) * latency.predict(n, length) > n


def _engine_rows(least: int, length: int, inputs: Inputs, latency: LatencyModel) -> int:
    """The smallest n ≥ ``least`` at which a slot keeps up with its share of the arrivals,
    λ·p(n) ≤ n per slot. Only sizes up to the largest measured row bucket count (beyond it
    the prediction is a guess, proportional to rows after a single measurement); where none of
    them keeps up, the cap if the curve is measured up to it, else ``least`` (no wait on a
    guess)."""
    per_slot = inputs.arrival_rate / max(inputs.slots, 1)
    top = latency.top_rows(length)
    for n in range(least, min(inputs.cap, top) + 1):
        if per_slot * latency.predict(n, length) <= n:
            return n
    return inputs.cap if top >= inputs.cap else least


def _deadline_cap(
    batch: tuple[tuple[QueueEntry, int], ...], live: Sequence[QueueEntry], inputs: Inputs,
    policy: BatchingPolicy, latency: LatencyModel, one: _OneRow, floor: int,
) -> tuple[int, tuple[tuple[QueueEntry, int], ...]]:
    """The batch cap that deadlines allow when this batch takes the last free slot, and the
    batch within it.

    Whatever is not in the batch waits for it and then needs at least a batch of one, so the
    batch's predicted run time p(n) may use at most: for each queued entry left out (of the
    head's priority level or a more urgent one: priorities stay as documented), its slack
    (deadline − now − p(1)) — counted only where that slack covers a batch of one, since an
    entry with less cannot wait for any batch; and for a tight request arriving now, its budget
    (``inputs.tight_budget``) less its :func:`margin` and p(1), again only where that covers a
    batch of one (a model whose batch of one outlasts the tight budgets cannot protect them,
    and batches of one would only lower its throughput), and only where batches that short
    make no more queued rows late than full ones (:func:`_tight_run`). The cap is the largest n whose
    p(n) fits (at least 1), and the batch is selected again under it until nothing more left
    out lowers it (each pass only lowers the cap).

    The cap never goes below ``floor``, the size at which the engine keeps up with the
    measured arrivals (:func:`_engine_rows`): below it the queue grows without bound and every
    deadline suffers (under overload, capping to save one row would run batches of one for
    good and serve fewer rows in time).
    """
    now = inputs.now
    cap = inputs.cap
    length = max(e.length for e, _ in batch)
    head = batch[0][0].priority
    base = _tight_limit(inputs.tight_budget, length, latency)
    rows = sum(n for _, n in batch)
    if max(_rows_within(base, length, latency, rows), floor) < rows:
        # It would shrink this batch (else it shrinks none below): ask whether the backlog bears it.
        base = _tight_run(live, head, inputs, length, latency, floor)
    for _ in range(4):
        taken = {id(e): n for e, n in batch}
        limit = base
        for e in live:
            # Only rows as urgent as the batch's head: a lower priority never shrinks it.
            if e.deadline < math.inf and e.priority <= head and e.rows > taken.get(id(e), 0):
                slack = e.deadline - now - one(e)
                if slack >= latency.lower_bound(1, length):
                    limit = min(limit, slack)
        rows = sum(n for _, n in batch)
        fits = max(_rows_within(limit, length, latency, rows), floor)
        if fits >= rows:
            return cap, batch
        cap = fits
        batch = _on_time(_select(live, now, cap, policy, latency), now, latency)
    return cap, batch


def _tight_run(live: Sequence[QueueEntry], head: int, inputs: Inputs, length: int, latency: LatencyModel,
               floor: int) -> float:
    """The longest run (seconds) a batch may take for a tight request that may arrive while it
    runs (:func:`_tight_limit`), or ``math.inf`` where batches that short (never below ``floor``
    rows, the size at which the engine keeps up with the arrivals) would make more queued rows
    miss their deadlines than batches at the cap (:func:`_late_rows`): a backlog left by a
    burst would miss for the sake of a request that may never come."""
    limit = _tight_limit(inputs.tight_budget, length, latency)
    if limit == math.inf:
        return limit
    short_rows = max(_rows_within(limit, length, latency, inputs.cap), floor)
    short = _late_rows(live, head, inputs, length, latency, short_rows)
    return limit if short <= _late_rows(live, head, inputs, length, latency, inputs.cap) else math.inf


def _late_rows(live: Sequence[QueueEntry], head: int, inputs: Inputs, length: int, latency: LatencyModel,
               n: int) -> int:
    """How many queued rows of priority ``head`` or a more urgent one would finish after their
    deadlines, run in queue order (deadline order within a level) in batches of ``n`` rows padded
    to ``length``, the slots taking the batches in turn from ``inputs.now``, at the batches'
    least run time (an optimistic bound for both sizes alike: a busy slot starts later). A row
    that not even a batch of one could finish in time is not counted: no batch size saves it."""
    run = latency.lower_bound(n, length)
    one = latency.lower_bound(1, length)
    per_round = n * max(inputs.slots, 1)
    ahead = late = 0
    for e in live:
        if e.priority > head:
            continue
        ahead += e.rows
        savable = inputs.now + one <= e.deadline < math.inf
        if savable and inputs.now + -(-ahead // per_round) * run > e.deadline:
            late += e.rows
    return late


def _tight_limit(tight: float, length: int, latency: LatencyModel) -> float:
    """The longest run (seconds) a batch of rows padded to ``length`` may take ahead of a request
    with the tight budget ``tight`` arriving as it starts: the budget less its :func:`margin` and a
    batch of one; ``math.inf`` where that would not cover a batch of one (no cap can help it)."""
    if tight == math.inf:
        return math.inf
    one = latency.lower_bound(1, length)
    base = tight - min(DEADLINE_MARGIN_S, DEADLINE_MARGIN_SHARE * tight) - one
    return base if base >= one else math.inf


def top_up(entries: Sequence[QueueEntry], inputs: Inputs, policy: BatchingPolicy, latency: LatencyModel, *,
           rows: int, length: int, deadline: float, skips: float = 0.0) -> tuple[tuple[QueueEntry, int], ...]:
    """Rows of ``entries`` to add to a staged batch (handed to a busy slot, its run not begun)
    of ``rows`` rows padded to ``length`` whose requests' earliest deadline is ``deadline``.
    Such a batch takes ``skips`` seconds less than the latency model predicts of a batch handed
    to an idle slot: the hop from the event loop to the slot's thread, which it does not wait for.

    ``inputs.now`` is when that batch is predicted to start, ``inputs.cap`` the most rows it may
    hold. The rows are selected as for any batch (:func:`_select`: aging, length bucketing, the
    large request's share, in the room the batch has left), then the longest prefix of that
    selection is kept with which the grown batch is still predicted to finish by every
    member's deadline (old and new) and stays within what a tight request arriving as it
    starts can wait for (:func:`_tight_limit`, waived up to the size at which the engine keeps up
    with the arrivals, as the deadline cap is). Nothing waits here: the batch starts when its
    slot's batch before it returns, whatever joined; a row left out runs in a later batch.
    """
    room = inputs.cap - rows
    one = _OneRow(latency)
    live = [e for e in entries if e.deadline - one(e) >= inputs.now]
    if room <= 0 or not live:
        return ()
    kept: list[tuple[QueueEntry, int]] = []
    selected = _select(live, inputs.now, room, policy, latency)
    protect: dict[int, bool] = {}  # padded length -> whether the tight limit applies, asked once it would bind
    for e, n in selected:
        total, padded = rows + n, max(length, e.length)
        run = latency.predict(total, padded) - skips
        deadline = min(deadline, e.deadline)
        if inputs.now + run > deadline:
            break
        tight = _tight_limit(inputs.tight_budget, padded, latency)
        keep_up = _engine_rows(1, padded, inputs, latency)
        if run > tight and total > keep_up:
            if padded not in protect:
                head = selected[0][0].priority
                protect[padded] = _tight_run(live, head, inputs, padded, latency, keep_up) < math.inf
            if protect[padded]:
                break
        kept.append((e, n))
        rows, length = total, padded
    return tuple(kept)


def _rows_within(limit: float, length: int, latency: LatencyModel, most: int) -> int:
    """The largest n in 1..``most`` whose least run time
    (:meth:`~trtserve.batching.latency.LatencyModel.lower_bound`, as :func:`_on_time` judges a
    batch: a length never measured is not scaled up, else one long row would cap every batch it
    joins at one row) is within ``limit`` seconds (1 if none)."""
    if latency.lower_bound(most, length) <= limit:
        return most
    lo, hi = 1, most  # p(lo) may not fit (then 1); p(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if latency.lower_bound(mid, length) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def _select(
    live: Sequence[QueueEntry], now: float, cap: int, policy: BatchingPolicy, latency: LatencyModel
) -> tuple[tuple[QueueEntry, int], ...]:
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
    if total <= cap:
        return _fill(order, cap)
    urgent_before = now + URGENT_RUNS * latency.predict(cap, order[0].length)
    if not policy.length_bucketing or len({e.length for e in order}) == 1:
        return _fill(order, cap, urgent_before)
    # Length bucketing: the head, then every row near its deadline, then the closest lengths
    # within each level, aged requests counting as a level ahead of all others.
    head = order[0]
    urgent = [e for e in order[1:] if e.deadline <= urgent_before]
    rest = sorted(
        (e for e in order[1:] if e.deadline > urgent_before),
        key=lambda e: (
            (0, 0) if id(e) in seen else (1, e.priority),
            abs(e.length.bit_length() - head.length.bit_length()),
        ),
    )
    return _fill([head, *urgent, *rest], cap, urgent_before)


def _fill(
    order: Sequence[QueueEntry], cap: int, urgent_before: float = -math.inf
) -> tuple[tuple[QueueEntry, int], ...]:
    """Take up to ``cap`` rows from ``order``, each request's from its next row.

    Fair between requests: a request with more rows queued than ``cap`` (one that spans batches
    anyway) at the head's priority level, whose deadline is not near (after ``urgent_before``),
    takes at most half of the batch, :data:`LARGE_SHARE`, in a first pass while later requests of
    that level wait; they take their rows in order; a second pass gives whatever room is left, in
    order (so with nothing else waiting the large request fills the batch). A one-row request
    arriving during a 2 000-row one thus runs in the next batch, and the large one keeps at least
    half of every batch. A request of a more urgent level, or one near its deadline, is never held
    back by this.
    """
    head = order[0].priority if order else 0
    share = max(cap // LARGE_SHARE, 1)
    counts: dict[int, int] = {}
    room, shared = cap, False
    for e in order:
        if room <= 0:
            break
        limit = e.rows
        if e.priority != head and shared:
            continue  # a less urgent level gets only what the head's level leaves (second pass)
        if e.rows > cap and e.priority == head and e.deadline > urgent_before:
            limit, shared = share, True
        n = min(limit, room)
        counts[id(e)] = n
        room -= n
    if room > 0:
        for e in order:
            if room <= 0:
                break
            extra = min(e.rows - counts.get(id(e), 0), room)
            if extra > 0:
                counts[id(e)] = counts.get(id(e), 0) + extra
                room -= extra
    return tuple((e, counts[id(e)]) for e in order if counts.get(id(e), 0) > 0)
