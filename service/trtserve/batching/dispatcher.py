"""The per-model dispatcher: one asyncio task that turns the queue into engine batches.

The loop is: snapshot → :func:`~trtserve.batching.policy.decide` → act → wait for an arrival,
a freed slot or the decision's wake time. All queue state lives on the event loop, so there
are no locks; the only thread crossing is the runtime's ``run`` of one batch on one slot.

Lifecycle: :meth:`Dispatcher.start`, then :meth:`Dispatcher.submit` from request handlers,
then :meth:`Dispatcher.aclose`, which refuses new work, lets everything queued and running
finish, and stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from trtserve.batching.budgets import DeadlineBudgets
from trtserve.batching.host import HostMeter
from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import Hold, Inputs, adaptive_cap, decide, ends_hold
from trtserve.batching.queue import Piece, QueueEntry, RequestQueue
from trtserve.batching.rate import ArrivalRate
from trtserve.batching.stats import DispatchStats
from trtserve.batching.wait import HINT_REFRESH_S, SlotEnds, Wait, predict, queue_hint
from trtserve.clock import Clock, MonotonicClock
from trtserve.config import BatchingPolicy, TimeoutAction
from trtserve.datatypes import Tensors
from trtserve.errors import BackendError, RequestTimeout, ShuttingDown, TrtServeError
from trtserve.ipc.admission import QueueHint
from trtserve.runtimes.base import Abortable, Backend, Batch, RunsInline, unpack

log = logging.getLogger(__name__)

# With adaptive_batch_size, the cap is recomputed from the latency curve every this many batches.
CAP_REFRESH_BATCHES = 16
# A batch still running after HANG_FACTOR times its predicted run time, and at least HANG_MIN_S
# seconds, marks its slot unhealthy (until it returns) and is aborted where the backend can
# (trtserve.runtimes.base.Abortable: a Python model's worker process is killed and started
# again).
HANG_FACTOR = 20.0
HANG_MIN_S = 10.0
INLINE_RUN_S = 0.5e-3
"""A batch the latency model predicts to run within this many seconds runs on the event loop
itself where the backend can (:class:`~trtserve.runtimes.base.RunsInline`): handing a batch to
the slot's thread and back (an executor job, the cross-thread wake-up of the loop, a future and
a task) costs about 0.1 ms of CPU here, as much as such a run, and a run measured through the
thread includes that hand-off's wall time (so the bound sits above it). The loop is held no
longer than the run. A batch predicted longer, any before the latency model has measured one, and
every batch of a model with several slots (whose batches are meant to run at the same time) goes
to a slot's thread."""


class Dispatcher:
    """Batches the requests of one model onto the execution slots of its backend.

    Invariants: every queued entry has rows left to take; a slot index is either in
    ``_idle`` or running exactly one batch; an entry's future is resolved once, after its last
    running piece finished and no rows are queued (or at once on error, cancellation or
    expiry). Touched only from the event loop thread.

    Args:
        backend: the engine.
        policy: the model's batching policy.
        clock: time source (a :class:`~trtserve.clock.FakeClock` in tests).
        latency: predicted run times; learned from every batch run here.
        stats: counters for metrics and ModelStatistics.
        host: per-batch host CPU and the loop thread's busy share. By default it reads
            :func:`time.thread_time` of the loop thread with the production clock, and a
            counter that never moves with any other clock (CPU time against fake time would
            make fake-clock tests depend on the machine); the simulator passes its host's.
    """

    def __init__(
        self,
        backend: Backend,
        policy: BatchingPolicy,
        *,
        clock: Clock | None = None,
        latency: LatencyModel | None = None,
        stats: DispatchStats | None = None,
        host: HostMeter | None = None,
    ) -> None:
        self.backend = backend
        # Whether short batches may run on the loop (INLINE_RUN_S): decided once, not per batch.
        self._inline = isinstance(backend, RunsInline) and backend.slots == 1
        self.policy = policy
        self.clock = clock or MonotonicClock()
        self.latency = latency or LatencyModel()
        self.stats = stats or DispatchStats()
        self.queue = RequestQueue()
        self.arrivals = ArrivalRate()
        self.host = host or HostMeter(time.thread_time if isinstance(self.clock, MonotonicClock) else _no_cpu)
        self.budgets = DeadlineBudgets()
        self.cap = policy.rows_per_batch
        self._idle = list(range(backend.slots))
        self._running: set[asyncio.Task[None]] = set()
        self._inflight: dict[QueueEntry, None] = {}  # entries with rows in a running batch
        self._hang_at: dict[int, tuple[float, float]] = {}  # running slot -> (started, counts as hung at)
        self._launch_cpu: dict[int, float] = {}  # slot -> host CPU of deciding and launching its batch
        self.unhealthy_slots: set[int] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._ends = SlotEnds(backend.slots)  # admission's view of the running batches
        self._hint: QueueHint | None = None
        self._hint_at = -math.inf
        self._next_look: float | None = None  # when the loop decides again with no arrival (None: at once)
        self._hold: Hold | None = None  # which arrivals wake the waiting loop (None: every one)
        self._held_rows = 0  # rows arrived since the loop began its wait

    # -- public API ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the dispatch loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="dispatcher")

    def submit(
        self,
        segments: list[Tensors],
        *,
        priority: int = 0,
        deadline: float = math.inf,
    ) -> asyncio.Future[list[Tensors]]:
        """Queue a request's engine rows. Returns at once; never blocks.

        Args:
            segments: engine-input name → array with rows on axis 0, one dict per segment;
                at least one row in all.
            priority: 1 is the most urgent; 0 means the policy's default level.
            deadline: monotonic seconds by which the answer is needed; ``math.inf`` for none.

        Returns:
            A future of one output dict per segment (outputs cut back to each segment's
            rows). Cancelling it takes the request out of the queue at once.

        Raises:
            ShuttingDown (UNAVAILABLE): the dispatcher is closing (retryable elsewhere).
            QueueFull (RESOURCE_EXHAUSTED): the queue is at ``max_queue_size`` (retryable).
            Overloaded (RESOURCE_EXHAUSTED): an idle server could meet the deadline, but the
                rows queued ahead of this request and the running batches leave no time
                (:mod:`~trtserve.batching.wait`; the message gives the predicted wait in ms).
            DeadlineUnmeetable (DEADLINE_EXCEEDED): the deadline cannot be met even by its
                rows run now on an idle slot (the latency model's low estimate).
        """
        if self._closing:
            raise ShuttingDown("the server is shutting down and accepts no new requests")
        now = self.clock.now()
        level = self.policy.level(priority)
        future: asyncio.Future[list[Tensors]] = asyncio.get_running_loop().create_future()
        entry = QueueEntry(segments, level, level, deadline, now, future)
        # Without a deadline nothing can be refused on time: skip the walk over the queue.
        refusal = (
            self.predict_wait(level, deadline, entry.rows, entry.length).refusal(deadline)
            if deadline < math.inf else None
        )
        if refusal is not None:
            if isinstance(refusal, RequestTimeout):
                self.stats.expired_before_run += 1
            raise refusal
        self.queue.push(entry, self.policy.queue_policy(level).max_queue_size)
        self.arrivals.observe(now, entry.rows)
        self.budgets.observe(deadline - now)
        future.add_done_callback(lambda _f: self._on_done(entry))
        if self._hold is not None:
            # An arrival that cannot change the loop's wait costs no decision.
            self._held_rows += entry.rows
            if not ends_hold(self._hold, entry, self._held_rows, self.latency):
                return future
            self._hold = None
        self._next_look = None  # the loop decides again at once
        self._wake.set()
        return future

    def predict_wait(self, priority: float, deadline: float, rows: int, length: int = 1) -> Wait:
        """The predicted wait of a request of ``rows`` rows padded to ``length`` arriving now at
        level ``priority`` with ``deadline`` (monotonic seconds): see
        :func:`~trtserve.batching.wait.predict`. ``priority=math.inf``: behind everything queued
        (the drain time of the queue)."""
        now = self.clock.now()
        return predict(self.queue.entries, priority, deadline, rows, length, now=now,
                       free_at=self._ends.free_at(now, self._idle), cap=self.cap, latency=self.latency)

    def hint(self) -> QueueHint:
        """The queue as front ends see it (:class:`~trtserve.ipc.admission.QueueHint`), at
        most :data:`~trtserve.batching.wait.HINT_REFRESH_S` old."""
        now = self.clock.now()
        if self._hint is None or now - self._hint_at > HINT_REFRESH_S:
            self._hint_at = now
            self._hint = queue_hint(self.queue, self.policy, now=now, free_at=self._ends.free_at(now, self._idle),
                                    cap=self.cap, latency=self.latency, next_look=self._next_look)
        return self._hint

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Replace the batching policy; it applies from the next decision on. Queued and
        running requests are kept (a smaller ``max_queue_size`` only refuses new ones).

        Raises:
            ValueError: the new policy moves ``max_batch_size`` between 0 and > 0 (the model's
                tensors would change rank).
        """
        if (policy.max_batch_size == 0) != (self.policy.max_batch_size == 0):
            raise ValueError("max_batch_size cannot change between 0 (no batch dimension) and > 0 at run time")
        self.policy = policy
        self.cap = policy.rows_per_batch if not policy.adaptive_batch_size else min(self.cap, policy.rows_per_batch)
        self._wake.set()

    @property
    def healthy(self) -> bool:
        """False while every slot is running a batch that hung (see :data:`HANG_FACTOR`), including
        while an aborted one is being made ready again."""
        return len(self.unhealthy_slots) < self.backend.slots

    @property
    def host_overhead_s(self) -> float:
        """Measured host CPU seconds one batch costs beside its engine run (per-batch code on
        the event loop: decide, launch, hand-off, deliver); 0 before the first batch."""
        return self.host.per_batch

    @property
    def host_busy_share(self) -> float:
        """The event-loop thread's busy share (CPU / wall) over the recent windows, 0..1 (a
        simulated host with a backlog may exceed 1), as of the loop's last decision: reading it
        (metrics, from another thread) changes nothing."""
        return self.host.busy

    @property
    def tight_budget_s(self) -> float:
        """The tight end (10th percentile) of recent requests' deadline budgets, seconds
        (``math.inf`` while most carry no deadline): batches are capped so such a request
        arriving during one can still be answered."""
        return self.budgets.tight

    @property
    def idle_slots(self) -> int:
        """Execution slots not running a batch now."""
        return len(self._idle)

    async def aclose(self) -> None:
        """Refuse new requests, finish every queued and running one, then stop the loop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    # -- the loop -----------------------------------------------------------------------

    async def _loop(self) -> None:
        cpu = self.host.cpu
        while True:
            self._wake.clear()
            self._hold = None
            mark = cpu()
            now = self.clock.now()
            share, batch_share = self.host.share(now)
            inputs = Inputs(now, len(self._idle), self.backend.slots, self.arrivals.rate(now), self.cap,
                            share, batch_share, self.host.per_batch, self.budgets.tight)
            decision = decide(self.queue.entries, inputs, self.policy, self.latency)
            for entry in decision.expired:
                self._expire(entry)
            if decision.batch:
                self._next_look = None
                self._launch(self.queue.take(decision.batch), mark)
                continue
            if self._closing and not self.queue.entries and len(self._idle) == self.backend.slots:
                return
            watch = self._watch(now)
            wake = decision.wake_at if watch is None else min(watch, decision.wake_at or math.inf)
            self._next_look = wake
            self._hold, self._held_rows = decision.hold, 0
            await self._wait(wake)

    def _watch(self, now: float) -> float | None:
        """Answer DEADLINE_EXCEEDED to callers whose deadline passed while their batch runs
        (they stop waiting for a slow or hung engine), and mark slots whose batch hung (and
        have the backend abort that batch, where it can).
        Returns when to look again."""
        wake = math.inf
        for entry in list(self._inflight):
            if entry.done or entry.running == 0:
                del self._inflight[entry]
            elif entry.deadline <= now:
                del self._inflight[entry]
                self.queue.remove(entry)
                self.stats.finished_late += 1
                _fail(entry, RequestTimeout("the request's deadline passed while its batch was still running"))
            else:
                wake = min(wake, entry.deadline)
        for slot, (started, hang_at) in self._hang_at.items():
            if now < hang_at:
                wake = min(wake, hang_at)
            elif slot not in self.unhealthy_slots:
                self.unhealthy_slots.add(slot)
                why = (f"execution slot {slot} has run one batch for {now - started:.1f} s, past the hang "
                       f"limit of {hang_at - started:.1f} s")
                log.warning("%s: marked unhealthy", why)
                if isinstance(self.backend, Abortable):
                    # Only the backend can stop a run; its run() then fails this batch and returns.
                    try:
                        if self.backend.abort(slot, why):
                            log.warning("execution slot %d: aborting its batch", slot)
                    except Exception:  # a runtime bug must not stop the dispatch loop
                        log.exception("execution slot %d: abort failed", slot)
        return wake if wake < math.inf else None

    async def _wait(self, until: float | None) -> None:
        if until is None:
            await self._wake.wait()
            return
        timer = self.clock.call_at(until, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()

    def _expire(self, entry: QueueEntry) -> None:
        if self.policy.queue_policy(entry.level).timeout_action is TimeoutAction.DELAY:
            self.queue.reprioritize(entry, self.policy.lowest_priority)
            return
        self.queue.remove(entry)
        self.stats.expired_before_run += 1
        now = self.clock.now()
        remaining = max(entry.deadline - now, 0.0) * 1e3
        _fail(entry, RequestTimeout(
            f"the request's deadline ({remaining:.1f} ms away) came before a batch of its rows could finish after "
            f"{(now - entry.arrival) * 1e3:.1f} ms in the queue; it was not run"))

    def _launch(self, pieces: list[Piece], cpu_mark: float) -> None:
        """Start ``pieces`` as one batch on an idle slot; ``cpu_mark``: the host CPU counter
        when the decision to run it began (the decision counts as the batch's host cost). A
        batch predicted to run within :data:`INLINE_RUN_S` runs here, on the event loop, where
        the backend can (:class:`~trtserve.runtimes.base.RunsInline`); any other in a task that
        awaits the slot's thread."""
        slot = self._idle.pop()
        rows = sum(p.rows for p in pieces)
        length = max(p.entry.length for p in pieces)
        predicted = self.latency.predict(rows, length)
        now = self.clock.now()
        self._hang_at[slot] = (now, now + max(HANG_FACTOR * predicted, HANG_MIN_S))
        self._ends.started(slot, now, self.latency.lower_bound(rows, length))
        for piece in pieces:
            self._inflight[piece.entry] = None
        if self._inline and predicted <= INLINE_RUN_S and self.latency.measured:
            self._run_inline(slot, pieces, cpu_mark)
            return
        task = asyncio.get_running_loop().create_task(self._run(slot, pieces))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._launch_cpu[slot] = self.host.cpu() - cpu_mark

    async def _run(self, slot: int, pieces: Sequence[Piece]) -> None:
        # Host CPU of this batch: the decision and launch (_launch_cpu), this code up to the
        # backend's first suspension, and the code after the run up to the delivery.
        mark = self.host.cpu()
        batch, start = self._started(pieces)
        try:
            pending = self.backend.run(slot, batch)
            host_cpu = self._launch_cpu.pop(slot, 0.0) + self.host.cpu() - mark
            self._ran(pieces, batch, await pending, start, host_cpu)
        except Exception as exc:
            self._fail_pieces(pieces, exc)
        finally:
            self._free(slot)

    def _run_inline(self, slot: int, pieces: Sequence[Piece], cpu_mark: float) -> None:
        # Host CPU: the decision and launch up to the run; the run itself is the engine's.
        batch, start = self._started(pieces)
        try:
            host_cpu = self.host.cpu() - cpu_mark
            self._ran(pieces, batch, self.backend.run_inline(slot, batch), start, host_cpu)  # type: ignore[attr-defined]
        except Exception as exc:
            self._fail_pieces(pieces, exc)
        finally:
            self._free(slot)

    def _started(self, pieces: Sequence[Piece]) -> tuple[Batch, float]:
        """The batch of ``pieces`` and its start time (its pieces' queue times recorded)."""
        batch = Batch(tuple(p.inputs() for p in pieces), sum(p.rows for p in pieces))
        start = self.clock.now()
        self.stats.record_started(start - p.entry.arrival for p in pieces if p.seg == 0 and p.start == 0)
        return batch, start

    def _ran(self, pieces: Sequence[Piece], batch: Batch, outputs: Tensors, start: float, host_cpu: float) -> None:
        """Learn from a batch that ran (latency model, stats, cap) and deliver its outputs;
        ``host_cpu``: the host CPU seconds it cost before its run."""
        mark = self.host.cpu()
        elapsed = self.clock.now() - start
        length = max(p.entry.length for p in pieces)
        self.latency.observe(batch.rows, elapsed, length)
        self.stats.record_batch(batch.rows, elapsed, padded=batch.rows * length,
                                real=sum(p.rows * p.entry.length for p in pieces),
                                requests=len({id(p.entry) for p in pieces}))
        self._refresh_cap(length)
        self._deliver(pieces, batch, outputs)
        host_cpu += self.host.cpu() - mark
        self.host.observe_batch(host_cpu)
        self.stats.host_seconds += host_cpu

    def _free(self, slot: int) -> None:
        del self._hang_at[slot]
        self.unhealthy_slots.discard(slot)
        self._idle.append(slot)
        self._wake.set()

    def _refresh_cap(self, length: int) -> None:
        if self.policy.adaptive_batch_size and self.stats.batches % CAP_REFRESH_BATCHES == 0:
            self.cap = adaptive_cap(self.latency, self.policy, length)

    def _deliver(self, pieces: Sequence[Piece], batch: Batch, outputs: Tensors) -> None:
        for name, arr in outputs.items():
            if arr.shape[:1] != (batch.rows,):
                raise BackendError(
                    f"the engine returned {arr.shape[0] if arr.ndim else 'no'} rows for output "
                    f"'{name}' of a batch of {batch.rows} rows"
                )
        for piece, out in zip(pieces, unpack(batch, outputs, self.backend.outputs)):
            entry = piece.entry
            entry.running -= 1
            entry.chunks[piece.seg].append((piece.start, out))
            if entry.rows == 0 and entry.running == 0 and not entry.done:
                entry.future.set_result([_concat(chunks) for chunks in entry.chunks])

    def _fail_pieces(self, pieces: Sequence[Piece], exc: Exception) -> None:
        """Answer every request of a failed batch: its error when it is a trtserve one, else
        (a runtime bug, which must not strand the batch's callers) INTERNAL naming it."""
        if not isinstance(exc, TrtServeError):
            exc = BackendError(f"{type(exc).__name__}: {exc}")
        for piece in pieces:
            piece.entry.running -= 1
            self.queue.remove(piece.entry)
            _fail(piece.entry, exc)

    def _on_done(self, entry: QueueEntry) -> None:
        # Cancelled by the caller: its queued rows must not run. (An entry is queued exactly
        # while it has rows left; a resolved one has none or was removed already.)
        if entry.rows and self.queue.remove(entry):
            self._wake.set()


def _no_cpu() -> float:
    return 0.0


def _fail(entry: QueueEntry, exc: Exception) -> None:
    if not entry.done:
        entry.future.set_exception(exc)


def _concat(chunks: list[tuple[int, Tensors]]) -> Tensors:
    """One segment's outputs from its pieces, in row order: pieces of a request split over
    several batches can finish in any order when the batches run on different slots."""
    if len(chunks) == 1:
        return chunks[0][1]
    ordered = [out for _start, out in sorted(chunks, key=lambda c: c[0])]
    return {name: np.concatenate([c[name] for c in ordered]) for name in ordered[0]}

