"""C15 on a GPU: concurrent batches on two TensorRT slots never corrupt or mix outputs.

The tiny MLP built into a plan (fp32 and fp16), served with 2 execution slots (2 execution
contexts, 2 CUDA streams, 2 sets of pinned buffers) behind the batching dispatcher; 16
concurrent clients send 2000 random inputs of 1 to 8 rows. Every output must match the same
plan run one request at a time (max abs error 1e-3) and ONNX Runtime on the CPU (fp32 1e-3,
fp16 1e-2), with no NaN or Inf, and both slots must have run batches at the same time. The
CPU half of the case (pack/unpack, two ORT slots) is tests/reliability/test_concurrent_slots.py.
"""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_tensorrt_gpu import TOL, _build, _copy_model, _ort


@pytest.fixture(scope="module")
def trt(device_info):
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    if not hasattr(trt, "Builder"):
        pytest.skip("only TensorRT's lean runtime is installed: plans cannot be built here")
    return trt


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_two_trt_slots_under_16_clients_match_the_sequential_reference(trt, tmp_path, precision):
    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.registry import ModelRegistry
    from trtserve.ipc.engine import ModelState
    from trtserve.serving.inprocess import local_model

    model_dir = _copy_model("tiny", tmp_path)
    _build(model_dir, precision, tmp_path / "timing.cache")
    config = model_dir / "config.pbtxt"
    text = re.sub(r"instance_group\s*\[[^\]]*\]", "", config.read_text())
    config.write_text(text + "\ninstance_group [ { count: 2 kind: KIND_GPU } ]\n")
    rng = np.random.default_rng(15)
    inputs = [rng.standard_normal((int(rng.integers(1, 9)), 64)).astype(np.float32) for _ in range(2000)]
    cpu = _ort(model_dir / "1" / "model.onnx")

    async def go():
        pool = ThreadPoolExecutor(2)
        repo = ModelRegistry(tmp_path, clock=MonotonicClock(), backend_factory=runtimes.create)
        await repo.load_all()
        try:
            entry = repo.models["tiny"]
            assert entry.state is ModelState.READY, entry.reason
            served = repo.get("tiny")
            model = local_model(repo, "tiny", pool)
            assert served.spec.platform == "tensorrt_plan" and served.backend.slots == 2
            alone = [(await model.infer({"INPUT": x}))[0]["OUTPUT"].copy() for x in inputs]  # concurrency 1
            running, peak, lock = 0, 0, threading.Lock()
            original = served.backend.run

            async def counting(slot, batch):
                nonlocal running, peak
                with lock:
                    running += 1
                    peak = max(peak, running)
                try:
                    return await original(slot, batch)
                finally:
                    with lock:
                        running -= 1

            served.backend.run = counting
            together: list[np.ndarray | None] = [None] * len(inputs)

            async def client(k: int) -> None:
                for i in range(k, len(inputs), 16):
                    together[i] = (await model.infer({"INPUT": inputs[i]}))[0]["OUTPUT"].copy()

            await asyncio.gather(*(client(k) for k in range(16)))
            served.backend.run = original
            return alone, together, peak, served.dispatcher.stats.mean_batch_size
        finally:
            await repo.aclose()
            pool.shutdown()

    alone, together, peak, mean_rows = asyncio.run(go())
    worst_seq = max(float(np.abs(a - b).max()) for a, b in zip(alone, together))
    worst_cpu = max(float(np.abs(t - cpu.run(None, {"INPUT": x})[0]).max()) for t, x in zip(together, inputs))
    print(f"\nC15 {precision}: {len(inputs)} requests, mean batch {mean_rows:.1f} rows, "
          f"peak concurrent batches {peak}, "
          f"max abs error vs sequential {worst_seq:.1e}, vs ONNX Runtime {worst_cpu:.1e}")
    assert all(np.isfinite(t).all() for t in together)
    assert worst_seq <= 1e-3 and worst_cpu <= TOL[precision]
    assert peak == 2
