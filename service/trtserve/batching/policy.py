"""The dispatch decision: a pure function of the queue, the time and the latency model.

:func:`decide` implements the dispatch policy of ``../shared/DESIGN.md``:

1. Every queued request whose deadline is earlier than ``now`` plus the predicted run time of a
   batch of one is *expired*: it can no longer be answered in time (at that exact moment, only
   if no slot is free to start it).
2. Rows are taken in (priority, deadline, arrival) order up to ``max_batch_size``.
3. With a free slot the batch goes now if it is full, if ``max_queue_delay`` is zero (never
   wait on a timer), if it reached the largest preferred batch size, or if waiting any longer
   would make a row of it miss its deadline given the predicted run time of a full batch.
4. Otherwise the decision is to wait until the first of: the oldest row reaching
   ``max_queue_delay``, the deadline slack running out (an arrival or a freed slot wakes the
   dispatcher sooner).

It reads no clock and changes nothing; the dispatcher applies the :class:`Decision`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import BatchingPolicy
from .queue import QueueEntry


@dataclass(frozen=True)
class Decision:
    """What the dispatcher does now.

    Attributes:
        expired: queued entries that can no longer meet their deadline (to reject, or to
            move behind everything else under ``TimeoutAction.DELAY``).
        run_rows: rows to take off the front of the queue and run now on a free slot;
            0 for none.
        wake_at: when to decide again if no request arrives and no slot frees up first
            (monotonic seconds); ``None`` to wait for one of those events alone.
    """

    expired: tuple[QueueEntry, ...] = ()
    run_rows: int = 0
    wake_at: float | None = None


def decide(
    entries: Sequence[QueueEntry],
    now: float,
    free_slots: int,
    policy: BatchingPolicy,
    predict: Callable[[int], float],
) -> Decision:
    """Decide what to do with a model's queue at time ``now``.

    Args:
        entries: the queue, in (priority, deadline, arrival) order, each with rows queued.
        now: the current time (monotonic seconds).
        free_slots: execution slots idle now.
        policy: the model's batching policy.
        predict: predicted run time in seconds of a batch of the given number of rows.
    """
    one = predict(1)
    # At the last moment (deadline == now + one) a request can still start if a slot is free.
    latest = now + one
    expired = tuple(e for e in entries if e.deadline < latest or (e.deadline == latest and free_slots <= 0))
    live: Sequence[QueueEntry] = entries
    if expired:
        gone = {id(e) for e in expired}
        live = [e for e in entries if id(e) not in gone]
    next_expiry = min((e.deadline for e in live), default=math.inf) - one
    expiry_wake = next_expiry if next_expiry < math.inf else None
    if not live or free_slots <= 0:
        return Decision(expired, 0, expiry_wake)

    cap = policy.rows_per_batch
    rows = 0
    batch_deadline = math.inf
    for entry in live:
        rows += entry.rows
        batch_deadline = min(batch_deadline, entry.deadline)
        if rows >= cap:
            break
    rows = min(rows, cap)

    if rows >= cap or policy.max_queue_delay <= 0:
        return Decision(expired, rows, None)
    if policy.preferred_batch_sizes and rows >= policy.preferred_batch_sizes[-1]:
        return Decision(expired, rows, None)
    oldest = min(e.arrival for e in live)
    wait_until = min(oldest + policy.max_queue_delay, batch_deadline - predict(cap))
    if wait_until <= now:
        return Decision(expired, rows, None)
    wake = wait_until if expiry_wake is None else min(wait_until, expiry_wake)
    return Decision(expired, 0, wake)
