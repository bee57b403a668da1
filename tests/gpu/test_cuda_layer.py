"""The cuda-python layer (runtimes/cuda.py) on a real GPU: pinned and device memory, async
copies on two streams, events, per-thread cudaSetDevice, CUDA errors by name, and a packed
batch's round trip through device memory, byte for byte."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trtserve.datatypes import DATATYPES
from trtserve.runtimes import cuda
from trtserve.runtimes.base import Batch, StagingBuffers, pack
from trtserve.spec import TensorSpec


def test_preflight_describes_the_device(device_info):
    assert device_info.name and device_info.total_memory > 0
    major, minor = device_info.compute_capability.split(".")
    assert int(major) >= 7 and minor.isdigit()
    print(f"\nGPU 0: {device_info}")


def _round_trip(nbytes: int, seed: int, stream: cuda.Stream) -> tuple[cuda.PinnedBuffer, cuda.PinnedBuffer, list]:
    src, dst, dev = cuda.PinnedBuffer(nbytes), cuda.PinnedBuffer(nbytes), cuda.DeviceBuffer(nbytes)
    src.array[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    dst.array[:] = 0
    cuda.copy_htod_async(dev, src, nbytes, stream)
    cuda.copy_dtoh_async(dst, dev, nbytes, stream)
    return src, dst, [dev]


def test_async_copies_on_two_streams_with_events_are_byte_exact(device_info):
    cuda.set_device(0)
    streams = [cuda.Stream(), cuda.Stream()]
    events = [cuda.Event(), cuda.Event()]
    nbytes = 64 << 20  # large enough that the two streams' copies overlap in time
    pairs = []
    try:
        for i, (s, e) in enumerate(zip(streams, events)):
            src, dst, keep = _round_trip(nbytes, i, s)
            e.record(s)
            pairs.append((src, dst, keep))
        for e in events:
            e.synchronize()
            assert e.query()
        for src, dst, _ in pairs:
            assert dst.array.tobytes() == src.array.tobytes()
    finally:
        for src, dst, keep in pairs:
            src.free()
            dst.free()
            keep[0].free()
        for e in events:
            e.destroy()
        for s in streams:
            s.destroy()


def test_timing_events_measure_a_copy(device_info):
    cuda.set_device(0)
    stream, start, end = cuda.Stream(), cuda.Event(timing=True), cuda.Event(timing=True)
    start.record(stream)
    src, dst, keep = _round_trip(16 << 20, 3, stream)
    end.record(stream)
    end.synchronize()
    ms = end.elapsed_ms(start)
    assert ms > 0
    print(f"\n16 MiB H2D+D2H round trip: {ms:.3f} ms ({2 * 16 / 1024 / (ms / 1000):.1f} GiB/s)")
    src.free()
    dst.free()
    keep[0].free()
    for obj in (start, end, stream):
        obj.destroy()


def test_a_packed_batch_survives_the_device_round_trip_byte_for_byte(device_info):
    cuda.set_device(0)
    specs = [TensorSpec("input_ids", DATATYPES["INT64"], (-1,)), TensorSpec("x", DATATYPES["FP16"], (4,))]
    rng = np.random.default_rng(7)
    parts: tuple[dict[str, np.ndarray], ...] = tuple(
        {
            "input_ids": rng.integers(0, 30000, (n, length)).astype(np.int64),
            "x": rng.standard_normal((n, 4)).astype(np.float16),
        }
        for n, length in ((2, 5), (1, 9), (3, 2))
    )
    batch = Batch(parts, rows=6)
    expected = pack(batch, specs, StagingBuffers(), 0.0)  # the CPU runtime's packing
    stream, event = cuda.Stream(), cuda.Event()
    host_in = {s.name: cuda.PinnedBuffer(1 << 16) for s in specs}
    host_out = {s.name: cuda.PinnedBuffer(1 << 16) for s in specs}
    dev = {s.name: cuda.DeviceBuffer(1 << 16) for s in specs}
    try:
        packed = pack(batch, specs, None, 0.0, out={n: b.array for n, b in host_in.items()})
        for name, arr in packed.items():
            assert arr.tobytes() == expected[name].tobytes()
            cuda.copy_htod_async(dev[name], host_in[name], arr.nbytes, stream)
            cuda.copy_dtoh_async(host_out[name], dev[name], arr.nbytes, stream)
        event.record(stream)
        event.synchronize()
        for name, arr in packed.items():
            assert host_out[name].array[: arr.nbytes].tobytes() == expected[name].tobytes()
    finally:
        for pinned in (*host_in.values(), *host_out.values()):
            pinned.free()
        for device in dev.values():
            device.free()
        event.destroy()
        stream.destroy()


def test_worker_threads_set_the_device_and_share_the_primary_context(device_info):
    with ThreadPoolExecutor(2, initializer=cuda.set_device, initargs=(0,)) as pool:
        made = pool.submit(cuda.DeviceBuffer, 1 << 20).result()
        src = cuda.PinnedBuffer(1 << 20)
        src.array[:] = 42

        def copy_back() -> bytes:
            stream, dst = cuda.Stream(), cuda.PinnedBuffer(1 << 20)
            cuda.copy_htod_async(made, src, 1 << 20, stream)
            cuda.copy_dtoh_async(dst, made, 1 << 20, stream)
            stream.synchronize()
            data = dst.array.tobytes()
            dst.free()
            stream.destroy()
            return data

        assert pool.submit(copy_back).result() == src.array.tobytes()  # a buffer from another thread works
        src.free()
        made.free()


def test_cuda_errors_are_named(device_info):
    cuda.set_device(0)
    with pytest.raises(cuda.CudaError) as info:
        cuda.DeviceBuffer(1 << 50)  # 1 PiB
    assert info.value.name == "cudaErrorMemoryAllocation" and "cudaMalloc failed" in str(info.value)
    stream = cuda.Stream()
    stream.destroy()
    stream.destroy()  # idempotent
    with pytest.raises(cuda.CudaError, match="destroyed"):
        stream.synchronize()
