"""Predicted queue drain: when the work queued ahead of a request lets it finish, at the earliest.

Admission (:meth:`Dispatcher.submit <trtserve.batching.dispatcher.Dispatcher.submit>`) refuses a
request that cannot finish by its deadline; the front ends refuse the same before a request
crosses to the engine core, from a :class:`~trtserve.ipc.admission.QueueHint` the engine core
sends back with every answer. Both read one estimate:

* **Rows ahead.** The queue is ordered by (priority, deadline, arrival), so a new request at
  level ``L`` with deadline ``D`` runs after every queued row whose (priority, deadline) is at
  most ``(L, D)``: same or more urgent level, earlier (or equal) deadline. (Aged requests may
  go ahead of it too; they only add work, so they are left out of a lower bound.)
  A request with more rows queued than the cap, at the request's own level, counts only half a
  batch (:data:`~trtserve.batching.policy.LARGE_SHARE`): it shares every batch with the requests
  behind it (step 2 of :mod:`~trtserve.batching.policy`), so the new request's rows start no
  later than its next batch. The hint, which cannot know the request's level, counts every such
  request so (a lower bound still).
* **Their work.** Run time is close to affine in rows with a positive intercept
  (:mod:`~trtserve.batching.latency`), so a full batch is the cheapest per row, and the
  shortest padded length (``length``) among the rows the cheapest per batch; every estimate is
  the low one, as for every refusal
  (:meth:`~trtserve.batching.latency.LatencyModel.lower_bound` says why: a false refusal is
  never measured, so it would not correct itself). Rows of a more urgent level, and the
  request's own, count at the full-batch rate, ``rows × lower_bound(cap, length) / cap``
  slot-seconds (:func:`batch_floor`). Rows ahead at the request's own level run in batches
  that leave the request behind, and the dispatcher caps those (step 3 of
  :mod:`~trtserve.batching.policy`) so that it still has time for a batch of one: they count at
  the rate of the largest such batch, ``lower_bound(n, length) / n`` per row with ``n`` the
  most rows (up to the cap) whose ``p(n) + p(1) ≤ deadline − now`` (:func:`row_cost`,
  :func:`deadline_batch`). So a tight request behind other tight ones is costed at the small
  batches the queue will really run; counted at the full-batch rate, a queue of requests whose
  deadlines no full batch fits would admit more than it can serve in time, and the admitted
  requests would expire in the queue. A more urgent level is not capped by a less urgent
  request (the dispatcher never shrinks a batch for a lower priority), and without a deadline
  there is no cap.
* **Over the slots.** Each execution slot is free at ``now``, or when its running batch ends
  at the earliest (its start plus the low estimate of its rows, not before ``now``). Work ``W``
  spread over slots free at ``f_1 <= ... <= f_k`` is done, at the earliest, at the time ``S``
  with ``Σ max(0, S - f_i) = W`` (:func:`fill`: water filling; no schedule of whole batches
  does better).

The request's *queue wait* is ``fill(rows ahead) - now``; it finishes at the earliest at
``max(fill(rows ahead + its rows), f_1 + run)``, where ``run = lower_bound(min(rows, cap),
length)`` is the least its own first batch takes (no batch of its rows starts before a slot
is free). An idle server needs ``now + run``: a deadline before that is hopeless
(:class:`~trtserve.errors.DeadlineUnmeetable`, DEADLINE_EXCEEDED).

* **Behind others, the slow end.** Where rows are queued ahead or a slot is busy, the request is
  admitted only if it also finishes in time at the slow end of the measured run times: every
  time after ``now`` above (the running batches' ends, the work ahead, its own run) scaled by
  :meth:`~trtserve.batching.latency.LatencyModel.spread` at a full batch, about the 98th
  percentile over the 2nd (at most the latency model's clip, 3); a deadline before that is
  :class:`~trtserve.errors.Overloaded`
  (RESOURCE_EXHAUSTED: retry elsewhere). Admitting on the fast end alone fills the queue up to
  where only a fast run makes every deadline; a typical run then finishes late, and under
  overload the queue stays at that limit, so most answers came late: on the simulator with a
  minilm-like engine whose run times vary (lognormal, σ 0.3), 44 % of the engine's time at 2×
  capacity went to rows that finished late, and goodput at 3× was 0.77 of its peak (1.07 with
  the slow end; noiseless runs are unchanged: their spread is 1). This refusal cannot stick the
  way one on a single measurement could: the rows ahead run, and are measured, and a server
  with none refuses only on the fast end.

The hint's times are absolute (monotonic seconds) and count every row at the full-batch rate
(its points cannot know the deadline of the request they will be compared with): rows that
arrive later only add work and rows that run take their time, so a hint stays a lower bound as
it ages, and the engine core's admission, which knows the request, refines it. Rows cancelled or
expired since make it high; it still refuses nothing past its own ``done_at`` times, and every
answer brings a fresh one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import LARGE_SHARE
from trtserve.batching.queue import QueueEntry, RequestQueue
from trtserve.config import BatchingPolicy
from trtserve.errors import DeadlineUnmeetable, Overloaded, TrtServeError
from trtserve.ipc.admission import QueueHint

HINT_POINTS = 16
"""Most queue positions a :class:`~trtserve.ipc.admission.QueueHint` samples (it goes out with every answer)."""
HINT_REFRESH_S = 0.001
"""A dispatcher recomputes its hint at most this often (seconds): an O(queue) walk."""
FULL_HORIZON_S = 0.005
"""With a slot idle, a hint says a full queue stays full for at most this long (seconds): a
cancelled entry frees room without an answer, and each refused request brings a fresh hint."""


def batch_floor(latency: LatencyModel, cap: int, length: int) -> float:
    """Least run time (seconds) of a batch of ``cap`` rows padded to ``length``: the latency
    model's low estimate at ``cap`` rows, but above the largest row bucket measured at that
    length no more than there. (Beyond its measurements the model extrapolates, in proportion
    to rows after a single one, which is no lower bound: a batch of more rows takes at least as
    long, and no more is known.)"""
    low = latency.lower_bound(cap, length)
    top = latency.top_rows(length)
    return min(low, latency.lower_bound(top, length)) if 0 < top < cap else low


def deadline_batch(latency: LatencyModel, cap: int, length: int, budget: float) -> int:
    """The most rows (1..``cap``) of a batch padded to ``length`` whose low run time leaves a
    batch of one after it within ``budget`` seconds: ``p(n) + p(1) ≤ budget`` (1 when even two
    batches of one do not fit; ``cap`` for ``budget = math.inf``). Run time grows with rows, so
    a bisection finds it."""
    one = latency.lower_bound(1, length)
    low, high = 1, cap
    while low < high:
        mid = (low + high + 1) // 2
        if latency.lower_bound(mid, length) + one <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def row_cost(latency: LatencyModel, cap: int, length: int, budget: float) -> float:
    """Least slot-seconds one queued row padded to ``length`` costs when the deadline ``budget``
    seconds away lets batches of :func:`deadline_batch` rows run (see the module docstring)."""
    rows = deadline_batch(latency, cap, length, budget)
    return batch_floor(latency, rows, length) / rows


def fill(free_at: Sequence[float], work: float) -> float:
    """When slots that become free at ``free_at`` (monotonic seconds, ascending, at least one)
    have done ``work`` slot-seconds between them, at the earliest (water filling: the time
    ``S`` with ``Σ max(0, S - f_i) = work``)."""
    total = 0.0
    for j, f in enumerate(free_at, 1):
        total += f
        level = (work + total) / j
        if j == len(free_at) or level <= free_at[j]:
            return level
    raise ValueError("fill() needs at least one slot")


class SlotEnds:
    """When each execution slot's running batch ends at the earliest (monotonic seconds).

    Args:
        slots: execution slots of the model.
    """

    def __init__(self, slots: int) -> None:
        self._ends = [0.0] * slots

    def started(self, slot: int, now: float, low: float, *, staged: bool = False) -> None:
        """A batch whose low run-time estimate is ``low`` seconds started on ``slot`` at ``now``,
        or with ``staged``, was handed to it at ``now`` to run after the slot's current work."""
        self._ends[slot] = (max(self._ends[slot], now) if staged else now) + low

    def extend(self, slot: int, seconds: float) -> None:
        """The staged batch on ``slot`` grew: its low run-time estimate is ``seconds`` longer."""
        self._ends[slot] += seconds

    def free_at(self, now: float, idle: Collection[int]) -> list[float]:
        """Per slot, ascending: ``now`` if idle (or past its estimate), else its batch's earliest end."""
        return sorted(now if slot in idle else max(end, now) for slot, end in enumerate(list(self._ends)))


@dataclass(frozen=True)
class Wait:
    """A request's predicted wait (monotonic seconds; see the module docstring).

    Attributes:
        now: when it was predicted.
        start: when the rows queued ahead of it are done (its queue wait ends), at the slow end
            of the run times where any are (``now`` for none).
        finish: when its own rows are done: at the earliest on an idle server, else at the
            slow end.
        alone: when its rows would be done on an idle server, at the earliest.
    """

    now: float
    start: float
    finish: float
    alone: float

    def refusal(self, deadline: float) -> TrtServeError | None:
        """The error refusing a request with ``deadline`` (monotonic seconds), or ``None`` to admit
        it: DeadlineUnmeetable (DEADLINE_EXCEEDED) if even an idle server is too slow, Overloaded
        (RESOURCE_EXHAUSTED) if the queue ahead is."""
        remaining = max(deadline - self.now, 0.0) * 1e3
        if deadline < self.alone:
            return DeadlineUnmeetable(
                f"the request's deadline ({remaining:.1f} ms away) comes before it could run: even on an idle "
                f"server its rows take at least {(self.alone - self.now) * 1e3:.1f} ms"
            )
        if deadline < self.finish:
            return Overloaded(
                f"overloaded: predicted queue wait {(self.start - self.now) * 1e3:.1f} ms, then at least "
                f"{(self.finish - self.start) * 1e3:.1f} ms to run, exceeds the request's remaining "
                f"{remaining:.1f} ms deadline; retry on another server or later"
            )
        return None


def predict(entries: Sequence[QueueEntry], priority: float, deadline: float, rows: int, length: int, *,
            now: float, free_at: Sequence[float], cap: int, latency: LatencyModel) -> Wait:
    """The :class:`Wait` of a request of ``rows`` rows padded to ``length``, queued at
    ``priority`` with ``deadline`` behind ``entries`` (the queue, in its order), with slots
    free at ``free_at`` and batches of at most ``cap`` rows (see the module docstring).
    ``priority=math.inf`` puts it behind everything, and ``rows=0`` gives the drain time of
    the whole queue as ``start``."""
    urgent, level, shortest = 0, 0, length if rows else math.inf
    share = max(cap // LARGE_SHARE, 1)
    for entry in entries:
        if (entry.priority, entry.deadline) > (priority, deadline):
            break
        if entry.priority < priority:
            urgent += entry.rows
        elif rows and entry.rows > cap:
            level += share  # a large request ahead shares each batch with this one (policy._fill)
        else:
            level += entry.rows
        shortest = min(shortest, entry.length)
    full = capped = 0.0
    if urgent + level + rows:
        full = batch_floor(latency, cap, int(shortest)) / cap
        capped = row_cost(latency, cap, int(shortest), deadline - now) if level else full
    ahead = urgent * full + level * capped
    run = batch_floor(latency, min(max(rows, 1), cap), length)
    alone = now + run
    if urgent + level or free_at[0] > now:  # behind others: at the slow end (module docstring)
        slow = latency.spread(cap, int(shortest) if shortest < math.inf else length)
        free_at = [now + (f - now) * slow for f in free_at]
        ahead, full, run = ahead * slow, full * slow, run * slow
    return Wait(now, fill(free_at, ahead), max(fill(free_at, ahead + rows * full), free_at[0] + run), alone)


def queue_hint(
    queue: RequestQueue, policy: BatchingPolicy, *, now: float, free_at: Sequence[float], cap: int,
    latency: LatencyModel, next_look: float | None = None,
) -> QueueHint:
    """The :class:`~trtserve.ipc.admission.QueueHint` of ``queue`` now (one walk over it;
    :data:`HINT_POINTS` samples).

    A level at its ``max_queue_size`` is full until the first slot frees up, or, with a slot
    idle, until ``next_look`` (monotonic seconds: when the dispatcher decides again, e.g. a
    fixed queue delay's end), at most :data:`FULL_HORIZON_S` ahead and only when every level
    holding rows is full (a request at another level could start a batch sooner); in either
    case no later than its first entry's expiry."""
    entries = list(queue.entries)
    step = max(1, math.ceil(len(entries) / HINT_POINTS))
    points: list[tuple[int, float, float]] = []
    rows, shortest = 0, math.inf
    share = max(cap // LARGE_SHARE, 1)
    for i, entry in enumerate(entries):
        rows += entry.rows if entry.rows <= cap else share  # a large request shares (policy._fill)
        shortest = min(shortest, entry.length)
        if (i + 1) % step == 0 or i == len(entries) - 1:
            done = fill(free_at, rows * batch_floor(latency, cap, int(shortest)) / cap)
            points.append((entry.priority, entry.deadline, done))
    full_levels = [level for level, queued in list(queue.per_level.items())
                   if queued and 0 < policy.queue_policy(level).max_queue_size <= queued]
    moves_at = free_at[0]
    if moves_at <= now:  # a slot is idle: the queue moves at the dispatcher's next look
        every_level_full = len(full_levels) == sum(1 for queued in queue.per_level.values() if queued)
        moves_at = min(next_look, now + FULL_HORIZON_S) if next_look is not None and every_level_full else now
    full: list[tuple[int, float]] = []
    if moves_at > now:
        for level in full_levels:
            expiry = min((e.deadline - latency.lower_bound(1, e.length) for e in entries if e.level == level),
                         default=math.inf)
            full.append((level, min(moves_at, expiry)))
    return QueueHint(latency.lower_bound(1, 1), policy, free_at[0], tuple(points), tuple(full), cap)


__all__ = ["FULL_HORIZON_S", "HINT_POINTS", "HINT_REFRESH_S", "SlotEnds", "Wait", "batch_floor", "deadline_batch",
           "fill", "predict", "queue_hint", "row_cost"]
