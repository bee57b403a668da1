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
from trtserve.batching.cap import BatchCap
from trtserve.batching.host import HostMeter
from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import Hold, Inputs, decide, ends_hold
from trtserve.batching.queue import Piece, QueueEntry, RequestQueue
from trtserve.batching.rate import ArrivalRate
from trtserve.batching.snapshot import DispatchSnapshot
from trtserve.batching.stats import DispatchStats
from trtserve.batching.wait import HINT_REFRESH_S, SlotEnds, Wait, predict, queue_hint
from trtserve.batching.watchdog import HangWatch
from trtserve.clock import Clock, MonotonicClock
from trtserve.config import BatchingPolicy, TimeoutAction
from trtserve.datatypes import Tensors
from trtserve.errors import BackendError, RequestTimeout, ShuttingDown, TrtServeError
from trtserve.ipc.admission import QueueHint
from trtserve.runtimes.base import Backend, Batch, RunsInline, unpack

log = logging.getLogger(__name__)

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
        clock: time source (a :class:`~trtserve.testing.FakeClock` in tests).
        latency: predicted run times; learned from every batch run here.
        stats: counters for metrics and ModelStatistics.
        host: per-batch host CPU and the loop thread's busy share. By default it reads
            :func:`time.thread_time` of the loop thread with the production clock, and a
            counter that never moves with any other clock (CPU time against fake time would
            make fake-clock tests depend on the machine); the simulator passes its host's.
        name: the model's name and version, for log lines.

    Attributes:
        cap: the batch cap (:class:`~trtserve.batching.cap.BatchCap`): ``max_batch_size``, or
            with ``adaptive_batch_size`` a live estimate below it, learned from the batches run
            here (:meth:`start_cap` sets where it starts).
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
        name: str = "model",
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
        self.name = name
        self.cap = self._new_cap(policy, policy.rows_per_batch, "the hard limit, until a start is measured")
        self._idle = list(range(backend.slots))
        self._running: set[asyncio.Task[None]] = set()
        self._inflight: dict[QueueEntry, None] = {}  # entries with rows in a running batch
        self.hangs = HangWatch(backend)
        self._launch_cpu: dict[int, float] = {}  # slot -> host CPU of deciding and launching its batch
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._ends = SlotEnds(backend.slots)  # admission's view of the running batches
        self._hint: QueueHint | None = None
        self._hint_at = -math.inf
        self._next_look: float | None = None  # when the loop decides again with no arrival (None: at once)
        self._hold: Hold | None = None  # which arrivals wake the waiting loop (None: every one)
        self._held_rows = 0  # rows arrived since the loop began its wait
        self._last_length = 1  # the row length of the last batch that ran (the cap's curve reads it)

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
                       free_at=self._ends.free_at(now, self._idle), cap=self.cap.value, latency=self.latency)

    def hint(self) -> QueueHint:
        """The queue as front ends see it (:class:`~trtserve.ipc.admission.QueueHint`), at
        most :data:`~trtserve.batching.wait.HINT_REFRESH_S` old."""
        now = self.clock.now()
        if self._hint is None or now - self._hint_at > HINT_REFRESH_S:
            self._hint_at = now
            self._hint = queue_hint(self.queue, self.policy, now=now, free_at=self._ends.free_at(now, self._idle),
                                    cap=self.cap.value, latency=self.latency, next_look=self._next_look)
        return self._hint

    def snapshot(self) -> DispatchSnapshot:
        """The dispatcher as metrics and tools see it, now (:class:`~trtserve.batching.snapshot.DispatchSnapshot`).
        Read from another thread (a scrape) it may mix two moments, never fail."""
        now = self.clock.now()
        wait = self.predict_wait(math.inf, math.inf, 0)
        cap = self.cap
        return DispatchSnapshot(
            queued_requests=len(self.queue.entries), queued_rows=self.queue.queued_rows, slots=self.backend.slots,
            busy_slots=self.backend.slots - len(self._idle), unhealthy_slots=len(self.hangs.unhealthy),
            healthy=self.healthy, arrival_rate=self.arrivals.rate(now), cap=cap.value, cap_live=cap.live,
            cap_reason=cap.reason, cap_moves=cap.moves, drain_s=wait.start - wait.now,
            host_overhead_s=self.host.per_batch, host_busy_share=self.host.busy, tight_budget_s=self.budgets.tight,
            curve={length: self.latency.curve(length) for length in self.latency.lengths},
        )

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
        if (policy.rows_per_batch, policy.adaptive_batch_size) != (self.cap.limit, self.cap.live):
            self.cap = self._new_cap(policy, min(self.cap.value, policy.rows_per_batch), "a policy update")
        self._wake.set()

    def start_cap(self, rows: int, reason: str) -> None:
        """Where a live cap starts (the warm-up's choice, :mod:`trtserve.engine.warmup`); a fixed
        cap stays ``max_batch_size``. ``reason``: one sentence for the log and metrics."""
        self.cap = self._new_cap(self.policy, rows, reason)
        log.info("%s: batch cap %d rows (%s)", self.name, self.cap.value, self.cap.reason)

    def _new_cap(self, policy: BatchingPolicy, start: int, reason: str) -> BatchCap:
        if not policy.adaptive_batch_size:
            reason = "max_batch_size, fixed in the model's config"
        return BatchCap(policy.rows_per_batch, start, live=policy.adaptive_batch_size, reason=reason,
                        fits=self._fits_budget, engine=self._engine_rate)

    def _engine_rate(self, rows: int) -> float:
        """Rows per second of engine run time at a batch of ``rows`` rows, from the latency model at
        the length of the last batch that ran (the probe's own)."""
        return rows / max(self.latency.predict(rows, self._last_length), 1e-12)

    def _fits_budget(self, rows: int) -> bool:
        """Whether a batch of ``rows`` rows is predicted to run within the latency budget."""
        return self.latency.predict(rows) <= self.policy.latency_budget

    @property
    def healthy(self) -> bool:
        """False while every slot is running a batch that hung (:mod:`~trtserve.batching.watchdog`),
        including while an aborted one is being made ready again."""
        return len(self.hangs.unhealthy) < self.backend.slots

    @property
    def unhealthy_slots(self) -> set[int]:
        """Slots running one batch past the hang limit (:mod:`~trtserve.batching.watchdog`)."""
        return self.hangs.unhealthy

    @property
    def host_overhead_s(self) -> float:
        """Measured host CPU seconds one batch costs beside its engine run (per-batch code on
        the event loop: decide, launch, hand-off, deliver); 0 before the first batch."""
        return self.host.per_batch

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
            cap = self.cap.for_batch(self.queue.queued_rows)
            inputs = Inputs(now, len(self._idle), self.backend.slots, self.arrivals.rate(now), cap,
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
        (they stop waiting for a slow or hung engine), and mark slots whose batch hung
        (:class:`~trtserve.batching.watchdog.HangWatch`). Returns when to look again."""
        wake = self.hangs.check(now)
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
        self.hangs.started(slot, now, predicted)
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
        self._last_length = length
        self.stats.record_batch(batch.rows, elapsed, padded=batch.rows * length,
                                real=sum(p.rows * p.entry.length for p in pieces),
                                requests=len({id(p.entry) for p in pieces}))
        self._observe_cap(batch.rows, start, start + elapsed)
        self._deliver(pieces, batch, outputs)
        host_cpu += self.host.cpu() - mark
        self.host.observe_batch(host_cpu)
        self.stats.host_seconds += host_cpu

    def _free(self, slot: int) -> None:
        self.hangs.finished(slot)
        self._idle.append(slot)
        self._wake.set()

    def _observe_cap(self, rows: int, start: float, end: float) -> None:
        moves = self.cap.moves
        self.cap.observe(rows, start, end)
        if self.cap.moves != moves:
            log.info("%s: batch cap %d rows (%s)", self.name, self.cap.value, self.cap.reason)

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

