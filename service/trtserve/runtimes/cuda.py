"""A thin layer over cuda-python's runtime API: device checks, memory, streams, events, copies.

Every call goes through ``cuda.bindings.runtime`` (cuda-python >= 12.9.1, whose calls release
the GIL, so a slot thread waiting on an event does not stall the others). Each call returns
an error tuple; :func:`_ok` turns any code other than ``cudaSuccess`` into a
:class:`CudaError` carrying the CUDA error name. The runtime API works on the device's
primary context, shared by every thread of the process; each thread that touches a device
calls :func:`set_device` first (TensorRT's objects and our buffers then live in that context).

Wrapper objects do not own their CUDA object implicitly: call ``free()`` / ``destroy()``
(there is no ``__del__``; the owner, e.g. the TensorRT slot, releases them in ``aclose``).

cuda-python is imported lazily, so importing this module never fails on a machine without
it; :func:`device_count` / :func:`preflight` (called before anything else is made) raise
:class:`GpuUnavailable` saying what is missing.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from trtserve.errors import BackendError

if TYPE_CHECKING:
    from cuda.bindings.runtime import cudaError_t, cudaEvent_t, cudaStream_t

INSTALL_HINT = "pip install 'trtserve[tensorrt]'"


class GpuUnavailable(BackendError):
    """This machine cannot run the GPU path: no cuda-python, no NVIDIA driver, no CUDA device,
    or no TensorRT. The message says which, short enough to sit inside one sentence."""


class CudaError(BackendError):
    """A CUDA runtime call failed.

    Attributes:
        call: the runtime function, e.g. ``"cudaMalloc"``.
        code: the ``cudaError_t`` value.
        name: its name, e.g. ``"cudaErrorMemoryAllocation"``.
    """

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call, self.code, self.name = call, code, name
        super().__init__(f"{call} failed: {name}" + (f" ({detail})" if detail else ""))


def runtime() -> ModuleType:
    """``cuda.bindings.runtime``, imported on first use.

    Raises:
        GpuUnavailable: cuda-bindings is not installed.
    """
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        raise GpuUnavailable(f"cuda-bindings (cuda-python) is not installed ({INSTALL_HINT})") from exc
    return cudart


def error_name(code: object) -> str:
    """The name of a ``cudaError_t`` (``"cudaErrorNoDevice"``), or its number if unknown."""
    from cuda.bindings import runtime as rt

    number = int(code)  # type: ignore[call-overload]
    try:
        err, name = rt.cudaGetErrorName(rt.cudaError_t(number))
    except ValueError:  # not a cudaError_t this binding knows
        return f"cudaError {number}"
    if err != rt.cudaError_t.cudaSuccess:
        return f"cudaError {number}"
    return name.decode() if isinstance(name, bytes) else str(name)


def _ok(call: str, err: cudaError_t) -> None:
    from cuda.bindings import runtime as rt

    if err != rt.cudaError_t.cudaSuccess:
        raise CudaError(call, int(err), error_name(err))


@dataclass(frozen=True)
class DeviceInfo:
    """What the plan sidecar records about a device and the CUDA stack it was used with.

    Attributes:
        index: the device ordinal.
        name: e.g. ``"NVIDIA H100 80GB HBM3"``.
        compute_capability: ``"major.minor"``, e.g. ``"9.0"``.
        total_memory: bytes of device memory.
        runtime_version, driver_version: CUDA versions as ``"major.minor"``.
    """

    index: int
    name: str
    compute_capability: str
    total_memory: int
    runtime_version: str
    driver_version: str


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


_NO_DEVICE_CLAUSES = {
    "cudaErrorNoDevice": "no CUDA device is visible (cudaErrorNoDevice)",
    "cudaErrorInsufficientDriver": (
        "no usable NVIDIA driver was found (cudaErrorInsufficientDriver: none, or older than this CUDA runtime)"
    ),
}


def device_count() -> int:
    """How many CUDA devices this process can use.

    Raises:
        GpuUnavailable: cuda-python is missing, the driver is missing or too old, or there is
            no device; the message is a clause naming the CUDA error, e.g. "no CUDA device
            is visible (cudaErrorNoDevice)".
    """
    runtime()  # GpuUnavailable when cuda-python is missing
    from cuda.bindings import runtime as rt

    err, count = rt.cudaGetDeviceCount()
    if err != rt.cudaError_t.cudaSuccess:
        name = error_name(err)
        raise GpuUnavailable(_NO_DEVICE_CLAUSES.get(name, f"the CUDA runtime cannot start ({name})"))
    if not count:
        raise GpuUnavailable(_NO_DEVICE_CLAUSES["cudaErrorNoDevice"])
    return int(count)


def preflight(device: int = 0) -> DeviceInfo:
    """Check that ``device`` exists and describe it (no context is needed beyond the primary one).

    Raises:
        GpuUnavailable: see :func:`device_count`, or ``device`` is out of range.
        CudaError: a query failed.
    """
    count = device_count()
    if not 0 <= device < count:
        raise GpuUnavailable(f"CUDA device {device} does not exist (this machine has {count})")
    from cuda.bindings import runtime as rt

    err, prop = rt.cudaGetDeviceProperties(device)
    _ok("cudaGetDeviceProperties", err)
    err, runtime_version = rt.cudaRuntimeGetVersion()
    _ok("cudaRuntimeGetVersion", err)
    err, driver_version = rt.cudaDriverGetVersion()
    _ok("cudaDriverGetVersion", err)
    raw = prop.name
    name = raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return DeviceInfo(
        index=device,
        name=name,
        compute_capability=f"{prop.major}.{prop.minor}",
        total_memory=int(prop.totalGlobalMem),
        runtime_version=_version(int(runtime_version)),
        driver_version=_version(int(driver_version)),
    )


def set_device(device: int) -> None:
    """Make ``device``'s primary context current for the calling thread (once per worker thread,
    before any other CUDA or TensorRT call on it)."""
    from cuda.bindings import runtime as rt

    (err,) = rt.cudaSetDevice(device)
    _ok("cudaSetDevice", err)


class PinnedBuffer:
    """Page-locked host memory (``cudaMallocHost``) seen as a 1-D ``uint8`` numpy array.

    ``array`` is a zero-copy view; its base keeps a reference to this object (the owner),
    so the wrapper lives as long as any view of it. The memory itself is released only by
    :meth:`free`, which the owner calls once no copy is in flight and no view is used.
    """

    def __init__(self, nbytes: int) -> None:
        from cuda.bindings import runtime as rt

        self.nbytes = max(int(nbytes), 1)
        err, ptr = rt.cudaMallocHost(self.nbytes)
        _ok("cudaMallocHost", err)
        self.ptr: int = int(ptr)
        raw = (ctypes.c_ubyte * self.nbytes).from_address(self.ptr)
        raw._owner = self  # type: ignore[attr-defined]  # the view keeps the wrapper alive
        self.array: np.ndarray = np.frombuffer(memoryview(raw), dtype=np.uint8)

    def free(self) -> None:
        """Release the memory (idempotent). No view may be used afterwards."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            from cuda.bindings import runtime as rt

            (err,) = rt.cudaFreeHost(ptr)
            _ok("cudaFreeHost", err)


class DeviceBuffer:
    """Device memory (``cudaMalloc``: 256-byte aligned, as TensorRT requires of tensor addresses)."""

    def __init__(self, nbytes: int) -> None:
        from cuda.bindings import runtime as rt

        self.nbytes = max(int(nbytes), 1)
        err, ptr = rt.cudaMalloc(self.nbytes)
        _ok("cudaMalloc", err)
        self.ptr: int = int(ptr)

    def free(self) -> None:
        """Release the memory (idempotent); only after every stream using it is synchronized."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            from cuda.bindings import runtime as rt

            (err,) = rt.cudaFree(ptr)
            _ok("cudaFree", err)


class Stream:
    """A non-blocking CUDA stream (no implicit synchronization with the legacy default stream)."""

    def __init__(self) -> None:
        from cuda.bindings import runtime as rt

        err, handle = rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        _ok("cudaStreamCreateWithFlags", err)
        self.handle: cudaStream_t = handle
        self._alive = True

    @property
    def native(self) -> int:
        """The ``cudaStream_t`` as an integer, what TensorRT's ``stream_handle`` arguments take."""
        from cuda.bindings.utils import get_cuda_native_handle

        return int(get_cuda_native_handle(self._live()))

    def synchronize(self) -> None:
        """Block the calling thread until all work queued on the stream is done (GIL released)."""
        from cuda.bindings import runtime as rt

        (err,) = rt.cudaStreamSynchronize(self._live())
        _ok("cudaStreamSynchronize", err)

    def destroy(self) -> None:
        """Destroy the stream (idempotent)."""
        if self._alive:
            from cuda.bindings import runtime as rt

            self._alive = False
            (err,) = rt.cudaStreamDestroy(self.handle)
            _ok("cudaStreamDestroy", err)

    def _live(self) -> cudaStream_t:
        if not self._alive:  # a destroyed handle must never reach CUDA (0 is the default stream)
            raise CudaError("cudaStream", 400, "cudaErrorInvalidResourceHandle", "the stream was destroyed")
        return self.handle


class Event:
    """A CUDA event; without ``timing`` it is the cheap kind used only to wait on."""

    def __init__(self, *, timing: bool = False) -> None:
        from cuda.bindings import runtime as rt

        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        err, handle = rt.cudaEventCreateWithFlags(flags)
        _ok("cudaEventCreateWithFlags", err)
        self.handle: cudaEvent_t = handle
        self._alive = True

    def record(self, stream: Stream) -> None:
        """Mark the point after all work queued on ``stream`` so far."""
        from cuda.bindings import runtime as rt

        (err,) = rt.cudaEventRecord(self._live(), stream._live())
        _ok("cudaEventRecord", err)

    def synchronize(self) -> None:
        """Block the calling thread until the recorded work is done (GIL released). Call it
        from a slot thread, never from the event loop."""
        from cuda.bindings import runtime as rt

        (err,) = rt.cudaEventSynchronize(self._live())
        _ok("cudaEventSynchronize", err)

    def query(self) -> bool:
        """Whether the recorded work is done (``cudaErrorNotReady`` is not a failure)."""
        from cuda.bindings import runtime as rt

        (err,) = rt.cudaEventQuery(self._live())
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        _ok("cudaEventQuery", err)
        return True

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (both created with ``timing=True``)."""
        from cuda.bindings import runtime as rt

        err, ms = rt.cudaEventElapsedTime(start._live(), self._live())
        _ok("cudaEventElapsedTime", err)
        return float(ms)

    def destroy(self) -> None:
        """Destroy the event (idempotent)."""
        if self._alive:
            from cuda.bindings import runtime as rt

            self._alive = False
            (err,) = rt.cudaEventDestroy(self.handle)
            _ok("cudaEventDestroy", err)

    def _live(self) -> cudaEvent_t:
        if not self._alive:
            raise CudaError("cudaEvent", 400, "cudaErrorInvalidResourceHandle", "the event was destroyed")
        return self.handle


def copy_htod_async(dst: DeviceBuffer, src: PinnedBuffer, nbytes: int, stream: Stream) -> None:
    """Queue a copy of the first ``nbytes`` of ``src`` to ``dst`` on ``stream``."""
    _check_size("host→device", nbytes, src.nbytes, dst.nbytes)
    from cuda.bindings import runtime as rt

    (err,) = rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream._live())
    _ok("cudaMemcpyAsync", err)


def copy_dtoh_async(dst: PinnedBuffer, src: DeviceBuffer, nbytes: int, stream: Stream) -> None:
    """Queue a copy of the first ``nbytes`` of ``src`` to ``dst`` on ``stream``."""
    _check_size("device→host", nbytes, src.nbytes, dst.nbytes)
    from cuda.bindings import runtime as rt

    (err,) = rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream._live())
    _ok("cudaMemcpyAsync", err)


def _check_size(what: str, nbytes: int, src: int, dst: int) -> None:
    if nbytes < 0 or nbytes > min(src, dst):
        raise CudaError("cudaMemcpyAsync", 1, "cudaErrorInvalidValue",
                        f"{what} copy of {nbytes} bytes between buffers of {src} and {dst}")


__all__ = [
    "CudaError",
    "DeviceBuffer",
    "DeviceInfo",
    "Event",
    "GpuUnavailable",
    "PinnedBuffer",
    "Stream",
    "copy_dtoh_async",
    "copy_htod_async",
    "device_count",
    "preflight",
    "runtime",
    "set_device",
]
