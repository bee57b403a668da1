"""The GPU half of the pytorch platform (:mod:`trtserve.runtimes.torch`), used only where
``torch.cuda.is_available()``. Run on an H200 (tests/gpu/test_torch_gpu.py): docs/guide/gpu.md says what was measured.

Per execution slot: its own CUDA stream; grow-only page-locked staging buffers, one per input,
that a batch is packed into once (:func:`~trtserve.runtimes.base.pack` with ``out=``) and copied
from to the device asynchronously on the slot's stream; and CUDA graphs per batch bucket. A batch
of up to :data:`GRAPH_MAX_ROWS` rows is padded (with the model's ``pad_value``) up to the next power
of two; the second time a (bucket, other dims) shape comes, a graph of the program over static
device inputs of that shape is captured in the slot's own memory pool, and from then on that
shape replays it (one launch instead of one per kernel: what helps at small batches, where the
launches cost more than the compute). At most :data:`MAX_GRAPHS` per slot; a capture that fails
turns graphs off for that slot, with one log line, and the program runs eagerly. Outputs come
back to host memory on the slot's stream before ``run`` returns.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trtserve.runtimes.base import Batch, pack, padded_shape
from trtserve.spec import TensorSpec

log = logging.getLogger(__name__)

GRAPH_MAX_ROWS = 64
"""The largest batch replayed as a CUDA graph (larger ones are compute-bound: launches are noise)."""
MAX_GRAPHS = 64
"""CUDA graphs kept per slot (each holds its static inputs, outputs and activations)."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    result: Any


@dataclass
class _Slot:
    stream: torch.cuda.Stream
    pool: Any
    pinned: dict[str, torch.Tensor] = field(default_factory=dict)
    graphs: dict[tuple, _Graph] = field(default_factory=dict)
    seen: Counter = field(default_factory=Counter)
    graphs_on: bool = True


class CudaSlots:
    """The slots of one program on the current CUDA device.

    Args:
        module: the loaded program, already on the device.
        inputs: the engine's inputs, in the order of ``arg_order``'s names.
        arg_order: input names in the order the program takes them.
        slots: execution slots (one stream each).
        batched: axis 0 of every tensor is the batch (graphs are only for batched programs).
        pad_value: what padding rows and variable dims hold.
        graphs: capture and replay CUDA graphs (the ``torch_cuda_graphs`` parameter).
    """

    def __init__(self, module: Any, inputs: Sequence[TensorSpec], arg_order: Sequence[str], slots: int, *,
                 batched: bool, pad_value: float, graphs: bool) -> None:
        self.module = module
        self.batched = batched
        graphs = graphs and batched
        self.inputs = tuple(inputs)
        self.arg_order = list(arg_order)
        self.pad_value = pad_value
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._slots = [_Slot(torch.cuda.Stream(self.device), torch.cuda.graph_pool_handle(), graphs_on=graphs)
                       for _ in range(slots)]

    def run(self, slot: int, batch: Batch) -> Any:
        """Run ``batch`` on slot ``slot`` (the calling thread waits for its stream). Returns the
        program's result with each tensor cut to ``batch.rows`` rows and in host memory."""
        s = self._slots[slot]
        staged = pack(batch, self.inputs, None, self.pad_value,
                      out={t.name: self._pinned(s, t, batch) for t in self.inputs})
        with torch.cuda.stream(s.stream):
            dev = {name: torch.from_numpy(arr if self.batched else arr[0]).to(self.device, non_blocking=True)
                   for name, arr in staged.items()}
            graph = self._graph(s, dev, batch.rows)
            if graph is None:
                result = self.module(*(dev[n] for n in self.arg_order))
            else:
                for name, static in graph.inputs.items():
                    static[: batch.rows].copy_(dev[name])
                    static[batch.rows:].fill_(self.pad_value)
                graph.graph.replay()
                result = graph.result
            # A blocking copy on this stream: when it returns, the pinned inputs are free again.
            return _to_host(result, batch.rows if self.batched else None)

    def _pinned(self, s: _Slot, spec: TensorSpec, batch: Batch) -> Any:
        shape = padded_shape(batch.parts, spec.name)
        nbytes = spec.datatype.numpy.itemsize * int(torch.Size(shape).numel())
        buf = s.pinned.get(spec.name)
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (buf.numel() if buf is not None else 0), 4096)
            buf = s.pinned[spec.name] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return buf.numpy()

    def _graph(self, s: _Slot, dev: dict[str, torch.Tensor], rows: int) -> _Graph | None:
        """The graph for this batch's bucket, captured on the shape's second sighting; ``None``: run eagerly."""
        if not s.graphs_on or rows > GRAPH_MAX_ROWS:
            return None
        bucket = 1 << (rows - 1).bit_length()
        key = (bucket, *(tuple(dev[n].shape[1:]) for n in self.arg_order))
        if key in s.graphs:
            return s.graphs[key]
        s.seen[key] += 1
        if s.seen[key] < 2 or len(s.graphs) >= MAX_GRAPHS:
            return None
        static = {n: torch.full((bucket, *t.shape[1:]), self.pad_value, dtype=t.dtype, device=self.device)
                  for n, t in dev.items()}
        args = [static[n] for n in self.arg_order]
        try:
            self.module(*args)  # warm-up on this stream: lazy initialisation happens outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=s.pool, stream=s.stream, capture_error_mode="thread_local"):
                result = self.module(*args)
        except Exception as exc:  # noqa: BLE001 (a program that cannot be captured still runs eagerly)
            s.graphs_on = False
            log.warning("CUDA graphs off for this slot: capturing the program at %s failed: %s", key, exc)
            return None
        s.graphs[key] = _Graph(graph, static, result)
        return s.graphs[key]

    def close(self) -> None:
        """Drop the graphs and staging buffers (after the slots' threads have stopped)."""
        for s in self._slots:
            s.graphs.clear()
            s.pinned.clear()


def _to_host(result: Any, rows: int | None) -> Any:
    """``result``'s tensors in host memory, cut to ``rows`` rows (``None``: whole)."""
    if isinstance(result, dict):
        return {k: _to_host(v, rows) for k, v in result.items()}
    if isinstance(result, (tuple, list)):
        return type(result)(_to_host(v, rows) for v in result)
    return (result if rows is None else result[:rows]).to("cpu")


__all__ = ["GRAPH_MAX_ROWS", "MAX_GRAPHS", "CudaSlots"]
