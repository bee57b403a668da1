"""What an engine runtime is, and the batch it runs.

A runtime (ONNX Runtime, TensorRT, a Python model) implements :class:`Backend`. The dispatcher
hands it a :class:`Batch`: the input pieces of several requests, each with rows on axis 0. The
runtime packs them into its slot's staging buffers with :func:`pack` (padding variable-length
dims to the longest piece), runs them, and returns the outputs with the batch's rows on axis 0.
The dispatcher then cuts each piece's rows back out with :func:`unpack`. A runtime never sees
futures, queues or gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from trtserve.datatypes import Tensors
from trtserve.spec import TensorSpec


@dataclass
class Batch:
    """Work for one engine run.

    Attributes:
        parts: per piece, engine-input name → array with that piece's rows on axis 0.
            Pieces may differ in their non-batch dims where the engine's dims are -1.
        rows: total rows (sum of the pieces' rows), at most ``max_batch_size``.
        ran: the monotonic seconds (start, end) of its run on the slot's thread, appended by
            :func:`~trtserve.runtimes.threads.on_slot` (empty for a run not timed there): the
            dispatcher tells the engine's time from the hand-off's with it.

    A batch handed to a slot that is still running another (staged) can change until its run
    begins: the dispatcher :meth:`extend` s it with rows that arrive meanwhile and
    :meth:`withdraw` s the rows of requests that were cancelled or passed their deadline while
    it waited; the slot's thread calls :meth:`begin` first, and a runtime reads ``parts`` and
    ``rows`` only after it.
    """

    parts: tuple[Tensors, ...]
    rows: int
    ran: list[float] = field(default_factory=list, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    _begun: bool = field(default=False, compare=False, repr=False)

    def begin(self) -> None:
        """Mark the run begun (on the slot's thread, before it reads ``parts``): nothing is
        withdrawn or added after this, even when it raises (the loop learns of the skipped run a
        hop later, and rows joining it meanwhile would never run).

        Raises:
            BatchWithdrawn: every piece was withdrawn first; the run must be skipped.
        """
        with self._lock:
            self._begun = True
            if not self.parts:
                raise BatchWithdrawn("every request of the batch was withdrawn before its run")

    @property
    def begun(self) -> bool:
        """Whether the slot's thread has begun the run (read without the lock: a hint; an
        :meth:`extend` or :meth:`withdraw` tells for sure)."""
        return self._begun

    def extend(self, take: Callable[[], tuple[Sequence[Tensors], int]]) -> bool:
        """Append the pieces ``take()`` returns (with their rows in all), if the run has not
        begun; ``take`` is called under the batch's lock, only then, so rows taken from the queue
        always run. Returns whether the run had not begun (else ``take`` was not called)."""
        with self._lock:
            if self._begun:
                return False
            parts, rows = take()
            self.parts, self.rows = self.parts + tuple(parts), self.rows + rows
            return True

    def withdraw(self, keep: Sequence[int], rows: int) -> bool:
        """Keep only the pieces at the indices ``keep`` (``rows`` rows in all; none: the run is
        skipped), if the run has not begun. Returns whether it had not (else nothing changed)."""
        with self._lock:
            if self._begun:
                return False
            self.parts, self.rows = tuple(self.parts[i] for i in keep), rows
            return True


class BatchWithdrawn(Exception):
    """A batch's run was skipped: the dispatcher withdrew every piece before it began."""


class Backend(Protocol):
    """An engine with ``slots`` execution slots that each run one batch at a time.

    Attributes:
        inputs, outputs: the engine's own tensors (dims without the batch axis when
            ``batched``); read from the model file.
        slots: how many batches may run at once.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    slots: int

    def prepare(self, segment: Tensors) -> Tensors:
        """Convert one request's engine rows to what this engine takes, at admission (on the
        event loop, before queueing, so a bad element fails that request alone).

        Raises:
            InvalidRequest: a value this engine cannot take (e.g. non-UTF-8 text for an
                ONNX string tensor).
        """

    async def run(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on slot ``slot`` (never on a slot that is already running).

        Returns every engine output with ``batch.rows`` rows on axis 0 (for a batched model).
        Must not block the event loop: the computation runs on the slot's own thread.

        Raises:
            BackendError: the engine failed; every request of the batch gets this error.
        """

    async def aclose(self) -> None:
        """Release sessions, threads and buffers. Called once, after the last ``run``."""


@runtime_checkable
class Abortable(Protocol):
    """A :class:`Backend` that can stop a run that hangs (optional; e.g. a Python model whose
    slot runs in a worker process of its own). The dispatcher calls :meth:`abort` once when a
    slot's batch has run past the hang limit; a runtime without it leaves the slot marked
    unhealthy until its run returns."""

    def abort(self, slot: int, reason: str) -> bool:
        """Stop the batch running on ``slot``, from the event loop thread (must not block).

        The slot's pending ``run`` then raises :class:`~trtserve.errors.BackendError` with
        ``reason`` in its message, after making the slot able to run again (e.g. a new worker
        process); the dispatcher frees the slot once ``run`` has returned.

        Returns:
            Whether the run is being stopped; False where this slot cannot be (then the slot
            stays marked unhealthy until its run returns by itself).
        """


@runtime_checkable
class RunsInline(Protocol):
    """A :class:`Backend` that can run a batch on the calling thread (optional). The dispatcher
    runs a batch so, on the event loop, when the latency model predicts it shorter than the
    hand-off to the slot's thread costs (:data:`~trtserve.batching.dispatcher.INLINE_RUN_S`);
    only engines whose run time the latency model predicts (not arbitrary Python models)."""

    def run_inline(self, slot: int, batch: Batch) -> Tensors:
        """What :meth:`Backend.run` computes, on this thread, blocking it for the run.

        Raises:
            BackendError: the engine failed.
        """


@runtime_checkable
class BatchBounded(Protocol):
    """A :class:`Backend` whose model file bounds the rows of one batch (optional): a fixed
    batch axis in an ONNX file, a TensorRT plan's optimization profile. A backend without it
    sets no bound of its own."""

    max_batch_rows: int | None
    """The most rows one batch may hold; ``None`` where the file leaves the batch axis free."""


def batch_limit(backend: object) -> int | None:
    """The rows the model file of ``backend`` allows in one batch (:class:`BatchBounded`);
    ``None`` for no bound."""
    return backend.max_batch_rows if isinstance(backend, BatchBounded) else None


class StagingBuffers:
    """Grow-only host buffers of one execution slot, one per engine input.

    A batch's input is written once into a contiguous view at the front of its buffer; the
    buffer grows (doubling) only when a batch needs more bytes than it holds.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def view(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` over the buffer of ``name``."""
        count = int(np.prod(shape, dtype=np.int64))
        if dtype == np.dtype(object):
            return np.empty(shape, dtype=object)
        nbytes = count * dtype.itemsize
        buf = self._bufs.get(name)
        if buf is None or buf.nbytes < nbytes:
            size = max(nbytes, 2 * (buf.nbytes if buf is not None else 0), 64)
            buf = self._bufs[name] = np.empty(size, dtype=np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)


def padded_shape(parts: Sequence[Tensors], name: str) -> tuple[int, ...]:
    """The batch shape of input ``name``: total rows, then the largest size of each other dim."""
    first = parts[0][name].shape
    if len(parts) == 1:
        return tuple(first)
    rows = sum(p[name].shape[0] for p in parts)
    inner = tuple(max(p[name].shape[k] for p in parts) for k in range(1, len(first)))
    return (rows, *inner)


def pack(
    batch: Batch,
    specs: Sequence[TensorSpec],
    staging: StagingBuffers | None,
    pad_value: float,
    *,
    out: Mapping[str, np.ndarray] | None = None,
) -> Tensors:
    """Stack the pieces of ``batch`` into one array per engine input (rows on axis 0).

    Without ``out``: a single unpadded piece is passed through as it is (no copy); otherwise
    each input is written once into ``staging``.

    With ``out`` (input name → a writable, C-contiguous 1-D ``uint8`` buffer the caller owns,
    e.g. a slot's page-locked staging buffer): every input, a single piece included, is
    written once into a C-contiguous view at the front of its buffer, and that view is
    returned. ``staging`` is not used then.

    Where pieces differ in a variable dim, the shorter ones are padded with ``pad_value``
    (``b""`` for BYTES).

    Raises:
        ValueError: an ``out`` buffer too small for its input, or not a 1-D uint8 buffer,
            or an object (BYTES) input with ``out``. Callers check sizes first (TensorRT:
            :func:`~trtserve.runtimes.tensorrt_plan.check_profile`), so this is a bug guard.
    """
    parts = batch.parts
    packed: Tensors = {}
    for spec in specs:
        name = spec.name
        if out is None and len(parts) == 1:
            packed[name] = np.ascontiguousarray(parts[0][name])
            continue
        shape = padded_shape(parts, name)
        dtype = spec.datatype.numpy
        if out is not None:
            dst = view_into(out[name], shape, dtype, name)
        else:
            assert staging is not None, "pack() needs staging buffers or out="
            dst = staging.view(name, shape, dtype)
        fill(dst, [p[name] for p in parts], pad_value)
        packed[name] = dst
    return packed


def view_into(buf: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, name: str = "") -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` over the front of byte buffer ``buf``.

    Raises:
        ValueError: ``buf`` is not a contiguous 1-D uint8 buffer, holds too few bytes, or
            ``dtype`` is ``object`` (BYTES cannot live in a raw buffer).
    """
    dtype = np.dtype(dtype)
    if dtype == np.dtype(object):
        raise ValueError(f"input '{name}': BYTES tensors cannot be packed into a raw buffer")
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"input '{name}': the destination must be a contiguous 1-D uint8 buffer")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes > buf.nbytes:
        raise ValueError(
            f"input '{name}': a batch of shape {list(shape)} needs {nbytes} bytes, the buffer holds {buf.nbytes}"
        )
    return buf[:nbytes].view(dtype).reshape(shape)


def fill(dst: np.ndarray, pieces: Sequence[np.ndarray], pad_value: float) -> None:
    """Write ``pieces`` one after another along axis 0 of ``dst``, each at the start of the
    other axes; where a piece is shorter than ``dst`` on an axis, the rest is ``pad_value``."""
    ragged = any(arr.shape[1:] != dst.shape[1:] for arr in pieces)
    if ragged:
        dst.fill(b"" if dst.dtype == np.dtype(object) else pad_value)
    offset = 0
    for arr in pieces:
        n = arr.shape[0]
        if ragged:
            dst[(slice(offset, offset + n), *(slice(0, d) for d in arr.shape[1:]))] = arr
        else:
            dst[offset : offset + n] = arr
        offset += n


def unpack(batch: Batch, outputs: Tensors, specs: Sequence[TensorSpec]) -> list[Tensors]:
    """Cut the outputs of ``batch`` back into one dict per piece (views, no copy).

    Rows are sliced per piece. A variable (-1) output dim that has the padded length of the
    same axis of an input is cut back to that piece's own length on that axis, so that
    padding never shows in an answer (the first such input, in engine order, decides).
    """
    parts = batch.parts
    if len(parts) == 1:
        return [outputs]
    input_names = list(parts[0])
    padded = {name: padded_shape(parts, name) for name in input_names}
    cuts: dict[str, list[tuple[int, str]]] = {}
    for spec in specs:
        axes = []
        for axis, dim in enumerate(spec.dims, start=1):
            if dim != -1:
                continue
            size = outputs[spec.name].shape[axis]
            source = next(
                (n for n in input_names if len(padded[n]) > axis and padded[n][axis] == size),
                None,
            )
            if source is not None and any(p[source].shape[axis] != size for p in parts):
                axes.append((axis, source))
        cuts[spec.name] = axes
    result: list[Tensors] = []
    offset = 0
    for p in parts:
        n = next(iter(p.values())).shape[0]
        piece: Tensors = {}
        for name, arr in outputs.items():
            index: list[slice] = [slice(offset, offset + n)]
            for axis, source in cuts.get(name, ()):
                index += [slice(None)] * (axis - len(index)) + [slice(0, p[source].shape[axis])]
            piece[name] = arr[tuple(index)]
        result.append(piece)
        offset += n
    return result
