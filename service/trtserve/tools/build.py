"""Build TensorRT plans from the repository's ONNX models (``trtserve build`` / ``make engine``).

For each model whose served version holds ``model.onnx`` with tensors TensorRT can exchange,
on a machine with TensorRT and a CUDA device:

1. precision: ``fp32`` builds the ONNX file as it is. TensorRT 11 removed the precision builder
   flags and every network is strongly typed, so ``fp16``/``bf16`` convert the ONNX graph
   first, keeping FP32 inputs and outputs: NVIDIA ModelOpt AutoCast when installed
   (``modelopt.onnx.autocast.convert_to_mixed_precision``, fp16 and bf16), else for fp16
   onnxconverter-common (``float16.convert_float_to_float16(keep_io_types=True)``).
2. network: ``create_network(1 << STRONGLY_TYPED)`` (TensorRT 11 ignores the flag, always
   strongly typed; on 10.x it keeps the converted graph's types), ``OnnxParser.parse_from_file``;
   every parser error is reported.
3. config: one optimization profile (or one per execution slot with ``--profile-per-slot``;
   shapes from :mod:`.build_options`): batch axis min 1 / opt the largest preferred batch size
   (else ``max_batch_size``) / max ``max_batch_size``; every other dynamic axis ``--dim-range``
   (default 1:128:256, minilm's sequence lengths); workspace limit; builder optimization level;
   a timing cache file reused across builds; optional hardware and version compatibility.
4. ``build_serialized_network`` (``None`` → error with TensorRT's logged errors), then
   ``model.plan`` written atomically (temp file, fsync, rename) with its sidecar
   ``model.plan.json`` (TensorRT version, GPU name and compute capability, CUDA versions, build
   options, profiles, I/O), and the config's ``platform`` set to ``tensorrt_plan``.

A plan whose sidecar matches the ONNX file, the options, the TensorRT version and the GPU is
left alone ("up to date"). Without TensorRT or a CUDA device nothing is built: one sentence
says what is missing and the ONNX models stay (served by ONNX Runtime).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import re
import tempfile
import time
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trtserve.files import write_atomic
from trtserve.runtimes import cuda
from trtserve.runtimes.cuda import GpuUnavailable
from trtserve.runtimes.tensorrt import logged_errors, logger, unavailable_reason
from trtserve.runtimes.tensorrt_plan import PLAN_FILE, SIDECAR_SUFFIX, TRT_TYPES
from trtserve.tools.build_options import (
    DEFAULT_DIM_RANGE,
    HARDWARE_COMPATIBILITY,
    PRECISIONS,
    BuildError,
    BuildOptions,
    Shape,
    opt_batch_size,
    parse_range,
    profile_shapes,
)

log = logging.getLogger(__name__)

SIDECAR_FORMAT = 1

# ONNX element types TensorRT can take at the engine's inputs and outputs (TRT_TYPES' names).
ONNX_TO_TRT = {"FLOAT": "FLOAT", "FLOAT16": "HALF", "BFLOAT16": "BF16", "INT8": "INT8", "INT32": "INT32",
               "INT64": "INT64", "BOOL": "BOOL", "UINT8": "UINT8"}
assert set(ONNX_TO_TRT.values()) <= set(TRT_TYPES)


# --------------------------------------------------------------------------- ONNX side (CPU)


def onnx_io(path: Path) -> tuple[list[tuple[str, str, Shape]], list[tuple[str, str, Shape]]]:
    """The graph inputs and outputs of an ONNX file as (name, ONNX element type name, shape
    with -1 for symbolic dims); weights are not loaded."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}

    def describe(values: Any) -> list[tuple[str, str, Shape]]:
        out = []
        for v in values:
            if v.name in initializers:
                continue
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim)
            out.append((v.name, onnx.TensorProto.DataType.Name(t.elem_type), dims))
        return out

    return describe(model.graph.input), describe(model.graph.output)


def unsupported_io(path: Path) -> str | None:
    """Why TensorRT cannot take this ONNX model's inputs/outputs (e.g. STRING tensors), or None."""
    inputs, outputs = onnx_io(path)
    bad = [f"'{n}' ({t})" for n, t, _ in (*inputs, *outputs) if t not in ONNX_TO_TRT]
    return f"tensors {', '.join(bad)} have no TensorRT type" if bad else None


def convert_precision(src: Path, precision: str, dst: Path) -> str:
    """Write ``src`` converted to ``precision`` (``fp16``/``bf16``) to ``dst``, inputs and outputs
    kept in FP32, and return the converter used.

    Raises:
        BuildError: no converter is installed for ``precision`` (the message says which to install).
    """
    import onnx

    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError:
        convert_to_mixed_precision = None
    if convert_to_mixed_precision is not None:
        model = convert_to_mixed_precision(onnx_path=str(src), low_precision_type=precision, keep_io_types=True)
        converter = "modelopt.autocast"
    elif precision == "fp16":
        try:
            from onnxconverter_common import float16
        except ImportError as exc:
            raise BuildError(
                "--precision fp16 needs onnxconverter-common or nvidia-modelopt (pip install 'trtserve[tensorrt]')"
            ) from exc
        with warnings.catch_warnings():  # one UserWarning per clamped constant
            warnings.simplefilter("ignore", UserWarning)
            model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
        _fix_float_casts(model)
        converter = "onnxconverter_common.float16"
    else:
        raise BuildError("--precision bf16 needs NVIDIA ModelOpt AutoCast (pip install 'nvidia-modelopt[onnx]')")
    onnx.save(model, str(dst))
    return converter


def _fix_float_casts(model: Any) -> int:
    """Repair what onnxconverter-common leaves inconsistent: a graph's own ``Cast(to=FLOAT)``
    whose output it retyped as FLOAT16 (minilm's attention-mask cast). The cast is made to
    produce FLOAT16, as everything downstream now expects; returns how many were fixed."""
    from onnx import TensorProto

    retyped = {v.name for v in model.graph.value_info if v.type.tensor_type.elem_type == TensorProto.FLOAT16}
    fixed = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or node.output[0] not in retyped:
            continue
        for attr in node.attribute:
            if attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
                fixed += 1
    return fixed


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_PLATFORM_LINE = re.compile(r'^(\s*)(platform|backend)\s*:\s*"([^"]*)"', re.MULTILINE)


def with_platform(config_text: str, platform: str = "tensorrt_plan") -> str:
    """``config_text`` with its ONNX ``platform`` line set to ``platform`` (comments and every
    other line kept); one is added after ``name`` when there is none."""
    match = _PLATFORM_LINE.search(config_text)
    if match:
        return config_text[: match.start()] + f'{match.group(1)}platform: "{platform}"' + config_text[match.end():]
    name = re.search(r'^\s*name\s*:.*$', config_text, re.MULTILINE)
    at = name.end() if name else 0
    line = ("\n" if name else "") + f'platform: "{platform}"' + ("" if name else "\n")
    return config_text[:at] + line + config_text[at:]


# --------------------------------------------------------------------------- the build (GPU)


def build_model(model_dir: Path, options: BuildOptions, *, force: bool = False) -> str:
    """Build ``model_dir``'s plan; returns "built", "up to date" or "skipped: <why>".

    Raises:
        GpuUnavailable: no TensorRT or no CUDA device.
        BuildError: the ONNX file cannot be parsed or the builder failed (with TensorRT's errors).
    """
    from trtserve.repository import CONFIG_FILE, load_spec

    spec = load_spec(model_dir)
    declared = spec.config.platform if spec.config is not None else ""
    onnx_path = spec.version_dir / "model.onnx"
    if declared not in ("onnxruntime_onnx", "tensorrt_plan") or not onnx_path.is_file():
        return "skipped: no ONNX model"
    why = unsupported_io(onnx_path)
    if why:
        return f"skipped: {why}"
    reason = unavailable_reason(options.device)
    if reason is not None:
        raise GpuUnavailable(reason)
    import tensorrt as trt

    info = cuda.preflight(options.device)
    cuda.set_device(options.device)
    plan_path = spec.version_dir / PLAN_FILE
    sidecar_path = plan_path.with_name(plan_path.name + SIDECAR_SUFFIX)
    max_batch = spec.policy.max_batch_size
    opt_batch = opt_batch_size(max_batch, spec.policy.preferred_batch_sizes, options.opt_batch) if spec.batched else 0
    recorded = {**options.recorded(), "onnx_sha256": file_sha256(onnx_path), "max_batch_size": max_batch,
                "opt_batch": opt_batch}
    recorded["profiles"] = spec.instances if options.profile_per_slot else 1
    trt_version = str(trt.__version__)
    if not force and plan_path.is_file() and _current(sidecar_path, recorded, trt_version, info.compute_capability):
        _set_platform(model_dir / CONFIG_FILE)
        return "up to date"

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trtserve-build-") as tmp:
        source, converter = onnx_path, "none"
        if options.precision != "fp32":
            source = Path(tmp) / f"model.{options.precision}.onnx"
            converter = convert_precision(onnx_path, options.precision, source)
        n_profiles = recorded["profiles"]
        plan, network_io, profiles = _build(source, spec.batched, max_batch, opt_batch, options, n_profiles, info)
    recorded["converter"] = converter
    sidecar = {
        "format": SIDECAR_FORMAT,
        "tensorrt_version": trt_version,
        "gpu": {"name": info.name, "compute_capability": info.compute_capability, "total_memory": info.total_memory},
        "cuda": {"runtime": info.runtime_version, "driver": info.driver_version},
        "build": recorded,
        "profiles": profiles,
        "io": network_io,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    write_atomic(plan_path, plan)
    write_atomic(sidecar_path, (json.dumps(sidecar, indent=2) + "\n").encode())
    _set_platform(model_dir / CONFIG_FILE)
    return "built"


def _current(sidecar_path: Path, recorded: Mapping[str, Any], trt_version: str, compute_capability: str) -> bool:
    try:
        old = json.loads(sidecar_path.read_text())
    except (OSError, ValueError):
        return False
    build = dict(old.get("build", {}))
    build.pop("converter", None)
    return (
        build == dict(recorded)
        and old.get("tensorrt_version") == trt_version
        and old.get("gpu", {}).get("compute_capability") == compute_capability
    )


def _set_platform(config_path: Path) -> None:
    text = config_path.read_text()
    new = with_platform(text)
    if new != text:
        write_atomic(config_path, new.encode())


def _build(
    onnx_path: Path,
    batched: bool,
    max_batch: int,
    opt_batch: int,
    options: BuildOptions,
    n_profiles: int,
    info: cuda.DeviceInfo,
) -> tuple[memoryview, list[dict[str, Any]], list[dict[str, Any]]]:
    import tensorrt

    mark = logger().errors.mark()
    try:
        builder = tensorrt.Builder(logger())
    except TypeError as exc:  # pybind's "factory function returned nullptr": CUDA did not initialise
        raise GpuUnavailable(f"TensorRT's builder cannot start on this machine{logged_errors(mark)}") from exc
    # TensorRT 11 is always strongly typed and ignores the flag; 10.x needs it to keep the
    # converted graph's FP16/BF16 types (its EXPLICIT_BATCH flag is gone in 11).
    network = builder.create_network(1 << int(tensorrt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = tensorrt.OnnxParser(network, logger())
    if not parser.parse_from_file(str(onnx_path)):
        errors = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            if e is not None:
                errors.append(f"{e.node_name() or 'node ' + str(e.node())} ({e.node_operator()}): {e.desc()}")
        raise BuildError(f"TensorRT's ONNX parser rejected {onnx_path}: " + "; ".join(errors or ["no details"])
                         + logged_errors(mark))
    network_inputs = [network.get_input(i) for i in range(network.num_inputs)]
    shapes = profile_shapes(
        [(t.name, tuple(int(d) for d in t.shape)) for t in network_inputs],
        batched=batched,
        max_batch_size=max_batch,
        opt_batch=opt_batch,
        dim_range=options.dim_range,
    )
    config = builder.create_builder_config()
    if options.workspace_mib:
        config.set_memory_pool_limit(tensorrt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    config.builder_optimization_level = options.optimization_level
    for _ in range(n_profiles):
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    if options.hardware_compatibility != "none":
        config.hardware_compatibility_level = {
            "ampere_plus": tensorrt.HardwareCompatibilityLevel.AMPERE_PLUS,
            "same_compute_capability": tensorrt.HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY,
        }[options.hardware_compatibility]
    if options.version_compatible:
        config.set_flag(tensorrt.BuilderFlag.VERSION_COMPATIBLE)
    cache_path = options.timing_cache
    if cache_path is not None:
        _use_timing_cache(config, cache_path)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        why = logged_errors(mark) or " (no error was logged)"
        raise BuildError(f"TensorRT could not build a plan from {onnx_path}{why}")
    if cache_path is not None:
        done = config.get_timing_cache()
        if done is not None:
            write_atomic(cache_path, memoryview(done.serialize()))
    io = [
        {"name": t.name, "mode": mode, "dtype": t.dtype.name, "shape": [int(d) for d in t.shape]}
        for mode, tensors in (("input", network_inputs),
                              ("output", [network.get_output(i) for i in range(network.num_outputs)]))
        for t in tensors
    ]
    bounds = {name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in shapes.items()}
    profiles = [bounds] * n_profiles
    return memoryview(plan), io, profiles


def _use_timing_cache(config: Any, path: Path) -> None:
    """Attach the timing cache in ``path`` (a fresh one when there is none, or it is from
    another device or TensorRT version, which TensorRT refuses unless told to ignore it)."""
    previous = path.read_bytes() if path.is_file() else b""
    for blob in (previous, b"") if previous else (b"",):
        try:
            cache = config.create_timing_cache(blob)
            if cache is not None and config.set_timing_cache(cache, False):
                return
        except (RuntimeError, TypeError, ValueError):
            continue
    log.warning("no timing cache could be attached; the build tunes every kernel from scratch")


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``trtserve build``'s flags: the models, ``--force`` and the TensorRT options."""
    parser.add_argument("--force", action="store_true", help="rebuild even when inputs are unchanged")
    parser.add_argument("models", nargs="*", help="only these models (default: all with a build.py)")
    g = parser.add_argument_group("TensorRT plans (built where TensorRT and a CUDA device exist)")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--tensorrt", dest="tensorrt", action="store_const", const="require", default="auto",
                      help="require TensorRT plans: exit non-zero when TensorRT or a CUDA device is missing")
    mode.add_argument("--no-tensorrt", dest="tensorrt", action="store_const", const="skip",
                      help="build no TensorRT plans")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp16/bf16 convert the ONNX graph before the build, FP32 inputs/outputs kept (default: fp32)")
    g.add_argument("--dim-range", type=parse_range, default=DEFAULT_DIM_RANGE, metavar="MIN:OPT:MAX",
                   help="profile of every dynamic axis other than the batch, e.g. sequence length (default: 1:128:256)")
    g.add_argument("--opt-batch", type=int, default=0,
                   help="batch size to tune for (default: largest preferred batch size, else max_batch_size)")
    g.add_argument("--workspace-mib", type=int, default=0,
                   help="builder workspace limit in MiB (default: 0, TensorRT's default)")
    g.add_argument("--opt-level", type=int, default=3, help="builder optimization level 0..5 (default: 3)")
    g.add_argument("--timing-cache", type=Path, default=Path("build/tensorrt-timing.cache"),
                   help="timing cache file reused across builds (default: build/tensorrt-timing.cache; '' for none)")
    g.add_argument("--hardware-compat", choices=HARDWARE_COMPATIBILITY, default="none",
                   help="hardware compatibility level (default: none)")
    g.add_argument("--version-compatible", action="store_true",
                   help="plans that newer TensorRT versions can run (slower to load)")
    g.add_argument("--profile-per-slot", action="store_true", help="one optimization profile per execution slot")
    g.add_argument("--device", type=int, default=0, help="CUDA device to build on (default: 0)")


def run(args: argparse.Namespace) -> int:
    """Run ``build(model_dir, force)`` of every ``engines/<model>/build.py`` (ONNX exports and
    the files they serve with, test models), then build the TensorRT plans (:func:`build_all`).

    A recipe that raises ``RuntimeError`` (its own sentence: a missing package, a failed
    check) is reported in one line, ``<model>: not built: <why>``, and the others still build.
    A model directory without a recipe (its files are committed as they are served) gets
    ``<model>: nothing to build``; a named model with no directory, ``<model>: not built: ...``.
    Returns the exit status: 0, or 1 when a recipe or a plan failed or a named model is missing."""
    root: Path = args.model_repository
    recipes = sorted(root.glob("*/build.py"))
    plain = sorted(d.name for d in (root.iterdir() if root.is_dir() else ()) if (d / "config.pbtxt").is_file()
                   and not (d / "build.py").exists())
    failed = 0
    if args.models:
        recipes = [r for r in recipes if r.parent.name in args.models]
        plain = [name for name in plain if name in args.models]
        for name in sorted(set(args.models) - {r.parent.name for r in recipes} - set(plain)):
            failed += 1
            print(f"{name}: not built: no model directory {root / name} with a config.pbtxt")
    for name in plain:
        print(f"{name}: nothing to build (no build.py; its files are served as they are)")
    for recipe in recipes:
        model_dir = recipe.parent
        spec = importlib.util.spec_from_file_location(f"trtserve_build_{model_dir.name}", recipe)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            changed = module.build(model_dir, force=args.force)
        except RuntimeError as exc:
            failed += 1
            print(f"{model_dir.name}: not built: {exc}")
            continue
        print(f"{model_dir.name}: {'built' if changed else 'up to date'}")
    # Plans where TensorRT and a CUDA device exist; otherwise one sentence saying what is
    # missing (exit 0, the ONNX models remain; 1 with --tensorrt).
    plans = build_all(root, args)
    return 1 if failed else plans


def build_all(root: Path, args: argparse.Namespace) -> int:
    """Build the plans of every model under ``root`` (or ``args.models``); print one line per
    model, or one sentence when nothing can be built. Returns the exit status: 0, or 1 when a
    build failed or ``--tensorrt`` was given on a machine that cannot build."""
    mode = getattr(args, "tensorrt", "auto")
    if mode == "skip":
        return 0
    reason = unavailable_reason(getattr(args, "device", 0))
    if reason is not None:
        print(f"No TensorRT plans were built: {reason}; the ONNX models will be served by ONNX Runtime on the CPU.")
        return 1 if mode == "require" else 0
    cache = args.timing_cache if str(args.timing_cache) not in ("", ".") else None
    try:
        options = BuildOptions(
            precision=args.precision,
            dim_range=args.dim_range,
            opt_batch=args.opt_batch,
            workspace_mib=args.workspace_mib,
            optimization_level=args.opt_level,
            timing_cache=cache,
            hardware_compatibility=args.hardware_compat,
            version_compatible=args.version_compatible,
            profile_per_slot=args.profile_per_slot,
            device=args.device,
        )
    except ValueError as exc:
        print(f"trtserve build: {exc}")
        return 2
    from trtserve.repository import CONFIG_FILE

    failed = 0
    for model_dir in sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file()):
        if args.models and model_dir.name not in args.models:
            continue
        try:
            status = build_model(model_dir, options, force=args.force)
        except Exception as exc:  # one model's failure is reported; the others still build
            failed += 1
            status = f"TensorRT build failed: {exc}"
        print(f"{model_dir.name}: plan {status}")
    return 1 if failed else 0


__all__ = [
    "add_arguments",
    "build_all",
    "build_model",
    "convert_precision",
    "onnx_io",
    "run",
    "unsupported_io",
    "with_platform",
]
