"""The TensorRT path's checks that need no GPU: packing into caller-owned buffers, profile
bounds, sidecar mismatch sentences, the builder's pure parts and its one-sentence refusal,
lazy imports, the runtime factory's fallback, the cuda-python layer's errors, and mypy over
runtimes/{tensorrt,tensorrt_plan,cuda}.py and tools/{build,build_options}.py against the stubs
in typings/.

Tests that assume a machine without TensorRT or a CUDA device skip where one exists (the
GPU checks are tests/gpu/)."""

from __future__ import annotations

import ast
import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtserve.datatypes import DATATYPES
from trtserve.errors import BackendError, InvalidRequest
from trtserve.runtimes import cuda
from trtserve.runtimes.base import Batch, StagingBuffers, pack, padded_shape, unpack, view_into
from trtserve.runtimes.tensorrt import TensorRTBackend, import_tensorrt, unavailable_reason
from trtserve.runtimes.tensorrt_plan import ProfileBounds, check_profile, check_request, sidecar_problems
from trtserve.spec import TensorSpec
from trtserve.tools.build import convert_precision, unsupported_io, with_platform
from trtserve.tools.build_options import BuildOptions, opt_batch_size, parse_range, profile_shapes

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = ROOT / "service" / "trtserve" / "runtimes"
SENTINEL = 0xAB

no_gpu = pytest.mark.skipif(unavailable_reason() is None, reason="this machine has TensorRT and a CUDA device")


def _tensorrt_missing() -> str | None:
    """Why TensorRT cannot be used here (not installed, or installed without its libraries), or
    ``None`` where it imports (a GPU machine, or a CPU machine with TensorRT and no driver)."""
    try:
        import_tensorrt()
    except cuda.GpuUnavailable as exc:
        return str(exc)
    return None


def spec(name: str, datatype: str, dims: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(name, DATATYPES[datatype], dims)


def buffer(nbytes: int) -> np.ndarray:
    """A stand-in for a slot's pinned buffer: uint8, pre-filled with a sentinel byte."""
    return np.full(nbytes, SENTINEL, dtype=np.uint8)


# --------------------------------------------------------------------------- packing


def test_pack_into_caller_buffers_writes_rows_at_offsets_and_pads_byte_exact():
    ids = spec("input_ids", "INT64", (-1,))
    a = np.array([[101, 7, 102]], dtype=np.int64)
    b = np.array([[101, 102], [101, 9]], dtype=np.int64)
    c = np.array([[101, 5, 6, 102]], dtype=np.int64)
    batch = Batch(({"input_ids": a}, {"input_ids": b}, {"input_ids": c}), rows=4)
    out = {"input_ids": buffer(8 * 4 * 8)}  # room for 8 rows of 4

    packed = pack(batch, [ids], None, 0.0, out=out)

    arr = packed["input_ids"]
    assert arr.shape == (4, 4) and arr.flags.c_contiguous
    assert np.shares_memory(arr, out["input_ids"]) and arr.ctypes.data == out["input_ids"].ctypes.data
    expected = np.array([[101, 7, 102, 0], [101, 102, 0, 0], [101, 9, 0, 0], [101, 5, 6, 102]], dtype=np.int64)
    used = expected.nbytes
    assert out["input_ids"][:used].tobytes() == expected.tobytes()  # offsets and padding, byte for byte
    assert (out["input_ids"][used:] == SENTINEL).all()  # nothing written past the batch


def test_pack_into_caller_buffers_copies_a_single_piece_too():
    x = spec("INPUT", "FP32", (4,))
    piece = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = {"INPUT": buffer(64)}
    packed = pack(Batch(({"INPUT": piece},), rows=2), [x], None, 0.0, out=out)
    assert not np.shares_memory(packed["INPUT"], piece)
    assert out["INPUT"][: piece.nbytes].tobytes() == piece.tobytes()
    assert (out["INPUT"][piece.nbytes :] == SENTINEL).all()


@pytest.mark.parametrize(
    "datatype, values",
    [
        ("FP16", np.array([[1.5, -2.25]], dtype=np.float16)),
        ("BF16", np.array([[1.5, -2.25]], dtype=ml_dtypes.bfloat16)),
        ("BOOL", np.array([[True, False]])),
        ("INT8", np.array([[-3, 4]], dtype=np.int8)),
        ("UINT8", np.array([[250, 4]], dtype=np.uint8)),
        ("INT32", np.array([[-3, 1 << 30]], dtype=np.int32)),
    ],
)
def test_pack_into_caller_buffers_keeps_each_dtype_bit_exact(datatype, values):
    t = spec("T", datatype, (-1,))
    short = values[:, :1]
    out = {"T": buffer(64)}
    packed = pack(Batch(({"T": values}, {"T": short}), rows=2), [t], None, 7.0, out=out)
    assert packed["T"].dtype == DATATYPES[datatype].numpy
    expected = np.concatenate([values, np.concatenate([short, np.full((1, 1), 7, dtype=values.dtype)], axis=1)])
    assert packed["T"].tobytes() == expected.tobytes()


def test_pack_into_a_too_small_or_wrong_buffer_is_refused():
    x = spec("INPUT", "FP32", (4,))
    piece = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="needs 48 bytes, the buffer holds 32"):
        pack(Batch(({"INPUT": piece},), rows=3), [x], None, 0.0, out={"INPUT": buffer(32)})
    with pytest.raises(ValueError, match="1-D uint8"):
        pack(Batch(({"INPUT": piece},), rows=3), [x], None, 0.0, out={"INPUT": np.zeros(16, dtype=np.float32)})
    with pytest.raises(ValueError, match="BYTES"):
        view_into(buffer(8), (1,), np.dtype(object), "TEXT")


def test_pack_without_out_keeps_the_onnxruntime_behaviour():
    x = spec("x", "FP32", (-1,))
    piece = np.arange(3, dtype=np.float32).reshape(1, 3)
    single = pack(Batch(({"x": piece},), rows=1), [x], StagingBuffers(), 0.0)
    assert single["x"] is piece  # a contiguous single piece passes through, no copy
    two = pack(Batch(({"x": piece}, {"x": piece[:, :1]}), rows=2), [x], StagingBuffers(), -1.0)
    assert two["x"].tolist() == [[0, 1, 2], [0, -1, -1]]


def test_outputs_sliced_from_a_packed_batch_cut_padding_back():
    # what the TensorRT slot returns (a copy of its pinned output) goes through the same unpack
    x, y = spec("x", "FP32", (-1,)), spec("y", "FP32", (-1,))
    parts = ({"x": np.ones((1, 3), np.float32)}, {"x": np.ones((2, 1), np.float32)})
    batch = Batch(parts, rows=3)
    out = {"y": np.arange(9, dtype=np.float32).reshape(3, 3)}
    pieces = unpack(batch, out, [y])
    assert padded_shape(parts, "x") == (3, 3)
    assert [p["y"].tolist() for p in pieces] == [[[0, 1, 2]], [[3], [6]]]
    assert x.name == "x"


# --------------------------------------------------------------------------- profile bounds

BOUNDS = {
    "input_ids": ProfileBounds("input_ids", (1, 1), (64, 256)),
    "attention_mask": ProfileBounds("attention_mask", (1, 1), (64, 256)),
}


def test_profile_check_accepts_shapes_inside_the_profile():
    check_profile({"input_ids": (64, 256), "attention_mask": (1, 1)}, BOUNDS)


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"input_ids": (65, 10)}, "batch of input 'input_ids' is 65, beyond the plan's profile maximum 64"),
        ({"attention_mask": (2, 257)}, "dim 1 of input 'attention_mask' is 257, beyond the plan's profile maximum 256"),
        ({"input_ids": (2, 0)}, "dim 1 of input 'input_ids' is 0, below the plan's profile minimum 1"),
        ({"input_ids": (2, 3, 4)}, "input 'input_ids' has 3 dims, the plan expects 2"),
    ],
)
def test_profile_check_refuses_a_batch_beyond_the_profile(shapes, message):
    with pytest.raises(BackendError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_profile(shapes, BOUNDS)


def test_request_check_refuses_a_long_sequence_at_admission():
    check_request({"input_ids": np.zeros((100, 256), np.int64)}, BOUNDS)  # rows are the dispatcher's business
    beyond = "dim 1 of input 'input_ids' is 300, beyond the plan's profile maximum 256"
    with pytest.raises(InvalidRequest, match=beyond):
        check_request({"input_ids": np.zeros((1, 300), np.int64)}, BOUNDS)


class _Untouchable:
    """A stand-in for an execution context, stream or buffer that fails the test if used."""

    def __getattr__(self, name):
        raise AssertionError(f"device object touched ({name}) for a batch the profile refuses")


def test_an_oversize_batch_is_refused_before_any_device_call():
    backend = TensorRTBackend.__new__(TensorRTBackend)  # no GPU: only the per-batch path
    backend.plan = Path("model.plan")
    backend.inputs = (spec("input_ids", "INT64", (-1,)), spec("attention_mask", "INT64", (-1,)))
    backend.outputs = (spec("EMBEDDING", "FP32", (384,)),)
    backend.batched, backend.pad_value = True, 0.0
    backend._bounds = [BOUNDS]
    never = _Untouchable()
    slot = type("Slot", (), {"profile": 0, "context": never, "stream": never, "event": never,
                             "host_in": never, "dev_in": never, "host_out": never, "dev_out": never})
    backend._slots = [slot()]
    rows = {"input_ids": np.zeros((1, 300), np.int64), "attention_mask": np.ones((1, 300), np.int64)}
    with pytest.raises(BackendError, match="beyond the plan's profile maximum 256"):
        backend._run(0, Batch((rows,), rows=1))


# --------------------------------------------------------------------------- sidecar

LIVE = {"tensorrt_version": "11.4.0.106", "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


def sidecar(trt="11.4.0.106", name="NVIDIA H100 80GB HBM3", cc="9.0", **build):
    return {"tensorrt_version": trt, "gpu": {"name": name, "compute_capability": cc}, "build": build}


def test_sidecar_matching_this_machine_passes():
    assert sidecar_problems(Path("m/1/model.plan"), sidecar(), LIVE) == (None, [])


def test_sidecar_with_another_tensorrt_version_is_refused_with_a_sentence():
    error, _ = sidecar_problems(Path("m/1/model.plan"), sidecar(trt="11.2.0.5"), LIVE)
    assert error == ("m/1/model.plan was built with TensorRT 11.2.0.5 but this server runs TensorRT 11.4.0.106; "
                     "rebuild with make engine")


def test_sidecar_for_another_compute_capability_is_refused_with_a_sentence():
    error, _ = sidecar_problems(Path("m/1/model.plan"), sidecar(name="NVIDIA A10", cc="8.6"), LIVE)
    assert error == (
        "m/1/model.plan was built for compute capability 8.6 (NVIDIA A10) but this GPU (NVIDIA H100 80GB HBM3) "
        "has compute capability 9.0; rebuild with make engine"
    )


def test_sidecar_with_both_mismatches_names_both_in_one_sentence():
    error, _ = sidecar_problems(Path("p"), sidecar(trt="10.13.0.35", name="NVIDIA T4", cc="7.5"), LIVE)
    assert error is not None and error.count(";") == 1
    assert "TensorRT 10.13.0.35" in error and "compute capability 7.5" in error
    assert error.endswith("rebuild with make engine")


def test_version_compatible_plans_run_on_newer_tensorrt_only():
    assert sidecar_problems(Path("p"), sidecar(trt="11.0.0.1", version_compatible=True), LIVE)[0] is None
    newer = sidecar_problems(Path("p"), sidecar(trt="11.5.0.1", version_compatible=True), LIVE)[0]
    assert newer is not None and "version-compatible" in newer


def test_hardware_compatible_plans_run_on_any_ampere_or_newer_gpu():
    ampere_plus = sidecar(cc="8.0", name="A100", hardware_compatibility="ampere_plus")
    assert sidecar_problems(Path("p"), ampere_plus, LIVE) == (None, [])
    turing = {**LIVE, "compute_capability": "7.5", "gpu_name": "T4"}
    error = sidecar_problems(Path("p"), sidecar(cc="8.0", hardware_compatibility="ampere_plus"), turing)[0]
    assert error is not None and "Ampere or newer" in error


def test_another_gpu_model_of_the_same_compute_capability_only_warns():
    error, warnings = sidecar_problems(Path("p"), sidecar(name="NVIDIA H200"), LIVE)
    assert error is None and len(warnings) == 1 and "NVIDIA H200" in warnings[0]


# --------------------------------------------------------------------------- builder (pure parts)


def test_profile_shapes_for_minilm_and_tiny():
    minilm = profile_shapes(
        [("input_ids", (-1, -1)), ("attention_mask", (-1, -1))],
        batched=True, max_batch_size=64, opt_batch=32, dim_range=(1, 128, 256),
    )
    assert minilm["input_ids"] == ((1, 1), (32, 128), (64, 256))
    tiny = profile_shapes([("INPUT", (-1, 64))], batched=True, max_batch_size=64, opt_batch=64, dim_range=(1, 128, 256))
    assert tiny == {"INPUT": ((1, 64), (64, 64), (64, 64))}
    with pytest.raises(BackendError, match="fixed batch axis"):
        profile_shapes([("INPUT", (8, 64))], batched=True, max_batch_size=64, opt_batch=64, dim_range=(1, 1, 1))


def test_opt_batch_is_the_largest_preferred_size_that_fits():
    assert opt_batch_size(64, [8, 16, 32]) == 32
    assert opt_batch_size(16, [8, 32]) == 8
    assert opt_batch_size(16, []) == 16
    assert opt_batch_size(16, [8], requested=40) == 16


def test_build_options_are_validated_with_the_bad_value():
    assert parse_range("1:128:256") == (1, 128, 256)
    with pytest.raises(ValueError, match="MIN:OPT:MAX"):
        parse_range("1-128")
    with pytest.raises(ValueError, match="1 <= min <= opt <= max, got 4:2:8"):
        BuildOptions(dim_range=(4, 2, 8))
    with pytest.raises(ValueError, match="'int8'"):
        BuildOptions(precision="int8")
    assert BuildOptions(precision="fp16").recorded()["precision"] == "fp16"


def test_with_platform_switches_only_the_platform_line():
    text = '# comment\nname: "tiny"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
    assert with_platform(text) == '# comment\nname: "tiny"\nplatform: "tensorrt_plan"\nmax_batch_size: 64\n'
    expected = 'name: "x"\nplatform: "tensorrt_plan"\nmax_batch_size: 1\n'
    assert with_platform('name: "x"\nmax_batch_size: 1\n') == expected


def test_fp16_conversion_keeps_fp32_io_and_stays_within_1e_2(engines, tmp_path):
    pytest.importorskip("onnxconverter_common", reason="onnxconverter-common is not installed: it comes with the "
                        "export extra (pip install -e '.[export]'; `make setup` installs it)")
    import onnxruntime as ort

    from trtserve.tools.build import onnx_io

    src = engines / "tiny" / "1" / "model.onnx"
    dst = tmp_path / "tiny.fp16.onnx"
    assert convert_precision(src, "fp16", dst) == "onnxconverter_common.float16"
    assert onnx_io(dst) == onnx_io(src)  # FP32 in, FP32 out
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"INPUT": x})[0]
    half = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"INPUT": x})[0]
    assert half.dtype == np.float32 and np.abs(ref - half).max() <= 1e-2


def test_string_models_are_skipped_by_the_builder(engines):
    assert "STRING" in (unsupported_io(engines / "echo_bytes" / "1" / "model.onnx") or "")
    assert unsupported_io(engines / "minilm" / "1" / "model.onnx") is None


# --------------------------------------------------------------------------- no GPU here


def _tiny_repo(tmp_path: Path, engines: Path) -> Path:
    root = tmp_path / "repo"
    (root / "tiny").mkdir(parents=True)
    for f in ("config.pbtxt", "build.py"):
        shutil.copy(engines / "tiny" / f, root / "tiny" / f)
    return root


@no_gpu
def test_build_without_tensorrt_says_one_sentence_and_keeps_the_onnx_model(tmp_path, engines, capsys):
    from trtserve.cli import main

    root = _tiny_repo(tmp_path, engines)
    assert main(["build", "--model-repository", str(root)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "tiny: built"
    sentence = lines[-1]
    assert len(lines) == 2 and sentence.startswith("No TensorRT plans were built: ") and sentence.endswith(
        "; the ONNX models will be served by ONNX Runtime on the CPU."
    )
    assert sentence.count(".") >= 1 and "\n" not in sentence
    assert (root / "tiny" / "1" / "model.onnx").is_file() and not (root / "tiny" / "1" / "model.plan").exists()
    assert 'platform: "onnxruntime_onnx"' in (root / "tiny" / "config.pbtxt").read_text()

    assert main(["build", "--model-repository", str(root), "--tensorrt"]) == 1  # required: fails, same sentence
    assert capsys.readouterr().out.strip().splitlines()[-1] == sentence
    assert main(["build", "--model-repository", str(root), "--no-tensorrt"]) == 0
    assert "TensorRT" not in capsys.readouterr().out


def test_importing_the_gpu_modules_needs_neither_tensorrt_nor_cuda():
    code = (
        "import sys; import trtserve.runtimes.tensorrt, trtserve.runtimes.cuda, trtserve.tools.build, trtserve.cli; "
        "print(sorted(m for m in ('tensorrt', 'cuda.bindings.runtime') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@no_gpu
def test_cuda_layer_says_what_is_missing_in_one_clause():
    with pytest.raises(cuda.GpuUnavailable) as info:
        cuda.preflight()
    message = str(info.value)
    assert "(cuda" in message and "\n" not in message  # names the CUDA error, or that cuda-python is missing
    # TensorRT's clause where it is missing or cannot load; none where it imports without a driver
    assert unavailable_reason() == " and ".join(c for c in (_tensorrt_missing(), message) if c)


def test_concurrent_imports_of_a_tensorrt_that_fails_part_way_all_raise(tmp_path, monkeypatch):
    # A `tensorrt` whose import fails part-way, as the real one does where its libraries are missing.
    # The first import holds at a gate while the other threads arrive (the pause before opening it
    # only gives them time to; no result depends on it); half of them import it bare, as code
    # outside trtserve may. Every import_tensorrt() must raise, never hand back the half-initialised
    # module (before the fix, the threads that arrived during the first import got it, no error).
    gate = types.SimpleNamespace(started=threading.Event(), release=threading.Event())
    monkeypatch.setitem(sys.modules, "_trtserve_test_gate", gate)  # type: ignore[arg-type]
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.py").write_text(
        "import sys\n__version__ = '11.4.0.106'\ngate = sys.modules['_trtserve_test_gate']\n"
        "gate.started.set()\ngate.release.wait(30)\n"
        "raise ImportError('libnvinfer.so.11: cannot open shared object file: No such file or directory')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)

    def attempt(i: int) -> str:
        if i % 2:
            try:
                import tensorrt  # noqa: F401
            except ImportError:
                pass
            return "bare"
        try:
            import_tensorrt()
        except cuda.GpuUnavailable as exc:
            return str(exc)
        return "a module and no error"

    with ThreadPoolExecutor(16) as pool:
        first = pool.submit(attempt, 0)
        assert gate.started.wait(30)
        rest = [pool.submit(attempt, i) for i in range(1, 16)]
        time.sleep(0.2)
        gate.release.set()
        results = [r for r in (f.result() for f in (first, *rest)) if r != "bare"]
    assert len(results) == 8
    assert all(r.startswith("TensorRT is installed but cannot be loaded: ") for r in results), results


def test_cuda_errors_carry_the_cuda_error_name():
    pytest.importorskip("cuda.bindings.runtime")
    assert cuda.error_name(35) == "cudaErrorInsufficientDriver"
    assert cuda.error_name(100) == "cudaErrorNoDevice"
    err = cuda.CudaError("cudaMalloc", 2, "cudaErrorMemoryAllocation")
    assert isinstance(err, BackendError) and str(err) == "cudaMalloc failed: cudaErrorMemoryAllocation"


def _write_model(root: Path, name: str, config: str, files: dict[str, bytes]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    for f, data in files.items():
        (root / name / "1" / f).write_bytes(data)


@no_gpu
def test_a_plan_model_is_not_ready_with_the_reason_while_others_serve(tmp_path, engines):
    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.registry import ModelRegistry
    from trtserve.ipc.engine import ModelState
    from trtserve.repository import load_spec
    from trtserve.serving.inprocess import local_model

    onnx = (engines / "tiny" / "1" / "model.onnx").read_bytes()
    tiny_config = (engines / "tiny" / "config.pbtxt").read_text()
    root = tmp_path / "repo"
    # plan only: cannot be served here
    plan_config = tiny_config.replace('"tiny"', '"planonly"').replace("onnxruntime_onnx", "tensorrt_plan")
    _write_model(root, "planonly", plan_config, {"model.plan": b"not a real plan"})
    # plan + the ONNX it was built from, platform tensorrt_plan: ONNX Runtime serves the ONNX file
    _write_model(root, "both", tiny_config.replace('"tiny"', '"both"').replace("onnxruntime_onnx", "tensorrt_plan"),
                 {"model.plan": b"not a real plan", "model.onnx": onnx})
    _write_model(root, "tiny", tiny_config, {"model.onnx": onnx})

    assert load_spec(root / "both").platform == "onnxruntime_onnx"
    assert load_spec(root / "planonly").platform == "tensorrt_plan"

    async def go():
        pool = ThreadPoolExecutor(1)
        repo = ModelRegistry(root, clock=MonotonicClock(), backend_factory=runtimes.create)
        await repo.load_all()
        try:
            states = {name: (e.state, e.reason) for name, e in repo.models.items()}
            out, _, _ = await local_model(repo, "both", pool).infer({"INPUT": np.ones((2, 64), np.float32)})
            return states, out
        finally:
            await repo.aclose()
            pool.shutdown()

    states, out = asyncio.run(go())
    assert states["tiny"][0] is ModelState.READY and states["both"][0] is ModelState.READY
    state, reason = states["planonly"]
    assert state is ModelState.UNAVAILABLE
    assert f"planonly/1/model.plan needs TensorRT and an NVIDIA GPU, but {unavailable_reason()}" in reason
    assert out["OUTPUT"].shape == (2, 16)


# --------------------------------------------------------------------------- typing


def _stub_names(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text())
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def test_cuda_stub_names_and_enum_values_exist_in_the_installed_cuda_python():
    rt = pytest.importorskip("cuda.bindings.runtime")
    for name, node in _stub_names(ROOT / "typings" / "cuda" / "bindings" / "runtime.pyi").items():
        assert hasattr(rt, name), f"typings/cuda/bindings/runtime.pyi names {name}, which cuda.bindings.runtime lacks"
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                    member = item.targets[0].id  # type: ignore[attr-defined]
                    assert int(getattr(getattr(rt, name), member)) == item.value.value, f"{name}.{member}"
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    assert hasattr(getattr(rt, name)(), item.target.id), f"{name}.{item.target.id}"


def _stub_mismatches(body: list[ast.stmt], real: object, where: str) -> list[str]:
    """What the stub's classes, methods, attributes and enum members in ``body`` say that the
    real object ``real`` contradicts. Private and dunder names are the stub's own (protocols such
    as ``__iter__`` and ``__buffer__`` hold by behaviour, not by attribute)."""
    wrong: list[str] = []
    for node in body:
        name = (node.target.id if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                else getattr(node, "name", None))
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AnnAssign)) or name is None or name.startswith("_"):
            continue
        if not hasattr(real, name):
            wrong.append(f"{where}{name} is not in this TensorRT")
            continue
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(real, name)
        bases = {ast.unparse(b) for b in node.bases}
        if bases & {"_PybindEnum", "enum.Enum", "enum.IntEnum"}:
            members = getattr(cls, "__members__", {})
            for item in node.body:
                if not isinstance(item, ast.Assign):
                    continue
                member = item.targets[0].id  # type: ignore[attr-defined]
                stated = item.value.value if isinstance(item.value, ast.Constant) else ...
                if member not in members:
                    wrong.append(f"{where}{name}.{member} is not in this TensorRT")
                elif stated is not ... and int(members[member]) != stated:
                    wrong.append(f"{where}{name}.{member} is {int(members[member])}, the stub says {stated}")
                elif ("enum.IntEnum" in bases) != isinstance(members[member], int):
                    wrong.append(f"{where}{name}.{member}: int-ness differs (the stub's bases are {sorted(bases)})")
        wrong += _stub_mismatches(node.body, cls, f"{where}{name}.")
    return wrong


def test_tensorrt_stub_names_and_enum_values_hold_in_the_installed_tensorrt():
    # only where TensorRT imports (GPU machines, or `make trt-bindings-check` on a CPU machine)
    try:
        trt = import_tensorrt()
    except cuda.GpuUnavailable as exc:
        pytest.skip(str(exc))
    tree = ast.parse((ROOT / "typings" / "tensorrt" / "__init__.pyi").read_text())
    assert _stub_mismatches(tree.body, trt, "") == [], f"typings/tensorrt against TensorRT {trt.__version__}"


def test_mypy_finds_no_errors_in_the_gpu_modules(request, tmp_path_factory):
    pytest.importorskip("mypy")
    # a warm cache under .pytest_cache makes reruns take seconds instead of ~25 s
    pytest_cache = getattr(request.config, "cache", None)
    cache = pytest_cache.mkdir("mypy") if pytest_cache is not None else tmp_path_factory.mktemp("mypy")
    files = [str(RUNTIMES / f) for f in ("tensorrt.py", "tensorrt_plan.py", "cuda.py")]
    files += [str(ROOT / "service" / "trtserve" / "tools" / f) for f in ("build.py", "build_options.py")]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--cache-dir", str(cache), *files],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"Success: no issues found in {len(files)} source files")


def test_json_sidecar_round_trip_is_what_the_loader_reads(tmp_path):
    from trtserve.runtimes.tensorrt_plan import read_sidecar

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"x")
    assert read_sidecar(plan) is None
    (tmp_path / "model.plan.json").write_text(json.dumps(sidecar()))
    assert read_sidecar(plan) == sidecar()


@no_gpu
def test_build_names_the_models_with_nothing_to_build_and_refuses_a_missing_one(tmp_path, engines, capsys):
    from trtserve.cli import main

    root = _tiny_repo(tmp_path, engines)
    (root / "slow").mkdir()
    shutil.copy(engines / "slow" / "config.pbtxt", root / "slow" / "config.pbtxt")
    assert main(["build", "--model-repository", str(root)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:2] == ["slow: nothing to build (no build.py; its files are served as they are)", "tiny: built"]
    assert main(["build", "--model-repository", str(root), "tiny", "nosuch"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"nosuch: not built: no model directory {root / 'nosuch'} with a config.pbtxt"
    assert lines[1] == "tiny: up to date"
