"""What an engine runtime is, and the batch it runs.

A runtime (ONNX Runtime, TensorRT, a Python model) implements :class:`Backend`. The dispatcher
hands it a :class:`Batch`: the input pieces of several requests, each with rows on axis 0. The
runtime packs them into its slot's staging buffers with :func:`pack` (padding variable-length
dims to the longest piece), runs them, and returns the outputs with the batch's rows on axis 0.
The dispatcher then cuts each piece's rows back out with :func:`unpack`. A runtime never sees
futures, queues or gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..spec import TensorSpec

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Batch:
    """Work for one engine run.

    Attributes:
        parts: per piece, engine-input name → array with that piece's rows on axis 0.
            Pieces may differ in their non-batch dims where the engine's dims are -1.
        rows: total rows (sum of the pieces' rows), at most ``max_batch_size``.
    """

    parts: tuple[Tensors, ...]
    rows: int


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


def pack(batch: Batch, specs: Sequence[TensorSpec], staging: StagingBuffers, pad_value: float) -> Tensors:
    """Stack the pieces of ``batch`` into one array per engine input (rows on axis 0).

    A single unpadded piece is passed through as it is (no copy). Otherwise each input is
    written once into ``staging``; where pieces differ in a variable dim, the shorter ones
    are padded with ``pad_value`` (``b""`` for BYTES).
    """
    parts = batch.parts
    packed: Tensors = {}
    for spec in specs:
        name = spec.name
        if len(parts) == 1:
            arr = parts[0][name]
            packed[name] = np.ascontiguousarray(arr)
            continue
        shape = padded_shape(parts, name)
        out = staging.view(name, shape, spec.datatype.numpy)
        ragged = any(p[name].shape[1:] != shape[1:] for p in parts)
        if ragged:
            out.fill(b"" if out.dtype == np.dtype(object) else pad_value)
        offset = 0
        for p in parts:
            arr = p[name]
            n = arr.shape[0]
            if ragged:
                out[(slice(offset, offset + n), *(slice(0, d) for d in arr.shape[1:]))] = arr
            else:
                out[offset : offset + n] = arr
            offset += n
        packed[name] = out
    return packed


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
