"""TensorRT plans on a real GPU: build tiny and minilm (fp32 and fp16) with tools/build.py, serve them
with TensorRTBackend, compare with ONNX Runtime on the CPU (fp32 <= 1e-3, fp16 <= 1e-2 absolute),
check the refusals (profile bounds, sidecar mismatch), run two slots concurrently, and print
throughput per batch size. Skips where TensorRT's builder is not installed (the lean runtime
cannot build)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from trtserve.errors import BackendError, InvalidRequest
from trtserve.runtimes.base import Batch

ENGINES = Path(__file__).resolve().parents[2] / "engines"
TOL = {"fp32": 1e-3, "fp16": 1e-2}


@pytest.fixture(scope="module")
def trt(device_info):
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    if not hasattr(trt, "Builder"):
        pytest.skip("only TensorRT's lean runtime is installed: plans cannot be built here")
    print(f"\nTensorRT {trt.__version__} on {device_info.name} (compute {device_info.compute_capability})")
    return trt


def _copy_model(name: str, root: Path, max_batch_size: int | None = None) -> Path:
    src = ENGINES / name
    onnx = src / "1" / "model.onnx"
    if not onnx.is_file():
        pytest.skip(f"{onnx} is not built (run `trtserve build {name}` or carry it to this machine)")
    dst = root / name
    (dst / "1").mkdir(parents=True)
    config = (src / "config.pbtxt").read_text()
    if max_batch_size is not None:
        config = re.sub(r"max_batch_size:\s*\d+", f"max_batch_size: {max_batch_size}", config)
    (dst / "config.pbtxt").write_text(config)
    shutil.copy(onnx, dst / "1" / "model.onnx")
    return dst


def _build(model_dir: Path, precision: str, cache: Path) -> Path:
    from trtserve.tools.build import build_model
    from trtserve.tools.build_options import BuildOptions

    started = time.perf_counter()
    status = build_model(model_dir, BuildOptions(precision=precision, timing_cache=cache), force=True)
    assert status == "built", status
    plan = model_dir / "1" / "model.plan"
    sidecar = json.loads((plan.parent / "model.plan.json").read_text())
    print(f"\n{model_dir.name} {precision}: built in {time.perf_counter() - started:.1f} s, "
          f"{plan.stat().st_size / 2**20:.1f} MiB, profiles {sidecar['profiles']}")
    assert sidecar["build"]["precision"] == precision and sidecar["gpu"]["compute_capability"]
    assert 'platform: "tensorrt_plan"' in (model_dir / "config.pbtxt").read_text()
    assert build_model(model_dir, BuildOptions(precision=precision, timing_cache=cache)) == "up to date"
    return plan


def _run(backend, slot: int, parts: list[dict[str, np.ndarray]]):
    return asyncio.run(backend.run(slot, Batch(tuple(parts), sum(len(next(iter(p.values()))) for p in parts))))


def _ort(onnx: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])


def _throughput(backend, make_batch, sizes: list[int], label: str) -> None:
    lines = [f"{label}: rows/s (ms per batch) by batch size"]
    for n in sizes:
        parts = [make_batch(n)]
        _run(backend, 0, parts)  # warm this shape
        reps, started = 0, time.perf_counter()
        while time.perf_counter() - started < 0.5:
            _run(backend, 0, parts)
            reps += 1
        elapsed = time.perf_counter() - started
        lines.append(f"  batch {n:4d}: {n * reps / elapsed:10.0f} rows/s ({1000 * elapsed / reps:.3f} ms)")
    print("\n" + "\n".join(lines))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tiny_plan_matches_onnxruntime(trt, tmp_path, precision):
    from trtserve.runtimes.tensorrt import TensorRTBackend

    model_dir = _copy_model("tiny", tmp_path)
    plan = _build(model_dir, precision, tmp_path / "timing.cache")
    backend = TensorRTBackend(plan, slots=2, max_batch_size=64)
    try:
        assert [t.name for t in backend.inputs] == ["INPUT"] and backend.outputs[0].dims == (16,)
        rng = np.random.default_rng(0)
        pieces = [{"INPUT": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 7, 20)]
        out = _run(backend, 0, pieces)["OUTPUT"]
        ref = _ort(model_dir / "1" / "model.onnx").run(None, {"INPUT": np.concatenate([p["INPUT"] for p in pieces])})[0]
        diff = float(np.abs(out - ref).max())
        print(f"tiny {precision}: max abs diff vs ONNX Runtime {diff:.2e}")
        assert out.dtype == np.float32 and out.shape == (28, 16) and diff <= TOL[precision]
        with pytest.raises(BackendError, match="beyond the plan's profile maximum 64"):
            _run(backend, 1, [{"INPUT": np.zeros((65, 64), np.float32)}])
        assert np.array_equal(_run(backend, 1, pieces[:1])["OUTPUT"], out[:1])  # the slot still works
        if precision == "fp32":
            _throughput(backend, lambda n: {"INPUT": rng.standard_normal((n, 64)).astype(np.float32)},
                        [1, 2, 4, 8, 16, 32, 64], "tiny fp32")
    finally:
        asyncio.run(backend.aclose())


def _minilm_rows(rng, n: int, length: int) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, 29000, (n, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_minilm_plan_matches_onnxruntime(trt, tmp_path, precision):
    from trtserve.runtimes.tensorrt import TensorRTBackend

    model_dir = _copy_model("minilm", tmp_path, max_batch_size=64)
    plan = _build(model_dir, precision, tmp_path / "timing.cache")
    backend = TensorRTBackend(plan, slots=2, max_batch_size=64)
    try:
        rng = np.random.default_rng(1)
        pieces = [_minilm_rows(rng, n, length) for n, length in ((1, 12), (3, 40), (2, 7))]
        out = _run(backend, 0, pieces)["EMBEDDING"]
        session = _ort(model_dir / "1" / "model.onnx")
        refs = np.concatenate([session.run(None, p)[0] for p in pieces])  # each piece alone, unpadded
        diff = float(np.abs(out - refs).max())
        print(f"minilm {precision}: max abs diff vs ONNX Runtime {diff:.2e}")
        assert out.shape == (6, 384) and diff <= TOL[precision]

        # two slots at once on the same profile, different shapes: same answers as one by one
        a, b = [_minilm_rows(rng, 8, 64)], [_minilm_rows(rng, 5, 200)]

        async def both():
            return await asyncio.gather(backend.run(0, Batch(tuple(a), 8)), backend.run(1, Batch(tuple(b), 5)))

        together = asyncio.run(both())
        assert np.array_equal(together[0]["EMBEDDING"], _run(backend, 0, a)["EMBEDDING"])
        assert np.array_equal(together[1]["EMBEDDING"], _run(backend, 1, b)["EMBEDDING"])

        with pytest.raises(InvalidRequest, match="beyond the plan's profile maximum 256"):
            backend.prepare(_minilm_rows(rng, 1, 300))
        if precision == "fp16":
            _throughput(backend, lambda n: _minilm_rows(rng, n, 32), [1, 2, 4, 8, 16, 32, 64], "minilm fp16, 32 tokens")
        else:
            _throughput(backend, lambda n: _minilm_rows(rng, n, 32), [1, 8, 64], "minilm fp32, 32 tokens")
    finally:
        asyncio.run(backend.aclose())


def test_a_plan_from_another_tensorrt_version_is_refused(trt, tmp_path):
    from trtserve.runtimes.tensorrt import TensorRTBackend

    model_dir = _copy_model("tiny", tmp_path)
    plan = _build(model_dir, "fp32", tmp_path / "timing.cache")
    sidecar_path = plan.parent / "model.plan.json"
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["tensorrt_version"] = "10.0.0.1"
    sidecar_path.write_text(json.dumps(sidecar))
    refusal = r"built with TensorRT 10\.0\.0\.1 but this server runs TensorRT .*; rebuild with make engine"
    with pytest.raises(BackendError, match=refusal):
        TensorRTBackend(plan, max_batch_size=64)
    sidecar_path.unlink()  # no sidecar: loaded unchecked (with a warning), works
    backend = TensorRTBackend(plan, max_batch_size=64)
    asyncio.run(backend.aclose())
    plan.write_bytes(b"garbage")
    with pytest.raises(BackendError, match="cannot deserialize"):
        TensorRTBackend(plan, max_batch_size=64)


def test_the_server_serves_a_built_plan_with_tensorrt(trt, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.registry import ModelRegistry
    from trtserve.ipc.engine import ModelState
    from trtserve.serving.inprocess import local_model

    model_dir = _copy_model("tiny", tmp_path)
    _build(model_dir, "fp32", tmp_path / "timing.cache")

    async def go():
        pool = ThreadPoolExecutor(1)
        repo = ModelRegistry(tmp_path, clock=MonotonicClock(), backend_factory=runtimes.create)
        await repo.load_all()
        try:
            entry = repo.models["tiny"]
            assert entry.state is ModelState.READY, entry.reason
            assert entry.spec is not None and entry.spec.platform == "tensorrt_plan"
            return (await local_model(repo, "tiny", pool).infer({"INPUT": np.ones((3, 64), np.float32)}))[0]
        finally:
            await repo.aclose()
            pool.shutdown()

    out = asyncio.run(go())
    ref = _ort(model_dir / "1" / "model.onnx").run(None, {"INPUT": np.ones((3, 64), np.float32)})[0]
    assert np.abs(out["OUTPUT"] - ref).max() <= 1e-3
