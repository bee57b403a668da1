"""TensorRT plans on CUDA streams: the GPU engine.

Load: the plan's sidecar (``model.plan.json``, written by :mod:`~trtserve.tools.build`)
is compared with this machine *before* deserializing (:mod:`.tensorrt_plan`), so a plan built
with another TensorRT version or for another GPU is refused with a sentence saying which and
"rebuild with make engine"; then ``deserialize_cuda_engine`` (``None`` is checked, TensorRT's logged errors are
attached). Per execution slot, all made once at load on the slot's own thread (which calls
``cudaSetDevice`` first): one execution context on its optimization profile, one non-blocking
stream, one event, and for every I/O tensor a page-locked host buffer and a device buffer
sized for the profile's maximum shapes; the tensor addresses are set once.

Per batch, on the slot's thread: the batch's shapes are checked against the profile (a batch
or sequence beyond it is refused before any device call); the rows are packed straight into
the pinned input buffers (:func:`~trtserve.runtimes.base.pack` with ``out=``: the one copy
from the request bytes); ``set_input_shape``/``infer_shapes``; H2D copies,
``execute_async_v3``, D2H copies and an event on the slot's stream; the thread waits on the
event (cuda-python releases the GIL), never the event loop. Outputs are copied out of the
pinned buffers before the slot's next batch can reuse them. Slots run concurrently on their
own streams, so the copies of one batch overlap the compute of another.

TensorRT and CUDA failures become :class:`~trtserve.errors.BackendError` here. ``tensorrt``
and ``cuda-python`` are imported lazily: importing this module never fails on a CPU machine.
Written against the TensorRT 11 Python API; TensorRT 10.x exposes the same names used here.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trtserve.datatypes import Datatype, Tensors
from trtserve.errors import BackendError
from trtserve.runtimes import cuda
from trtserve.runtimes.base import Batch, pack, padded_shape, view_into
from trtserve.runtimes.cuda import INSTALL_HINT, GpuUnavailable
from trtserve.runtimes.tensorrt_plan import (
    REBUILD,
    ProfileBounds,
    check_profile,
    check_request,
    read_sidecar,
    sidecar_problems,
    trt_datatype,
)
from trtserve.runtimes.threads import on_slot
from trtserve.spec import TensorSpec

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- availability


_import_lock = threading.Lock()


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, imported on first use; safe from any number of threads.

    Python's import hands a module that is still initialising to a second importing thread once
    the first finishes, even when the first failed: without care, a model loading beside another
    whose ``import tensorrt`` failed part-way (its libraries missing) gets a half-initialised
    module and no error. So the import is serialised here (each caller that finds no module makes
    its own attempt and sees its own error), and the module is returned only if it is the one
    left in ``sys.modules`` (an import started elsewhere that failed is refused too).

    Raises:
        GpuUnavailable: TensorRT is not installed ("TensorRT is not installed (pip install ...)"),
            or it is but cannot be loaded (its libraries are missing, or its import failed).
    """
    with _import_lock:
        try:
            import tensorrt
        except ModuleNotFoundError as exc:
            if exc.name != "tensorrt":
                raise GpuUnavailable(f"TensorRT is installed but cannot be loaded: {exc}") from exc
            raise GpuUnavailable(f"TensorRT is not installed ({INSTALL_HINT})") from exc
        except (ImportError, OSError) as exc:
            raise GpuUnavailable(f"TensorRT is installed but cannot be loaded: {exc}") from exc
    if sys.modules.get("tensorrt") is not tensorrt:
        raise GpuUnavailable("TensorRT is installed but cannot be loaded: its import failed in another thread")
    return tensorrt


def unavailable_reason(device: int = 0) -> str | None:
    """``None`` when TensorRT imports and CUDA device ``device`` is usable; otherwise a clause
    saying what is missing (both things when both are), e.g. "TensorRT is not installed
    (pip install 'trtserve[tensorrt]') and no CUDA device is visible (cudaErrorNoDevice)"."""
    missing: list[str] = []
    try:
        import_tensorrt()
    except GpuUnavailable as exc:
        missing.append(str(exc))
    try:
        cuda.preflight(device)
    except GpuUnavailable as exc:
        missing.append(str(exc))
    return " and ".join(missing) if missing else None


# --------------------------------------------------------------------------- TensorRT logger


class _LogLines:
    """TensorRT's ERROR lines, numbered, so a caller can take those logged since a mark.
    TensorRT may call the logger from its own threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)

    def add(self, line: str) -> None:
        with self._lock:
            self._seq += 1
            self._lines.append((self._seq, line))

    def mark(self) -> int:
        with self._lock:
            return self._seq

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return [line for seq, line in self._lines if seq > mark]


_errors = _LogLines()
"""TensorRT's ERROR lines (the logger's ``errors``): kept apart from the logger so that a slot's
marks need no TensorRT (the stand-in execution contexts of tests/gpu run without it)."""


@functools.cache
def logger() -> Any:
    """The process's one TensorRT logger (a ``trt.ILogger``): forwards to Python logging
    (``trtserve.runtimes.tensorrt``) and keeps the last ERROR lines (``logger().errors``)."""
    import tensorrt as trt

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors = _errors

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            level = int(severity)
            if level <= int(trt.ILogger.Severity.ERROR):
                self.errors.add(msg)
                log.error("TensorRT: %s", msg)
            elif level == int(trt.ILogger.Severity.WARNING):
                log.warning("TensorRT: %s", msg)
            elif level == int(trt.ILogger.Severity.INFO):
                log.debug("TensorRT: %s", msg)

    return CapturingLogger()


def logged_errors(mark: int) -> str:
    """TensorRT's ERROR lines since ``mark``, joined for a message ("" if none)."""
    lines = _errors.since(mark)
    return ("; TensorRT said: " + " | ".join(lines[-3:])) if lines else ""


# --------------------------------------------------------------------------- the backend


class ExecutionContext(Protocol):
    """What a slot calls on its execution context: the part of ``trt.IExecutionContext`` this
    module uses (TensorRT's own, or a stand-in in tests/gpu). Names are tensor names; shapes
    tuples of ints; addresses and streams integers (device pointers, ``cudaStream_t``)."""

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool: ...
    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool: ...
    def infer_shapes(self) -> list[str]: ...
    def get_tensor_shape(self, name: str) -> Iterable[int]: ...
    def set_tensor_address(self, name: str, memory: int) -> bool: ...
    def execute_async_v3(self, stream_handle: int) -> bool: ...


@dataclass
class _Slot:
    """One execution slot: context, stream, event and buffers, touched only from its thread."""

    context: ExecutionContext
    profile: int
    stream: cuda.Stream
    event: cuda.Event
    host_in: dict[str, cuda.PinnedBuffer] = field(default_factory=dict)
    dev_in: dict[str, cuda.DeviceBuffer] = field(default_factory=dict)
    host_out: dict[str, cuda.PinnedBuffer] = field(default_factory=dict)
    dev_out: dict[str, cuda.DeviceBuffer] = field(default_factory=dict)

    def release(self) -> None:
        """Wait for the stream, then free everything (best effort: every resource is tried)."""
        errors: list[BaseException] = []
        buffers: list[cuda.PinnedBuffer | cuda.DeviceBuffer] = [
            *self.host_in.values(), *self.dev_in.values(), *self.host_out.values(), *self.dev_out.values()
        ]
        steps: list[Callable[[], None]] = [
            self.stream.synchronize, *(b.free for b in buffers), self.event.destroy, self.stream.destroy
        ]
        for step in steps:
            try:
                step()
            except BackendError as exc:
                errors.append(exc)
        del self.context
        if errors:
            log.warning("releasing a TensorRT slot: %s", "; ".join(map(str, errors)))


class TensorRTBackend:
    """A TensorRT plan on CUDA device ``device``. See the module docstring for the data path.

    Args:
        plan: the ``model.plan`` file (its sidecar ``model.plan.json`` beside it).
        slots: execution slots (one context, stream and buffer set each, on its own thread).
        batched: whether axis 0 of every tensor is the batch (``max_batch_size > 0``).
        max_batch_size: the config's; must fit the plan's profile (0: left to the server, which
            chooses it within :attr:`max_batch_rows`).
        pad_value: fills variable-length dims up to the longest row of a batch.
        device: the CUDA device ordinal.

    Raises:
        GpuUnavailable: no TensorRT, no cuda-python, no driver or no device (one sentence).
        BackendError: the plan does not match this machine (which mismatch, "rebuild with
            make engine"), cannot be deserialized (with TensorRT's errors), has I/O this
            server cannot exchange, or a profile smaller than ``max_batch_size``.
    """

    _runtime: trt.Runtime | None
    _engine: trt.ICudaEngine | None

    def __init__(
        self,
        plan: Path,
        *,
        slots: int = 1,
        batched: bool = True,
        max_batch_size: int = 0,
        pad_value: float = 0.0,
        device: int = 0,
    ) -> None:
        self.plan = Path(plan)
        reason = unavailable_reason(device)
        if reason is not None:
            raise GpuUnavailable(f"{self.plan} needs TensorRT and an NVIDIA GPU, but {reason}")
        trt_mod = import_tensorrt()
        info = cuda.preflight(device)
        sidecar = read_sidecar(self.plan)
        if sidecar is not None:
            error, warnings = sidecar_problems(
                self.plan,
                sidecar,
                {"tensorrt_version": str(trt_mod.__version__), "gpu_name": info.name,
                 "compute_capability": info.compute_capability},
            )
            if error:
                raise BackendError(error)
            for w in warnings:
                log.warning("%s", w)
        try:
            data = self.plan.read_bytes()
        except OSError as exc:
            raise BackendError(f"cannot read {self.plan}: {exc}") from exc
        cuda.set_device(device)
        self._runtime, engine = _deserialize(data, self.plan, sidecar)
        self._engine = engine
        inputs, outputs, bounds = _introspect(engine, self.plan, batched)
        self._start(
            functools.partial(_create_context, engine), inputs, outputs, bounds,
            slots=slots, batched=batched, max_batch_size=max_batch_size, pad_value=pad_value, device=device,
        )
        log.info("%s: TensorRT %s on %s (compute %s), %d slot(s)",
                 self.plan, trt_mod.__version__, info.name, info.compute_capability, slots)

    @classmethod
    def on_contexts(
        cls,
        make_context: Callable[[int], ExecutionContext | None],
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        bounds: Sequence[Mapping[str, ProfileBounds]],
        *,
        name: str,
        slots: int = 1,
        batched: bool = True,
        max_batch_size: int = 0,
        pad_value: float = 0.0,
        device: int = 0,
    ) -> TensorRTBackend:
        """The runtime over execution contexts that ``make_context(profile)`` makes, with no plan
        and no TensorRT: the seam where tests/gpu drive the slots, buffers, streams and events of
        this module on a real GPU with a stand-in context (a CUDA kernel launched on the slot's
        stream over the addresses set on it). ``inputs``/``outputs`` are the tensors as a plan's
        introspection gives them, ``bounds`` each profile's input bounds; ``name`` stands for the
        plan's path in messages. The other arguments are the constructor's.

        Raises:
            GpuUnavailable: cuda-bindings, the driver or the device is missing.
            BackendError: as the constructor, for what it checks after loading the plan.
        """
        cuda.preflight(device)
        cuda.set_device(device)
        self = cls.__new__(cls)
        self.plan = Path(name)
        self._runtime = self._engine = None
        self._start(make_context, tuple(inputs), tuple(outputs), [dict(b) for b in bounds],
                    slots=slots, batched=batched, max_batch_size=max_batch_size, pad_value=pad_value, device=device)
        return self

    def _start(
        self,
        make_context: Callable[[int], ExecutionContext | None],
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        bounds: list[dict[str, ProfileBounds]],
        *,
        slots: int,
        batched: bool,
        max_batch_size: int,
        pad_value: float,
        device: int,
    ) -> None:
        """Make the slots (one thread, context, stream, event and buffer set each)."""
        self._make_context = make_context
        self.slots = slots
        self.batched = batched
        self.pad_value = pad_value
        self.device = device
        self.inputs, self.outputs, self._bounds = inputs, outputs, bounds
        self._profiles = [i if len(bounds) >= slots else 0 for i in range(slots)]
        self.max_batch_rows = (
            min(b.max[0] for p in set(self._profiles) for b in self._bounds[p].values()) if batched else None
        )
        """The profiles' bound on a batch (:class:`~trtserve.runtimes.base.BatchBounded`)."""
        if batched:
            for name, b in self._bounds[0].items():
                if max_batch_size > b.max[0]:
                    raise BackendError(
                        f"{self.plan}: max_batch_size is {max_batch_size} but the plan's profile takes at most "
                        f"{b.max[0]} rows of input '{name}'; {REBUILD} (or lower max_batch_size)"
                    )
        self._threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"trt-slot{i}", initializer=cuda.set_device, initargs=(device,))
            for i in range(slots)
        ]
        futures = [t.submit(self._make_slot, self._profiles[i]) for i, t in enumerate(self._threads)]
        self._slots: list[_Slot] = []
        failure: BaseException | None = None
        for f in futures:
            try:
                self._slots.append(f.result())
            except BaseException as exc:  # keep collecting, so every made slot is released
                failure = failure or exc
        if failure is not None:
            self._shutdown()
            if isinstance(failure, BackendError):
                raise failure
            raise BackendError(f"TensorRT cannot set up {self.plan}: {failure}") from failure

    # -- Backend protocol

    def prepare(self, segment: Tensors) -> Tensors:
        """Refuse a request whose non-batch dims are beyond the plan's profile, at admission
        (InvalidRequest: it fails alone, never the batch it would have joined)."""
        check_request(segment, self._bounds[0], batched=self.batched)
        return segment

    async def run(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on slot ``slot`` in that slot's thread. See :class:`~trtserve.runtimes.base.Backend`."""
        return await on_slot(self._threads[slot], self._run, slot, batch)

    async def aclose(self) -> None:
        """Wait for every slot's stream, free buffers, streams, events and contexts, then the engine."""
        await asyncio.to_thread(self._shutdown)

    # -- internals

    def _make_slot(self, profile: int) -> _Slot:
        """Create one slot's context, stream, event and buffers (on the slot's own thread)."""
        mark = _errors.mark()
        context = self._make_context(profile)
        if context is None:
            raise BackendError(f"TensorRT cannot create an execution context for {self.plan}{logged_errors(mark)}")
        stream, event = cuda.Stream(), cuda.Event()
        slot = _Slot(context, profile, stream, event)
        try:
            if not context.set_optimization_profile_async(profile, stream.native):
                raise BackendError(
                    f"TensorRT cannot select optimization profile {profile} of {self.plan}{logged_errors(mark)}"
                )
            stream.synchronize()
            bounds = self._bounds[profile]
            for spec in self.inputs:
                nbytes = _nbytes(bounds[spec.name].max, spec.datatype)
                slot.host_in[spec.name] = cuda.PinnedBuffer(nbytes)
                slot.dev_in[spec.name] = cuda.DeviceBuffer(nbytes)
                if not context.set_input_shape(spec.name, bounds[spec.name].max):
                    raise BackendError(
                        f"TensorRT refused the profile maximum shape of '{spec.name}'{logged_errors(mark)}"
                    )
            _infer(context, self.plan, mark)
            for spec in self.outputs:
                shape = tuple(context.get_tensor_shape(spec.name))
                if any(d < 0 for d in shape):
                    raise BackendError(
                        f"{self.plan}: output '{spec.name}' has a data-dependent shape {list(shape)}, "
                        "which this server does not support"
                    )
                nbytes = _nbytes(shape, spec.datatype)
                slot.host_out[spec.name] = cuda.PinnedBuffer(nbytes)
                slot.dev_out[spec.name] = cuda.DeviceBuffer(nbytes)
            # Buffers never move, so the addresses are set once for the slot's life.
            for name, buf in (*slot.dev_in.items(), *slot.dev_out.items()):
                if not context.set_tensor_address(name, buf.ptr):
                    raise BackendError(f"TensorRT refused the address of tensor '{name}'{logged_errors(mark)}")
        except BaseException:
            slot.release()
            raise
        return slot

    def _run(self, index: int, batch: Batch) -> Tensors:
        slot = self._slots[index]
        # Shapes first: nothing reaches the device for a batch the profile cannot take.
        packed_shapes = {spec.name: padded_shape(batch.parts, spec.name) for spec in self.inputs}
        shapes = packed_shapes if self.batched else {n: s[1:] for n, s in packed_shapes.items()}
        check_profile(shapes, self._bounds[slot.profile], batched=self.batched)
        packed = pack(batch, self.inputs, None, self.pad_value, out={n: b.array for n, b in slot.host_in.items()})
        context = slot.context
        mark = _errors.mark()
        try:
            for name, shape in shapes.items():
                if not context.set_input_shape(name, shape):
                    raise BackendError(f"TensorRT refused shape {list(shape)} for input '{name}'{logged_errors(mark)}")
            _infer(context, self.plan, mark)
            out_shapes = {spec.name: tuple(context.get_tensor_shape(spec.name)) for spec in self.outputs}
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(
                f"TensorRT failed to set up a batch of {batch.rows} rows: {exc}{logged_errors(mark)}"
            ) from exc
        out_bytes: dict[str, int] = {}
        for spec in self.outputs:
            shape = out_shapes[spec.name]
            nbytes = _nbytes(shape, spec.datatype) if all(d >= 0 for d in shape) else -1
            if nbytes < 0 or nbytes > slot.host_out[spec.name].nbytes:
                raise BackendError(
                    f"TensorRT output '{spec.name}' has shape {list(shape)}, which does not fit the buffer sized "
                    "for the profile maximum"
                )
            out_bytes[spec.name] = nbytes
        try:
            for name, arr in packed.items():
                cuda.copy_htod_async(slot.dev_in[name], slot.host_in[name], arr.nbytes, slot.stream)
            if not context.execute_async_v3(slot.stream.native):
                raise BackendError(
                    f"TensorRT execute_async_v3 failed on a batch of {batch.rows} rows{logged_errors(mark)}"
                )
            for name, nbytes in out_bytes.items():
                cuda.copy_dtoh_async(slot.host_out[name], slot.dev_out[name], nbytes, slot.stream)
            slot.event.record(slot.stream)
            slot.event.synchronize()
        except BaseException as exc:
            # Copies may still be in flight: wait for them before the buffers can be reused.
            try:
                slot.stream.synchronize()
            except BackendError as sync_exc:
                log.error("slot %d stream after a failed batch: %s", index, sync_exc)
            if isinstance(exc, BackendError):
                raise
            if isinstance(exc, Exception):
                raise BackendError(
                    f"TensorRT failed on a batch of {batch.rows} rows: {exc}{logged_errors(mark)}"
                ) from exc
            raise
        outputs: Tensors = {}
        for spec in self.outputs:
            view = view_into(slot.host_out[spec.name].array, out_shapes[spec.name], spec.datatype.numpy, spec.name)
            # A copy: the pinned buffer is the slot's, and its next batch overwrites it.
            arr = view.copy()
            outputs[spec.name] = arr if self.batched else arr[np.newaxis]
        return outputs

    def _shutdown(self) -> None:
        slots, self._slots = getattr(self, "_slots", []), []
        for i, slot in enumerate(slots):
            try:
                self._threads[i].submit(slot.release).result()
            except Exception as exc:  # a failed release must not keep the rest allocated
                log.warning("releasing slot %d of %s: %s", i, self.plan, exc)
        for thread in getattr(self, "_threads", []):
            thread.shutdown(wait=True)
        # Contexts (released above) before the engine, the engine before the runtime.
        self._engine = None
        self._runtime = None


def _create_context(engine: trt.ICudaEngine, profile: int) -> ExecutionContext | None:
    """TensorRT's execution context for a slot on ``profile`` (selected by the slot), its device
    memory allocated now; ``None`` where TensorRT cannot make one (its errors are logged)."""
    import tensorrt as trt

    return engine.create_execution_context(trt.ExecutionContextAllocationStrategy.STATIC)


def _deserialize(data: bytes, plan: Path, sidecar: Mapping[str, Any] | None) -> tuple[trt.Runtime, trt.ICudaEngine]:
    import tensorrt as trt

    mark = logger().errors.mark()
    trt.init_libnvinfer_plugins(logger(), "")  # engines may use TensorRT's bundled plugins
    try:
        runtime = trt.Runtime(logger())
    except TypeError as exc:  # pybind's "factory function returned nullptr": CUDA did not initialise
        raise GpuUnavailable(f"TensorRT cannot start its runtime on this machine{logged_errors(mark)}") from exc
    if sidecar is not None and (sidecar.get("build") or {}).get("version_compatible"):
        # A version-compatible plan embeds a lean runtime (host code): only plans this
        # project built and recorded in a sidecar get here.
        runtime.engine_host_code_allowed = True
    try:
        engine = runtime.deserialize_cuda_engine(data)
    except Exception as exc:
        raise BackendError(f"TensorRT cannot deserialize {plan}: {exc}{logged_errors(mark)}; {REBUILD}") from exc
    if engine is None:
        raise BackendError(f"TensorRT cannot deserialize {plan}{logged_errors(mark)}; {REBUILD}")
    return runtime, engine


def _introspect(
    engine: trt.ICudaEngine, plan: Path, batched: bool
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], list[dict[str, ProfileBounds]]]:
    """The engine's (inputs, outputs) as KServe tensors and, per profile, each input's bounds.

    Raises:
        BackendError: a tensor type with no KServe datatype, a shape tensor or host-resident
            tensor, or (batched) an input whose axis 0 is not dynamic.
    """
    import tensorrt as trt

    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        datatype = trt_datatype(engine.get_tensor_dtype(name).name, name, plan)
        if engine.get_tensor_location(name) != trt.TensorLocation.DEVICE:
            raise BackendError(f"{plan}: tensor '{name}' is a host (shape) tensor, which this server does not support")
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        if batched and (not shape or (engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT and shape[0] != -1)):
            raise BackendError(
                f"{plan}: tensor '{name}' has shape {list(shape)} with no dynamic batch axis, but max_batch_size > 0; "
                "export the ONNX model with a dynamic batch dim"
            )
        spec = TensorSpec(name, datatype, shape[1:] if batched else shape)
        (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(spec)
    bounds: list[dict[str, ProfileBounds]] = []
    for p in range(engine.num_optimization_profiles):
        per: dict[str, ProfileBounds] = {}
        for spec in inputs:
            static = tuple(int(d) for d in engine.get_tensor_shape(spec.name))
            if all(d >= 0 for d in static):
                per[spec.name] = ProfileBounds(spec.name, static, static)
                continue
            lo, _opt, hi = engine.get_tensor_profile_shape(spec.name, p)
            per[spec.name] = ProfileBounds(spec.name, tuple(int(d) for d in lo), tuple(int(d) for d in hi))
        bounds.append(per)
    return tuple(inputs), tuple(outputs), bounds


def _infer(context: ExecutionContext, plan: Path, mark: int) -> None:
    try:
        missing = context.infer_shapes()
    except RuntimeError as exc:
        raise BackendError(f"TensorRT cannot infer the shapes of {plan}: {exc}{logged_errors(mark)}") from exc
    if missing:
        raise BackendError(
            f"TensorRT cannot infer the shapes of {plan}: {sorted(missing)} are not specified{logged_errors(mark)}"
        )


def _nbytes(shape: Sequence[int], datatype: Datatype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * datatype.itemsize


__all__ = [
    "TensorRTBackend",
    "import_tensorrt",
    "unavailable_reason",
]
