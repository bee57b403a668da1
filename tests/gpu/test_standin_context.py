"""The TensorRT runtime (runtimes/tensorrt.py) on a real GPU without TensorRT: everything but
TensorRT's engine object is the real code (the slot's thread, pinned staging buffers, device
buffers, H2D copies, the launch on the slot's stream, events, D2H copies, several slots on their
own streams), driven through :meth:`TensorRTBackend.on_contexts` with a stand-in execution
context: a CuPy kernel launched on the given stream over the device addresses the runtime set.

The stand-in computes tiny's shape, FP32 [-1, 64] -> [-1, 16]: ``OUTPUT[i, j] = tanh(sum_t
INPUT[i, t] * W[t, j])``, one thread per output value, each summing in a fixed order, so a row's
result does not depend on the batch around it, bit for bit. ``spin`` extra passes make a launch
long enough for two slots' launches to overlap.

Every test skips where there is no GPU (tests/gpu/conftest.py) or no CuPy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from trtserve.datatypes import DATATYPES
from trtserve.runtimes import cuda
from trtserve.runtimes.base import Batch
from trtserve.runtimes.tensorrt_plan import ProfileBounds
from trtserve.spec import TensorSpec

IN, OUT, MAX_ROWS = 64, 16, 64
INPUTS = (TensorSpec("INPUT", DATATYPES["FP32"], (IN,)),)
OUTPUTS = (TensorSpec("OUTPUT", DATATYPES["FP32"], (OUT,)),)
BOUNDS = ({"INPUT": ProfileBounds("INPUT", (1, IN), (MAX_ROWS, IN))},)

KERNEL = r"""
extern "C" __global__ void rows(const float* x, const float* w, float* y, int n, int spin) {
    int i = blockIdx.x, j = threadIdx.x;
    if (i >= n || j >= 16) return;
    float acc = 0.0f;
    for (int s = 0; s <= spin; ++s) {
        acc = 0.0f;
        for (int t = 0; t < 64; ++t) acc += x[i * 64 + t] * w[t * 16 + j];
    }
    y[i * 16 + j] = tanhf(acc);
}
"""


@pytest.fixture(scope="module")
def cp(device_info):
    return pytest.importorskip("cupy", reason="CuPy is not installed: the stand-in context launches its kernel")


class StandInContext:
    """The part of ``trt.IExecutionContext`` a slot calls, over a CuPy kernel. With ``timed``,
    each launch is bracketed by two timing events, kept in ``launches`` as (start, end)."""

    def __init__(self, cp, weights, spin: int = 0, timed: bool = False) -> None:
        self.cp, self.w, self.spin, self.timed = cp, weights, spin, timed
        self.kernel = cp.RawKernel(KERNEL, "rows")
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.launches: list[tuple[object, object]] = []

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        return profile_index == 0

    def set_input_shape(self, name: str, shape) -> bool:
        self.shapes[name] = tuple(int(d) for d in shape)
        return name == "INPUT" and len(self.shapes[name]) == 2 and self.shapes[name][1] == IN

    def infer_shapes(self) -> list[str]:
        return [] if "INPUT" in self.shapes else ["INPUT"]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes["INPUT"] if name == "INPUT" else (self.shapes["INPUT"][0], OUT)

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.addresses[name] = int(memory)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        cp, n = self.cp, self.shapes["INPUT"][0]
        stream = cp.cuda.ExternalStream(int(stream_handle))
        with stream:
            if self.timed:
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
            x = _view(cp, self.addresses["INPUT"], (n, IN))
            y = _view(cp, self.addresses["OUTPUT"], (n, OUT))
            self.kernel((n,), (OUT,), (x, self.w, y, np.int32(n), np.int32(self.spin)), stream=stream)
            if self.timed:
                end.record(stream)
                self.launches.append((start, end))
        return True


def _view(cp, address: int, shape: tuple[int, ...]):
    """A CuPy FP32 array over ``address`` (memory the runtime owns; CuPy never frees it)."""
    nbytes = int(np.prod(shape)) * 4
    memory = cp.cuda.UnownedMemory(address, nbytes, owner=None)
    return cp.ndarray(shape, dtype=cp.float32, memptr=cp.cuda.MemoryPointer(memory, 0))


def _backend(cp, slots: int = 1, spin: int = 0, timed: bool = False, name: str = "standin"):
    from trtserve.runtimes.tensorrt import TensorRTBackend

    weights = cp.asarray(np.random.default_rng(0).standard_normal((IN, OUT)).astype(np.float32) / 8)
    contexts: list[StandInContext] = []

    def make(profile: int) -> StandInContext:
        contexts.append(StandInContext(cp, weights, spin, timed))
        return contexts[-1]

    backend = TensorRTBackend.on_contexts(make, INPUTS, OUTPUTS, BOUNDS, name=name, slots=slots)
    return backend, contexts


def _reference(x: np.ndarray) -> np.ndarray:
    w = np.random.default_rng(0).standard_normal((IN, OUT)).astype(np.float32) / 8
    return np.tanh(x.astype(np.float64) @ w.astype(np.float64))


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, IN)).astype(np.float32)


def test_each_row_alone_equals_its_row_in_any_batch(cp):
    backend, _ = _backend(cp)
    try:
        x = _rows(1, MAX_ROWS)
        alone_rows = np.concatenate(
            [asyncio.run(backend.run(0, Batch(({"INPUT": x[i : i + 1]},), rows=1)))["OUTPUT"] for i in range(MAX_ROWS)]
        )
        np.testing.assert_allclose(alone_rows, _reference(x), atol=1e-5)
        for size in (2, 7, 33, MAX_ROWS):
            parts = tuple({"INPUT": x[i : i + 1]} for i in range(size))
            out = asyncio.run(backend.run(0, Batch(parts, rows=size)))["OUTPUT"]
            assert out.tobytes() == alone_rows[:size].tobytes(), f"a batch of {size} changed a row's bits"
    finally:
        asyncio.run(backend.aclose())


def test_two_slots_run_concurrently_on_their_own_streams(cp):
    # ~10 ms a launch: far longer than the skew between the two threads' launches (0.15 ms seen)
    backend, contexts = _backend(cp, slots=2, spin=1_000_000, timed=True)
    try:
        x = _rows(2, MAX_ROWS)

        async def both():
            batch = Batch(({"INPUT": x},), rows=MAX_ROWS)
            return await asyncio.gather(backend.run(0, batch), backend.run(1, batch))

        a, b = asyncio.run(both())
        assert a["OUTPUT"].tobytes() == b["OUTPUT"].tobytes()
        (s0, e0), (s1, e1) = contexts[0].launches[-1], contexts[1].launches[-1]
        # the two launches overlap: each started before the other ended
        assert cp.cuda.get_elapsed_time(s0, e1) > 0 and cp.cuda.get_elapsed_time(s1, e0) > 0, (
            "slot 0 ran %.3f ms, slot 1 %.3f ms, slot 1 started %.3f ms after slot 0"
            % (cp.cuda.get_elapsed_time(s0, e0), cp.cuda.get_elapsed_time(s1, e1), cp.cuda.get_elapsed_time(s0, s1))
        )
    finally:
        asyncio.run(backend.aclose())


def test_no_device_or_pinned_memory_leaks_over_10000_batches(cp):
    backend, _ = _backend(cp)
    cudart = cuda.runtime()
    x = _rows(3, 8)

    async def many(n: int) -> None:
        for i in range(n):
            rows = 1 + i % 8
            out = await backend.run(0, Batch(({"INPUT": x[:rows]},), rows=rows))
            assert out["OUTPUT"].shape == (rows, OUT)

    try:
        asyncio.run(many(100))  # warm: CuPy's module cache, the first launches
        free_before = cudart.cudaMemGetInfo()[1]
        asyncio.run(many(10_000))
        free_after = cudart.cudaMemGetInfo()[1]
        assert free_before - free_after < (2 << 20), f"{(free_before - free_after) >> 20} MiB of device memory lost"
    finally:
        asyncio.run(backend.aclose())


def test_the_dispatcher_serves_through_it_over_grpc(cp, engines, tmp_path, monkeypatch):
    import shutil

    from servers import ServerThread
    from trtserve import runtimes

    root = tmp_path / "repo"
    (root / "standin" / "1").mkdir(parents=True)
    config = (engines / "tiny" / "config.pbtxt").read_text().replace('"tiny"', '"standin"')
    (root / "standin" / "config.pbtxt").write_text(config.replace("count: 1", "count: 2"))
    shutil.copy(engines / "tiny" / "1" / "model.onnx", root / "standin" / "1" / "model.onnx")
    real_create = runtimes.create

    def create(spec, *args, **kwargs):
        if spec.name != "standin":
            return real_create(spec, *args, **kwargs)
        return _backend(cp, slots=spec.instances, name=str(Path(spec.version_dir) / "stand-in"))[0]

    monkeypatch.setattr(runtimes, "create", create)
    x = _rows(4, 48)
    with ServerThread(root) as srv, srv.client() as client:
        outs = [client.infer("standin", {"INPUT": x[i : i + 1]})["OUTPUT"] for i in range(48)]
    np.testing.assert_allclose(np.concatenate(outs), _reference(x), atol=1e-5)
