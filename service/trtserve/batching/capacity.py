"""How many requests a front end may usefully hold in flight: measured capacity × useful wait.

A request beyond ``capacity × wait`` would wait longer than ``wait`` behind the ones already
admitted, past any deadline it may have, so it is better refused at once: the front end's
admission (``trtserve serve --max-inflight-rpcs``,
:class:`~trtserve.frontend.inflight.InflightGate`) answers it RESOURCE_EXHAUSTED before its
tensors are decoded. The bound is trtserve's, not grpc's ``maximum_concurrent_rpcs``: that one
counts every RPC, so under overload it would refuse health checks and ModelStatistics too (an
orchestrator's probe failing on a busy server restarts it), and it is fixed when a server is
made. Refusing in grpc's own layer would not save much either: in grpc.aio a call refused there
costs the server nearly as much CPU as one refused by trtserve's handler or answered empty.

Per model (:func:`inflight_rows`):

* **capacity**: the best rows per second of the warm-up latency curve (the latency model's
  predicted run time per measured batch size, at the shortest measured padded length), times
  the execution slots;
* **useful wait**: the longest ``default_timeout`` of the model's priority levels: no request
  of the model waits longer (its deadline is the earliest of its own and that default).
* A level without a default timeout (or whose ``allow_timeout_override`` lets a request ask
  for more) admits requests that may wait as long as they like: the server cannot tell when
  holding one stops being useful. Then the model's bound is its queue sizes
  (``max_queue_size`` of every level) if they are all set, and otherwise there is none — and
  so no bound for the front end (the queue-wait admission of :mod:`~trtserve.batching.wait`
  still refuses what carries a deadline it cannot meet).

The server's bound is the sum over its models plus one full batch per slot running, recomputed
whenever the models served change. It is the same for each front end, since the kernel may hand
one front end all the connections. Rows stand for requests here (a request carries one row or
more), so the bound errs on the side of admitting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from trtserve.batching.dispatcher import Dispatcher


def best_rows_per_second(dispatcher: Dispatcher) -> float:
    """The model's best measured throughput, rows per second over all slots (0 before any batch)."""
    lengths = dispatcher.latency.lengths
    if not lengths:
        return 0.0
    curve = dispatcher.latency.curve(lengths[0])
    best = max((rows / seconds for rows, seconds in curve.items() if seconds > 0), default=0.0)
    return best * dispatcher.backend.slots


def inflight_rows(dispatcher: Dispatcher) -> float | None:
    """Rows of one model worth holding at once: its capacity × useful wait (or its queue sizes),
    plus one full batch per slot; ``None`` for no bound (see the module docstring)."""
    policy = dispatcher.policy
    levels = range(1, policy.priority_levels + 1) if policy.priority_levels else [policy.default_priority]
    queues = [policy.queue_policy(level) for level in levels]
    running = dispatcher.backend.slots * dispatcher.cap.value
    if all(math.isfinite(q.default_timeout) and not q.allow_timeout_override for q in queues):
        return best_rows_per_second(dispatcher) * max(q.default_timeout for q in queues) + running
    if all(q.max_queue_size for q in queues):
        return sum(q.max_queue_size for q in queues) + running
    return None


def inflight_bound(dispatchers: Iterable[Dispatcher]) -> int | None:
    """The in-flight request bound of a front end of a server with these models (at least 1), or
    ``None`` where a model admits requests that may wait without limit, or no model is served
    (then a request gets NOT_FOUND or UNAVAILABLE, not a refusal for being one too many)."""
    total, served = 0.0, False
    for dispatcher in dispatchers:
        served = True
        rows = inflight_rows(dispatcher)
        if rows is None:
            return None
        total += rows
    return max(1, math.ceil(total)) if served else None


__all__ = ["best_rows_per_second", "inflight_bound", "inflight_rows"]
