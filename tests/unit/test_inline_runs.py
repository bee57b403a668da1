"""A batch the latency model predicts shorter than the hand-off to the slot's thread runs on
the event loop (dispatcher.INLINE_RUN_S): the real ONNX Runtime backend of the ``tiny`` model,
its run spied on only to see which thread it ran on. Longer batches, and any before the model
has measured one, still go to the slot's thread, so a slow engine never holds the loop."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from trtserve.batching.dispatcher import INLINE_RUN_S, Dispatcher
from trtserve.config import BatchingPolicy
from trtserve.runtimes.base import Batch
from trtserve.runtimes.onnxruntime import OnnxRuntimeBackend

TINY = Path(__file__).resolve().parents[2] / "engines" / "tiny" / "1" / "model.onnx"


class ThreadRecordingBackend(OnnxRuntimeBackend):
    """The real backend; each run also records the name of the thread it ran on."""

    def __init__(self, slots: int = 1) -> None:
        super().__init__(TINY, slots=slots)
        self.threads: list[str] = []

    def run_inline(self, slot: int, batch: Batch):
        self.threads.append(threading.current_thread().name)
        return super().run_inline(slot, batch)


LENGTH = 64  # elements per row of tiny's input: the length the latency model keys batches by


async def _one(d: Dispatcher, x: np.ndarray) -> np.ndarray:
    return (await d.submit([{"INPUT": x}]))[0]["OUTPUT"]


def _dispatcher(backend: ThreadRecordingBackend, seconds_per_batch: float | None) -> Dispatcher:
    """A dispatcher over ``backend`` whose latency model has measured one batch of 3 rows
    taking ``seconds_per_batch`` (None: nothing measured yet)."""
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=64))
    if seconds_per_batch is not None:
        d.latency.observe(3, seconds_per_batch, LENGTH)
    d.start()
    return d


async def test_a_short_batch_runs_on_the_event_loop_with_the_answer_the_slot_thread_gives():
    backend = ThreadRecordingBackend()
    d = _dispatcher(backend, INLINE_RUN_S / 10)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    try:
        inline = await _one(d, x)
        threaded = (await backend.run(0, Batch(({"INPUT": x},), 3)))["OUTPUT"]
    finally:
        await d.aclose()
        await backend.aclose()
    assert backend.threads == [threading.current_thread().name, "ort-slot0_0"]  # the loop's thread, then the slot's
    np.testing.assert_array_equal(inline, threaded)


async def test_a_batch_predicted_longer_than_the_bound_or_not_predicted_goes_to_the_slot_thread():
    for seconds_per_batch in (10 * INLINE_RUN_S, None):
        backend = ThreadRecordingBackend()
        d = _dispatcher(backend, seconds_per_batch)
        try:
            await _one(d, np.zeros((3, 64), np.float32))
        finally:
            await d.aclose()
            await backend.aclose()
        assert backend.threads == ["ort-slot0_0"], seconds_per_batch


async def test_a_model_with_two_slots_runs_every_batch_on_a_slot_thread():
    backend = ThreadRecordingBackend(slots=2)
    d = _dispatcher(backend, INLINE_RUN_S / 10)
    try:
        await _one(d, np.zeros((3, 64), np.float32))
    finally:
        await d.aclose()
        await backend.aclose()
    assert backend.threads[0].startswith("ort-slot"), backend.threads  # two instances: meant to run at once
