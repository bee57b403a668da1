"""Discrete-event simulation of the real dispatcher on a fake clock (``trtserve simulate``).

The real :class:`~trtserve.batching.dispatcher.Dispatcher` runs unchanged; only time, the
engine and the host are simulated, by the doubles of :mod:`trtserve.testing`.
:class:`~trtserve.testing.FakeBackend` takes ``latency(rows)`` seconds of fake time per batch
(e.g. a + b·rows, measured or given); arrivals follow a Poisson or bursty trace, each request
one row (or a given number of rows) with its own deadline. Every policy sees the same trace, so
the comparison is exact and repeatable: goodput (answers within their deadline per second), deadline-miss rate (also
per deadline budget), engine time spent on rows that finished after their deadline (trtserve
must spend none), mean batch size and latency percentiles.

**Host cost** (:class:`~trtserve.testing.FakeHost`): one shared host thread, as the event
loop is in the server. It reads the requests one at a time, in arrival order (``per_request``
seconds each before the dispatcher sees it), and does each batch's per-batch work
(``per_batch`` seconds) as soon as the read in progress ends, before the batch's engine run
starts and before the next read. The dispatcher's :class:`~trtserve.batching.host.HostMeter`
reads the host's busy time as its CPU counter, so the policy learns the host cost as it does
in the server. A request whose deadline has passed before the host reaches it is dropped
unread (a gRPC call past its deadline is cancelled); no other shedding happens in front of the
dispatcher.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtserve.batching.dispatcher import Dispatcher
from trtserve.batching.host import HostMeter
from trtserve.batching.latency import LatencyModel
from trtserve.config import BatchingPolicy
from trtserve.errors import TrtServeError
from trtserve.testing import FakeBackend, FakeClock, FakeHost, HostCost, settle


def poisson_trace(rate: float, duration: float, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds) of a Poisson process of ``rate`` per second over ``duration``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * duration * 1.2) + 10)
    times = np.cumsum(gaps)
    return times[times < duration]


def bursty_trace(
    rate: float, duration: float, period: float = 0.1, duty: float = 0.25, seed: int = 0
) -> np.ndarray:
    """Arrivals of mean ``rate`` per second, all in the first ``duty`` of each ``period``
    (Poisson at ``rate / duty`` inside the bursts)."""
    t = poisson_trace(rate / duty, duration * duty, seed)
    cycle = np.floor(t / (period * duty))
    return np.sort(cycle * period + (t - cycle * period * duty))


@dataclass(frozen=True)
class SimResult:
    """Outcome of one policy on one trace.

    Attributes:
        requests: requests in the trace.
        goodput: requests answered within their deadline, per second of trace.
        miss_rate: fraction not answered within their deadline (refused, expired or late).
        late_engine_seconds: engine time spent on rows that finished after their deadline.
        ran_after_deadline: rows whose batch *started* after their deadline (must be 0).
        mean_batch: mean rows per engine run.
        p50_ms, p99_ms: latency percentiles of the requests answered, milliseconds.
        miss_by_budget: deadline budget (ms) → fraction of the requests with that budget
            not answered within it.
        host_per_batch_ms: the host cost per batch the dispatcher learned, milliseconds.
    """

    requests: int
    goodput: float
    miss_rate: float
    late_engine_seconds: float
    ran_after_deadline: int
    mean_batch: float
    p50_ms: float
    p99_ms: float
    miss_by_budget: dict[float, float] = field(default_factory=dict)
    host_per_batch_ms: float = 0.0


async def simulate(
    policy: BatchingPolicy,
    arrivals: Sequence[float],
    *,
    deadline: float | Sequence[float],
    latency: Callable[[int], float],
    slots: int = 1,
    host: HostCost | None = None,
    rows: int = 1,
    handoff: float = 0.0,
) -> SimResult:
    """Run ``arrivals`` (seconds, ascending) through a dispatcher with ``policy``.

    Args:
        deadline: each request's budget after its arrival (seconds): one for all, or one each.
        latency: engine seconds of a batch of n rows, ``latency(n)``.
        host: host cost (:class:`HostCost`); ``None`` for a free host.
        rows: rows in each request (a request is answered when its last row has run).
        handoff: seconds each hop between the event loop and a slot's thread takes, each way
            (:class:`~trtserve.testing.FakeBackend`; 2.8–3.3 ms a batch both ways on 2 busy cores).

    The dispatcher's latency model is seeded with the engine's run time at powers of two up
    to ``max_batch_size``, as the server's warm-up profile does (with a host, plus its
    per-batch cost and both hops: the server measures the run as the dispatcher waits for it).
    """
    clock = FakeClock(0.0)
    sim_host = FakeHost(clock, host) if host else None
    engine = FakeBackend(clock, slots=slots, latency=latency, host=sim_host, handoff=handoff)
    model = LatencyModel()
    size = 1
    while size <= policy.rows_per_batch:
        model.observe(size, latency(size) + (host.per_batch if host else 0.0) + 2 * handoff)
        size *= 2
    meter = HostMeter(sim_host.cpu) if sim_host else HostMeter(lambda: 0.0)
    dispatcher = Dispatcher(engine, policy, clock=clock, latency=model, host=meter)
    dispatcher.start()
    done: dict[int, float] = {}
    budgets = np.broadcast_to(np.asarray(deadline, dtype=float), (len(arrivals),))
    due = [t + b for t, b in zip(arrivals, budgets)]

    def submit(i: int) -> None:
        try:
            future = dispatcher.submit([{"x": np.full((rows, 1), i, dtype=np.float32)}], deadline=due[i])
        except TrtServeError:
            return
        future.add_done_callback(lambda f: _finished(f, i, clock, done))

    unread: deque[int] = deque()
    arrived = asyncio.Event()

    async def read() -> None:
        # The host reads one request at a time; per-batch work charged meanwhile delays the next.
        assert sim_host is not None and host is not None
        while True:
            while not unread:
                arrived.clear()
                await arrived.wait()
            i = unread.popleft()
            if sim_host.start_of(host.per_request) >= due[i]:
                continue  # its deadline passed unread: the call is cancelled
            await clock.sleep_until(sim_host.charge(host.per_request))
            submit(i)

    reader = asyncio.get_running_loop().create_task(read()) if sim_host else None
    for i, t in enumerate(arrivals):
        await clock.advance(max(t - clock.now(), 0.0))
        if reader is None:
            submit(i)
        else:
            unread.append(i)
            arrived.set()
    while (dispatcher.idle_slots < slots or len(dispatcher.queue) or unread
           or (sim_host and sim_host.free_at > clock.now())):
        await clock.advance(max(latency(policy.rows_per_batch), 1e-3))
    if reader is not None:
        reader.cancel()
    await dispatcher.aclose()
    await settle()

    latencies = np.array([done[i] - arrivals[i] for i in done]) * 1e3
    on_time = {i for i in done if done[i] <= due[i] + 1e-12}
    late_seconds = 0.0
    started_late = 0
    for start, batch in engine.batches:
        end = batch.ran[1]  # (a batch withdrawn before its start never ran, and is not here)
        ids = [int(p["x"][r, 0]) for p in batch.parts for r in range(len(p["x"]))]
        late = [i for i in ids if end > due[i] + 1e-12]
        late_seconds += (end - start) * len(late) / len(ids)
        started_late += sum(1 for i in ids if start > due[i])
    span = max(arrivals[-1] - arrivals[0], 1e-9) if len(arrivals) > 1 else 1.0
    n = len(arrivals)
    by_budget: dict[float, float] = {}
    for b in np.unique(budgets):
        members = np.flatnonzero(budgets == b)
        by_budget[round(float(b) * 1e3, 6)] = 1 - sum(1 for i in members if i in on_time) / len(members)
    return SimResult(
        requests=n,
        goodput=len(on_time) / span,
        miss_rate=1 - len(on_time) / n if n else 0.0,
        late_engine_seconds=late_seconds,
        ran_after_deadline=started_late,
        mean_batch=dispatcher.stats.mean_batch_size,
        p50_ms=float(np.percentile(latencies, 50)) if len(latencies) else math.nan,
        p99_ms=float(np.percentile(latencies, 99)) if len(latencies) else math.nan,
        miss_by_budget=by_budget,
        host_per_batch_ms=dispatcher.host_overhead_s * 1e3,
    )


def _finished(future: asyncio.Future, i: int, clock: FakeClock, done: dict[int, float]) -> None:
    if not future.cancelled() and future.exception() is None:
        done[i] = clock.now()
