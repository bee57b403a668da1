"""Test doubles for dispatcher-policy tests: a scripted engine on a fake clock.

Nowhere else does a fake stand in for a real component: server tests use real grpc servers
on 127.0.0.1, real onnxruntime and real clients.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trtserve.clock import FakeClock
from trtserve.errors import BackendError
from trtserve.protocol.datatypes import DATATYPES
from trtserve.runtimes.base import Batch, StagingBuffers, Tensors, pack
from trtserve.spec import TensorSpec

FP32 = DATATYPES["FP32"]


class FakeBackend:
    """An engine whose batch of b rows takes ``latency(b)`` seconds of fake time.

    Input ``x`` FP32 [-1] → output ``y`` = 2·x (padding cut back by the dispatcher).
    ``batches`` records every batch run, in start order, with the fake time it started.
    ``fail_when(batch)`` returning True makes that batch raise :class:`BackendError`.
    """

    def __init__(
        self,
        clock: FakeClock,
        *,
        slots: int = 1,
        latency: Callable[[int], float] = lambda rows: 0.010,
        fail_when: Callable[[Batch], bool] = lambda batch: False,
    ) -> None:
        self.clock = clock
        self.slots = slots
        self.latency = latency
        self.fail_when = fail_when
        self.inputs = (TensorSpec("x", FP32, (-1,)),)
        self.outputs = (TensorSpec("y", FP32, (-1,)),)
        self.batches: list[tuple[float, Batch]] = []
        self.running = 0
        self.max_running = 0

    def prepare(self, segment: Tensors) -> Tensors:
        return segment

    async def run(self, slot: int, batch: Batch) -> Tensors:
        self.batches.append((self.clock.now(), batch))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.clock.sleep_until(self.clock.now() + self.latency(batch.rows))
            if self.fail_when(batch):
                raise BackendError("scripted failure")
            return {"y": pack(batch, self.inputs, StagingBuffers(), -1.0)["x"] * 2}
        finally:
            self.running -= 1

    async def aclose(self) -> None:
        pass

    def sizes(self) -> list[int]:
        """Rows of each batch run so far."""
        return [b.rows for _, b in self.batches]

    def ids(self) -> list[list[float]]:
        """The first element of each row of each batch (tests put a request id there)."""
        return [[float(p["x"][r, 0]) for p in b.parts for r in range(len(p["x"]))] for _, b in self.batches]


def rows(request_id: float, n: int = 1, length: int = 1) -> list[Tensors]:
    """One segment of ``n`` rows of ``length`` values, each row starting with ``request_id``."""
    x = np.full((n, length), request_id, dtype=np.float32)
    x[:, 1:] = np.arange(1, length, dtype=np.float32)
    return [{"x": x}]
