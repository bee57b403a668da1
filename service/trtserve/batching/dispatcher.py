"""The per-model dispatcher: one asyncio task that turns the queue into engine batches.

The loop is: snapshot → :func:`~trtserve.batching.policy.decide` → act → wait for an arrival,
a freed slot or the decision's wake time. All queue state lives on the event loop, so there
are no locks; the only thread crossing is the runtime's ``run`` of one batch on one slot.

**Staging.** Near the end of a busy slot's batch (its last :func:`stage_ahead` seconds, as
predicted), with no slot idle and rows queued, the slot's next batch is decided for the
moment the running one is predicted to end (:func:`~trtserve.batching.policy.decide` at that
time) and handed to the slot's thread at once: the thread runs it as soon as the batch before
it returns, so the slot does not stand idle through the hops between its thread and the event
loop (measured on 2 shared cores with an engine asleep 10.5 ms a batch: 2.8–3.3 ms idle between
batches, 0.75 of the engine's capacity). One batch per slot is staged, and it stays open: rows
arriving before its run begins join it while it has room and every member's deadline still holds
(:func:`~trtserve.batching.policy.top_up`, :meth:`Dispatcher._top_up`, called as each request is
queued: no decision of the loop per arrival), so waiting could not make it larger. A full one
has no room, and a request arriving then runs one batch later than it would have, so a full
batch is staged only where a request with the tight end of recent deadline budgets
(:class:`~trtserve.batching.budgets.DeadlineBudgets`) arriving then still has time for a batch
of one after it; admission counts the staged batch as the slot's work
(:class:`~trtserve.batching.wait.SlotEnds`).

The latency model keeps predicting what a batch takes on an idle slot, hand-off included, the
time every admission and wait decision is made in: a staged batch, which skips the hand-off, is
learned as its run on the slot's thread (``Batch.ran``) plus the hand-off measured on the batches
that were not staged (:meth:`Dispatcher._learned`). Learned as it ran, a backlog of staged batches
would teach the model the engine's time alone, and the first batch after an idle spell, admission
and the deadline caps would all run late by the hand-off (measured on the engine above at 3x its
capacity, 8-row requests: a median goodput of 118 answers/s over 8 runs, against 208 over 12
runs without staging; learned this way, 136–195 in 4 runs alternating with 116–295 without).

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
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from trtserve.batching.budgets import DeadlineBudgets
from trtserve.batching.cap import BatchCap
from trtserve.batching.host import HostMeter
from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import Hold, Inputs, decide, ends_hold, top_up
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
from trtserve.runtimes.base import Backend, Batch, BatchWithdrawn, RunsInline, unpack

log = logging.getLogger(__name__)

STAGE_AHEAD_S = 0.005
"""A batch is staged at most this long before the slot's running batch is predicted to end:
more than the hops it hides (2.8–3.3 ms a batch, both ways, measured on 2 oversubscribed cores) ...
"""
STAGE_AHEAD_SHARE = 0.5
"""... and at most this share of the running batch's predicted run time: a request arriving in
that window runs one batch later (:func:`stage_ahead`). The window must also hold the error of
the predicted end and the loop's own late wake-up on busy cores: with half a batch, a wake-up
almost half a batch late still stages in time."""


HANDOFF_ALPHA = 0.1
"""Weight of each new sample in the hand-off estimate (:meth:`Dispatcher._learned`), an EWMA."""


def stage_ahead(predicted: float) -> float:
    """How long (seconds) before the predicted end of a batch predicted to run ``predicted``
    seconds its slot's next batch may be staged (:data:`STAGE_AHEAD_S`, :data:`STAGE_AHEAD_SHARE`)."""
    return min(STAGE_AHEAD_S, STAGE_AHEAD_SHARE * predicted)

@dataclass
class Staged:
    """A batch handed to a busy slot's thread to run when the slot's batch returns (staging).

    Attributes:
        pieces: the request pieces in it, in the batch's order (rows join and leave until its
            run begins: :meth:`Dispatcher._top_up`, :meth:`Dispatcher._unstage`).
        batch: what the slot's thread runs.
        start: when it is predicted to start (the end of the slot's batch before it; monotonic s).
        predicted: its predicted run time on an idle slot (seconds; the latency model's).
        length: its row length (elements), padding included.
        deadline: the earliest deadline among the requests it held (monotonic s; rows withdrawn
            later do not move it).
        cap: the batch cap it was decided under (a probe's phase may have moved the cap since):
            the most rows it grows to.
    """

    pieces: list[Piece]
    batch: Batch
    start: float
    predicted: float
    length: int
    deadline: float
    cap: int

    @property
    def open(self) -> bool:
        """Whether arriving rows may join it: room below its cap, its run not begun."""
        return self.batch.rows < self.cap and not self.batch.begun


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
        self._inflight: dict[QueueEntry, None] = {}  # entries with rows in a running (or staged) batch
        self._staged: dict[int, Staged] = {}  # slot -> the batch behind its run
        self._busy_until = [-math.inf] * backend.slots  # per slot: when its work handed over ends, predicted
        self._stage_at = [math.inf] * backend.slots  # per slot: when its next batch may be staged
        self._ended = [-math.inf] * backend.slots  # per slot: when the loop saw its last batch return
        self._handoff: float | None = None  # seconds the hand-off to an idle slot and back adds to a run (EWMA)
        self.hangs = HangWatch(backend)
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
        self._inputs: Inputs | None = None  # what the last decision knew (read by arrivals joining a staged batch)

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
        if self._staged and self._inputs is not None:
            # Join a staged batch that has room here, without a decision of the loop, which
            # need only hear of a deadline it would not look before (the hang and expiry watch).
            self._top_up(self._inputs, now)
            if not entry.rows:
                if deadline < math.inf and (self._next_look is None or deadline < self._next_look):
                    self._next_look = None
                    self._wake.set()
                return future
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
        staged = [p for batch in list(self._staged.values()) for p in list(batch.pieces)]
        return DispatchSnapshot(
            queued_requests=len(self.queue.entries) + len({id(p.entry) for p in staged if not p.entry.rows}),
            queued_rows=self.queue.queued_rows + sum(p.rows for p in staged), slots=self.backend.slots,
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
        """Run :meth:`_dispatch` until it returns (closed and drained). Should it raise (a bug in
        the policy or the dispatcher, never an engine error, which fails only its own batch), the
        error is logged with its traceback, every queued request is answered INTERNAL naming it
        instead of waiting forever on a loop that is gone, and the loop starts again at the next
        arrival or freed slot: batches already running deliver as usual, and later requests are
        served (or, while the bug recurs, refused the same way, never left hanging)."""
        while True:
            try:
                await self._dispatch()
                return
            except Exception as exc:
                log.exception("%s: the dispatch loop failed; answering the %d queued requests INTERNAL",
                              self.name, len(self.queue.entries))
                self.stats.loop_failures += 1
                failure = BackendError(f"the dispatcher of {self.name} failed ({type(exc).__name__}: {exc}) "
                                       "while this request was queued; it was not run")
                for entry in list(self.queue.entries):
                    self.queue.remove(entry)
                    _fail(entry, failure)
                self._hold = None
                if self._closing and len(self._idle) == self.backend.slots:
                    return
                self._wake.clear()
                await self._wake.wait()

    async def _dispatch(self) -> None:
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
            if self._staged and self.queue.entries and self._top_up(inputs, now):
                continue
            slot = self._stage_slot() if not self._idle else None
            stage_at = math.inf if slot is None else self._stage_at[slot]
            staging = self._stage(slot, inputs, mark) if slot is not None and stage_at <= now else _NO_ARRIVAL
            if staging is True:
                continue
            if self._closing and not self.queue.entries and len(self._idle) == self.backend.slots:
                return
            watch = self._watch(now)
            wake = decision.wake_at if watch is None else min(watch, decision.wake_at or math.inf)
            if now < stage_at < math.inf:
                wake = min(wake or math.inf, stage_at)
            self._next_look = wake
            self._inputs = inputs
            self._hold, self._held_rows = decision.hold, 0
            if decision.hold is not None and stage_at <= now:
                # Past the stage point with nothing staged, the arrivals that could change the
                # decision at the slot's end wake the loop (a decision per arrival would cost
                # more than the hops staging hides); rows that may join a staged batch join it
                # in submit(), without the loop.
                self._hold = None if staging is None else replace(staging, until=wake or math.inf)
            elif decision.hold is not None and stage_at < math.inf:
                self._hold = replace(decision.hold, until=wake or math.inf)  # it wakes at the stage point
            await self._wait(wake)

    def _stage_slot(self) -> int | None:
        """The busy, healthy slot without a staged batch whose work ends first (``None``: none)."""
        ready = [s for s in range(self.backend.slots)
                 if s not in self._staged and s not in self._idle and s not in self.hangs.unhealthy]
        return min(ready, key=self._busy_until.__getitem__, default=None)

    def _stage(self, slot: int, inputs: Inputs, cpu_mark: float) -> Hold | None | bool:
        """Stage on ``slot`` the batch :func:`decide` takes at its predicted end, if it takes one
        then and it leaves a tight request arriving now time for a batch of one after it (see the
        module docstring). Nothing is staged before the latency model has measured a batch: the
        end is not known.

        Returns:
            True if it staged one; else which arrivals could change that (the loop's
            :class:`~trtserve.batching.policy.Hold`): ``None`` (any: the queue is empty), the
            wait of the decision at the slot's end, or none (a full batch kept back for a tight
            request: only a freed slot changes it).
        """
        if not self.queue.entries:
            return None
        if not self.latency.measured:
            return _NO_ARRIVAL
        at = max(inputs.now, self._busy_until[slot])
        decision = decide(self.queue.entries, replace(inputs, now=at, free_slots=1), self.policy, self.latency)
        if not decision.batch:
            return decision.hold or _NO_ARRIVAL
        rows = sum(n for _, n in decision.batch)
        length = max(e.length for e, _ in decision.batch)
        after = at - inputs.now + self.latency.predict(rows, length) + self.latency.lower_bound(1, length)
        if rows >= inputs.cap and after > inputs.tight_budget:
            return _NO_ARRIVAL
        self._launch(self.queue.take(decision.batch), cpu_mark, staged=slot, cap=inputs.cap)
        return True

    def _top_up(self, inputs: Inputs, now: float) -> bool:
        """Add queued rows to the staged batches whose run has not begun, as
        :func:`~trtserve.batching.policy.top_up` selects them at each one's predicted start
        (``inputs``: the loop's last, read at ``now`` with the tight budget of now; an Inputs is
        made only for a batch with room); returns whether any joined. Their rows are taken from the
        queue under the batch's lock (:meth:`Batch.extend <trtserve.runtimes.base.Batch.extend>`),
        so they run in it or stay queued, never neither."""
        grew = False
        for slot, staged in self._staged.items():
            if not staged.open or not self.queue.entries:
                continue
            before = self.latency.lower_bound(staged.batch.rows, staged.length)
            at = replace(inputs, now=max(now, staged.start), free_slots=1, cap=staged.cap,
                         tight_budget=self.budgets.tight)
            chosen = top_up(self.queue.entries, at, self.policy, self.latency, rows=staged.batch.rows,
                            length=staged.length, deadline=staged.deadline, skips=(self._handoff or 0.0) / 2)
            if chosen and staged.batch.extend(partial(self._join, staged, chosen)):
                staged.predicted = self.latency.predict(staged.batch.rows, staged.length)
                self._busy(slot, staged.start, staged.predicted, staged=True)
                self._ends.extend(slot, self.latency.lower_bound(staged.batch.rows, staged.length) - before)
                grew = True
        return grew

    def _join(self, staged: Staged, chosen: Sequence[tuple[QueueEntry, int]]) -> tuple[list[Tensors], int]:
        """Take ``chosen`` from the queue into ``staged`` (under its batch's lock); returns the
        pieces' inputs and rows for :meth:`Batch.extend <trtserve.runtimes.base.Batch.extend>`."""
        pieces = self.queue.take(chosen)
        for piece in pieces:
            self._inflight[piece.entry] = None
            staged.deadline = min(staged.deadline, piece.entry.deadline)
            staged.length = max(staged.length, piece.entry.length)
        staged.pieces.extend(pieces)
        return [p.inputs() for p in pieces], sum(p.rows for p in pieces)

    def _watch(self, now: float) -> float | None:
        """Answer DEADLINE_EXCEEDED to callers whose deadline passed while their batch runs
        (they stop waiting for a slow or hung engine) or waits staged behind another (its rows
        are withdrawn: see :meth:`_unstage`), except at a priority level whose timeout action is
        DELAY (those wait for their rows however late), and mark slots whose batch hung
        (:class:`~trtserve.batching.watchdog.HangWatch`). Returns when to look again."""
        wake = self.hangs.check(now)
        for entry in list(self._inflight):
            if entry.done or entry.running == 0:
                del self._inflight[entry]
            elif entry.deadline <= now:
                del self._inflight[entry]
                if self._delayed(entry):
                    continue  # its staged rows run, late, as queued ones would, and it is answered then
                self.queue.remove(entry)
                self._unstage(entry)
                if entry.running:
                    self.stats.finished_late += 1
                    _fail(entry, RequestTimeout("the request's deadline passed while its batch was still running"))
                else:
                    self.stats.expired_before_run += 1
                    _fail(entry, RequestTimeout(
                        f"the request's deadline passed after {(now - entry.arrival) * 1e3:.1f} ms, while its batch "
                        "waited on a slot behind the batch running there; it was not run"))
            else:
                wake = min(wake, entry.deadline)
        return wake if wake < math.inf else None

    def _delayed(self, entry: QueueEntry) -> bool:
        """Whether ``entry``, past its deadline, waits on: its level's timeout action is DELAY and
        every piece of it still to run waits in a staged batch not begun (a queued request under
        DELAY runs late; a running one is answered at its deadline as at any level)."""
        if self.policy.queue_policy(entry.level).timeout_action is not TimeoutAction.DELAY:
            return False
        waiting = sum(p.entry is entry for st in self._staged.values() if not st.batch.begun for p in st.pieces)
        return waiting == entry.running

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

    def _launch(self, pieces: list[Piece], cpu_mark: float, *, staged: int | None = None, cap: int = 0) -> None:
        """Start ``pieces`` as one batch on an idle slot, or with ``staged``, hand it to that busy
        slot to run after its batch (``cap``: the batch cap it was decided under, which its top-ups
        keep to); ``cpu_mark``: the host CPU counter when the decision to run it began (the
        decision counts as the batch's host cost). A batch predicted to run within
        :data:`INLINE_RUN_S` on an idle slot runs here, on the event loop, where the backend can
        (:class:`~trtserve.runtimes.base.RunsInline`); any other in a task that awaits the slot's
        thread. Should this raise (a bug), the batch's requests are answered as a failed batch's
        and the slot is given back before the error reaches the loop (:meth:`_loop`)."""
        slot = self._idle.pop() if staged is None else staged
        try:
            self._hand(slot, pieces, cpu_mark, staged=staged is not None, cap=cap)
        except Exception as exc:
            if staged is None:
                self._idle.append(slot)
            elif slot in self._staged and self._staged[slot].pieces is pieces:
                del self._staged[slot]
            self._fail_pieces(pieces, exc)
            raise

    def _hand(self, slot: int, pieces: list[Piece], cpu_mark: float, *, staged: bool, cap: int) -> None:
        """:meth:`_launch` on ``slot``, taken from the idle ones (or busy, with ``staged``)."""
        rows = sum(p.rows for p in pieces)
        length = max(p.entry.length for p in pieces)
        predicted = self.latency.predict(rows, length)
        now = self.clock.now()
        low = self.latency.lower_bound(rows, length)
        if not staged:
            self._ends.started(slot, now, low)
            self._busy(slot, now, predicted)
        else:
            # It skips the hand-off (see _busy): counted with it, each staged batch would push the
            # slot's end, which the next one starts from, a hand-off later than it is.
            self._ends.started(slot, now, max(low - (self._handoff or 0.0), 0.0), staged=True)
            start = max(now, self._busy_until[slot])
            self._busy(slot, start, predicted, staged=True)
        for piece in pieces:
            self._inflight[piece.entry] = None
        batch = Batch(tuple(p.inputs() for p in pieces), rows)
        if staged:
            self._staged[slot] = Staged(pieces, batch, start, predicted, length,
                                        min(p.entry.deadline for p in pieces), cap)
            self.stats.staged_batches += 1
        else:
            self.hangs.started(slot, now, predicted)
            self.stats.record_started(_waits(pieces, now))
            if self._inline and predicted <= INLINE_RUN_S and self.latency.measured:
                self._run_inline(slot, pieces, batch, cpu_mark)
                return
        task = asyncio.get_running_loop().create_task(
            self._run(slot, pieces, batch, self.host.cpu() - cpu_mark, staged=staged, phase=self.cap.phase))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, slot: int, pieces: Sequence[Piece], batch: Batch, launch_cpu: float, *,
                   staged: bool, phase: int) -> None:
        # Host CPU of this batch: the decision and launch (launch_cpu), this code up to the
        # backend's first suspension, and the code after the run up to the delivery.
        mark = self.host.cpu()
        start = self.clock.now()
        try:
            pending = self.backend.run(slot, batch)
            host_cpu = launch_cpu + self.host.cpu() - mark
            outputs = await pending
            # A staged batch started when the one before it on the slot returned.
            start, self._ended[slot] = max(start, self._ended[slot]), self.clock.now()
            self._ran(pieces, batch, outputs, start, host_cpu, staged=staged, phase=phase)
        except BatchWithdrawn:
            pass  # staged, and every request of it was answered before its turn (see _unstage)
        except Exception as exc:
            self._ended[slot] = self.clock.now()
            self._fail_pieces(pieces, exc)
        finally:
            self._free(slot)

    def _run_inline(self, slot: int, pieces: Sequence[Piece], batch: Batch, cpu_mark: float) -> None:
        # Host CPU: the decision and launch up to the run; the run itself is the engine's.
        start = self.clock.now()
        try:
            host_cpu = self.host.cpu() - cpu_mark
            self._ran(pieces, batch, self.backend.run_inline(slot, batch), start, host_cpu)  # type: ignore[attr-defined]
        except Exception as exc:
            self._fail_pieces(pieces, exc)
        finally:
            self._free(slot)

    def _ran(self, pieces: Sequence[Piece], batch: Batch, outputs: Tensors, start: float, host_cpu: float, *,
             staged: bool = False, phase: int | None = None) -> None:
        """Learn from a batch that ran (latency model, stats, cap) and deliver its outputs;
        ``host_cpu``: the host CPU seconds it cost before its run; ``staged``: it was staged;
        ``phase``: the cap's probe phase when it was decided (``None``: this one)."""
        mark = self.host.cpu()
        elapsed = self.clock.now() - start
        length = max(p.entry.length for p in pieces)
        self.latency.observe(batch.rows, self._learned(batch, elapsed, staged), length)
        self._last_length = length
        self.stats.record_batch(batch.rows, elapsed, padded=batch.rows * length,
                                real=sum(p.rows * p.entry.length for p in pieces),
                                requests=len({id(p.entry) for p in pieces}))
        self._observe_cap(batch.rows, start, start + elapsed, phase)
        self._deliver(pieces, batch, outputs)
        host_cpu += self.host.cpu() - mark
        self.host.observe_batch(host_cpu)
        self.stats.host_seconds += host_cpu

    def _busy(self, slot: int, start: float, predicted: float, *, staged: bool = False) -> None:
        """``slot`` runs a batch predicted to take ``predicted`` seconds on an idle slot from
        ``start``: when its work ends, and when its next batch may be staged. A staged batch skips
        the hand-off, so it ends that much sooner (``start``: when the batch before it returns)."""
        end = start + max(predicted - (self._handoff or 0.0), 0.0) if staged else start + predicted
        self._busy_until[slot] = end
        self._stage_at[slot] = end - stage_ahead(predicted)

    def _learned(self, batch: Batch, elapsed: float, staged: bool) -> float:
        """The run time (seconds) the latency model learns for ``batch``, which the loop saw take
        ``elapsed`` seconds: that, for a batch handed to an idle slot (whose hand-off, ``elapsed``
        less its run on the slot's thread, updates the estimate); for a staged batch, its run
        on the thread plus the hand-off estimate (see the module docstring). A run not timed on
        a thread (``Batch.ran`` empty) is learned as it was seen."""
        if len(batch.ran) != 2:
            return elapsed
        run = batch.ran[1] - batch.ran[0]
        if staged:
            return run + (self._handoff or 0.0)
        sample = max(elapsed - run, 0.0)
        self._handoff = sample if self._handoff is None else self._handoff + HANDOFF_ALPHA * (sample - self._handoff)
        return elapsed

    def _free(self, slot: int) -> None:
        """The batch on ``slot`` returned: its staged batch (now running) is watched from here,
        or the slot is idle."""
        self.hangs.finished(slot)
        staged = self._staged.pop(slot, None)
        if staged is None:
            self._idle.append(slot)
        else:
            now = self.clock.now()
            self._busy(slot, now, staged.predicted, staged=True)
            self.hangs.started(slot, now, staged.predicted)
            self.stats.record_started(_waits(staged.pieces, now))
        self._wake.set()

    def _observe_cap(self, rows: int, start: float, end: float, phase: int | None) -> None:
        moves, probes = self.cap.moves, self.cap.probes
        self.cap.observe(rows, start, end, phase)
        if self.cap.moves != moves:
            log.info("%s: batch cap %d rows (%s)", self.name, self.cap.value, self.cap.reason)
        elif self.cap.probes != probes:
            log.debug("%s: batch cap probe %s", self.name, self.cap.last_probe)

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
        # Cancelled by the caller (or failed): its queued rows must not run, nor its staged ones.
        # (An entry is queued exactly while it has rows left; a resolved one has none or was
        # removed already.)
        if entry.rows and self.queue.remove(entry):
            self._wake.set()
        if entry.running:
            self._unstage(entry)

    def _unstage(self, entry: QueueEntry) -> None:
        """Withdraw the rows of ``entry``, and of every answered request, from the staged
        batches whose run has not begun on the slot's thread (:meth:`Batch.withdraw
        <trtserve.runtimes.base.Batch.withdraw>`): a request cancelled or past its deadline while
        its batch waits behind another costs no engine time, and a batch left with none is
        skipped. ``entry.running`` counts only the pieces still to run after it."""
        for staged in self._staged.values():
            pieces = staged.pieces
            keep = [i for i, p in enumerate(pieces) if p.entry is not entry and not p.entry.done]
            if len(keep) < len(pieces) and staged.batch.withdraw(keep, sum(pieces[i].rows for i in keep)):
                kept = set(keep)
                for piece in (p for i, p in enumerate(pieces) if i not in kept):
                    piece.entry.running -= 1
                pieces[:] = [pieces[i] for i in keep]
                self._wake.set()  # queued rows may fit in the room it left


_NO_ARRIVAL = Hold(math.inf, math.inf, None, math.inf)
"""A :class:`~trtserve.batching.policy.Hold` no arrival ends (a freed slot or the wake time does)."""


def _no_cpu() -> float:
    return 0.0


def _waits(pieces: Sequence[Piece], start: float) -> list[float]:
    """Queue times (seconds) of the requests whose first rows are among ``pieces``, starting at ``start``."""
    return [start - p.entry.arrival for p in pieces if p.seg == 0 and p.start == 0]


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

