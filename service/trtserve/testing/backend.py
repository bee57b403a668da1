"""The test doubles of the batching dispatcher's surroundings, on a :class:`~trtserve.testing.FakeClock`.

:class:`FakeBackend` is a :class:`~trtserve.runtimes.base.Backend` whose batch of b rows takes
``latency(b)`` seconds of fake time; :class:`FakeHost` is one host thread whose busy time the
dispatcher's :class:`~trtserve.batching.host.HostMeter` reads as its CPU counter. The dispatcher
tests use them, and so does the dispatch-policy simulator (:mod:`trtserve.harness.simulator`),
which runs the real dispatcher on them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from trtserve.datatypes import DATATYPES, Tensors
from trtserve.errors import BackendError
from trtserve.runtimes.base import Batch, BatchWithdrawn, StagingBuffers, pack
from trtserve.spec import TensorSpec
from trtserve.testing.clock import FakeClock


@dataclass(frozen=True)
class HostCost:
    """Host CPU seconds per request read and per batch run (the simulator's host cost:
    :mod:`trtserve.harness.simulator`)."""

    per_request: float = 0.0
    per_batch: float = 0.0


class FakeHost:
    """One host thread in fake time, serving its work first come first served.

    ``busy`` is the CPU seconds charged so far, backlog included (the dispatcher's CPU counter).
    """

    def __init__(self, clock: FakeClock, cost: HostCost) -> None:
        self.clock = clock
        self.cost = cost
        self.busy = 0.0
        self.free_at = -math.inf

    def cpu(self) -> float:
        """CPU seconds charged so far (the dispatcher's :class:`~trtserve.batching.host.HostMeter` counter)."""
        return self.busy

    def start_of(self, seconds: float) -> float:
        """When work of ``seconds`` asked for now would start (after the work queued before it)."""
        return max(self.clock.now(), self.free_at)

    def charge(self, seconds: float) -> float:
        """Queue ``seconds`` of work now; returns when it is done."""
        self.free_at = self.start_of(seconds) + seconds
        self.busy += seconds
        return self.free_at


class FakeBackend:
    """A backend whose batch of b rows takes ``latency(b)`` seconds of fake time.

    Input ``x`` FP32 [-1] → output ``y`` = 2·x. ``batches`` records every batch with the
    fake time its engine run started, in start order. ``fail_when(batch)`` returning True makes
    that batch raise :class:`~trtserve.errors.BackendError` (fault injection). With a ``host``,
    each batch first queues its per-batch host work there, charged when the dispatcher calls
    :meth:`run` (inside the dispatcher's per-batch code, where the server's CPU goes).

    A slot runs one batch at a time, as a real slot's thread does: a batch handed to a busy
    slot (staged, :mod:`~trtserve.batching.dispatcher`) starts when the one before it ends, and
    its run time is taken from its rows then (rows may join a staged batch until it begins).
    ``handoff`` (seconds) is the hop between the event loop and an idle slot's thread, each way:
    a batch handed to an idle slot starts that long after :meth:`run`, and every result reaches
    the caller that long after its run ends (a staged batch starts at once, on the thread).
    """

    def __init__(
        self,
        clock: FakeClock,
        *,
        slots: int = 1,
        latency: Callable[[int], float] = lambda rows: 0.010,
        fail_when: Callable[[Batch], bool] = lambda batch: False,
        host: FakeHost | None = None,
        handoff: float = 0.0,
    ) -> None:
        self.clock = clock
        self.host = host
        self.handoff = handoff
        self.slots = slots
        self._tail: list[asyncio.Future[float] | None] = [None] * slots  # per slot: the end of its last batch
        self.latency = latency
        self.fail_when = fail_when
        fp32 = DATATYPES["FP32"]
        self.inputs = (TensorSpec("x", fp32, (-1,)),)
        self.outputs = (TensorSpec("y", fp32, (-1,)),)
        self.batches: list[tuple[float, Batch]] = []
        self.running = 0
        self.max_running = 0

    def prepare(self, segment: Tensors) -> Tensors:
        """The segment unchanged (the simulated engine takes FP32 as given)."""
        return segment

    def run(self, slot: int, batch: Batch) -> Awaitable[Tensors]:
        """Start ``batch`` (after its per-batch host work, with a host); the awaitable gives
        ``{"y": 2·x}`` after ``latency(rows)`` seconds of fake time (once the slot's earlier
        batches have run, and with the hand-off each way), or raises
        :class:`~trtserve.errors.BackendError` where ``fail_when`` says so, or
        :class:`~trtserve.runtimes.base.BatchWithdrawn` for a batch withdrawn before its start."""
        ready = self.host.charge(self.host.cost.per_batch) if self.host else self.clock.now()
        before, self._tail[slot] = self._tail[slot], asyncio.get_running_loop().create_future()
        return self._run(batch, ready + self.handoff, before, self._tail[slot])

    async def _run(self, batch: Batch, ready: float, before: asyncio.Future[float] | None,
                   free: asyncio.Future[float]) -> Tensors:
        start = end = ready
        try:
            if before is not None:
                start = end = max(ready, await asyncio.shield(before))
            if start > self.clock.now():
                await self.clock.sleep_until(start)
            try:
                batch.begin()  # a batch withdrawn while staged is skipped, taking no time ...
            except BatchWithdrawn:
                if self.handoff:  # ... and the loop learns of it a hop later, as from a slot's thread
                    await self.clock.sleep_until(start + self.handoff)
                raise
            end = start + self.latency(batch.rows)
            batch.ran.extend((start, end))  # its run on the slot's "thread", as runtimes.threads.on_slot records it
            self.batches.append((start, batch))
            self.batches.sort(key=lambda b: b[0])
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                await self.clock.sleep_until(end)
            finally:
                self.running -= 1
        finally:
            free.set_result(end)
        if self.handoff:
            await self.clock.sleep_until(end + self.handoff)
        if self.fail_when(batch):
            raise BackendError("scripted failure")
        return {"y": pack(batch, self.inputs, StagingBuffers(), -1.0)["x"] * 2}

    async def aclose(self) -> None:
        """Nothing to release."""

    def sizes(self) -> list[int]:
        """Rows of each batch started so far."""
        return [b.rows for _, b in self.batches]

    def ids(self) -> list[list[float]]:
        """The first element of each row of each batch (callers put a request id there)."""
        return [[float(p["x"][r, 0]) for p in b.parts for r in range(len(p["x"]))] for _, b in self.batches]


def affine(fixed: float, per_row: float) -> Callable[[int], float]:
    """Run time ``fixed + per_row * rows`` seconds."""
    return lambda rows: fixed + per_row * rows




def rows(request_id: float, n: int = 1, length: int = 1) -> list[Tensors]:
    """One segment for :class:`FakeBackend`: ``n`` rows of ``length`` FP32 values, each row
    starting with ``request_id`` (what :meth:`FakeBackend.ids` reads back)."""
    x = np.full((n, length), request_id, dtype=np.float32)
    x[:, 1:] = np.arange(1, length, dtype=np.float32)
    return [{"x": x}]
