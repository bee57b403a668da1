"""ONNX Runtime on the CPU: the embedded default engine.

One ``InferenceSession`` per execution slot (``instance_group.count``), each run on its own
thread so the event loop never blocks, at a lower OS priority than the loop
(:mod:`~trtserve.runtimes.threads`). Inputs are packed into the slot's grow-only staging
buffers (:class:`~trtserve.runtimes.base.StagingBuffers`); outputs are the arrays ORT returns.
onnxruntime failures become :class:`~trtserve.errors.BackendError` here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtserve.datatypes import DATATYPES, Datatype, Tensors
from trtserve.errors import BackendError, InvalidRequest
from trtserve.runtimes.base import Batch, StagingBuffers, pack
from trtserve.runtimes.threads import on_slot, slot_thread
from trtserve.spec import TensorSpec

if TYPE_CHECKING:
    import onnxruntime

# ONNX Runtime's type strings → KServe datatypes.
ORT_TYPES: dict[str, Datatype] = {
    f"tensor({ort})": DATATYPES[kserve]
    for ort, kserve in (
        ("bool", "BOOL"),
        ("uint8", "UINT8"),
        ("uint16", "UINT16"),
        ("uint32", "UINT32"),
        ("uint64", "UINT64"),
        ("int8", "INT8"),
        ("int16", "INT16"),
        ("int32", "INT32"),
        ("int64", "INT64"),
        ("float16", "FP16"),
        ("bfloat16", "BF16"),
        ("float", "FP32"),
        ("double", "FP64"),
        ("string", "BYTES"),
    )
}


class OnnxRuntimeBackend:
    """An ONNX model on ONNX Runtime's CPU execution provider.

    Args:
        path: the ``.onnx`` file.
        slots: execution slots (sessions), each with its own thread.
        batched: whether axis 0 of every tensor is the batch (``max_batch_size > 0``).
        pad_value: fills variable-length dims up to the longest row of a batch.
        intra_op_threads: ORT threads per session for one operator (0: ORT's default,
            one per core).
        inter_op_threads: ORT threads across operators (0: ORT's default).
        cpu_mem_arena: keep ORT's CPU memory arena (ORT's default; config parameter
            ``ort_cpu_mem_arena``). The arena keeps what it grew to, so with many distinct
            input shapes (variable dims, and every total batch size the dispatcher forms) RSS
            rises to the largest mix of shapes seen; ``"false"`` allocates and frees per run.
        mem_pattern: let ORT plan and cache a memory pattern per input shape (ORT's default;
            config parameter ``ort_mem_pattern``); variable shapes gain nothing from it.
        spinning: let ORT's intra-op threads busy-wait for work between operators (config
            parameter ``ort_intra_op_spinning``; off by default, where ORT's own default is on).
            The threads share the cores with the event loops that read requests. Alone on 2
            cores, the measurements disagree: up to 17 % more rows/s with spinning on one day,
            the same or less on another. Beside one busy process, a spinning thread burns the
            core another thread needs: the demo served 74–78 sentences/s with spinning on and
            90–120 without (docs/benchmarks.md, "ONNX Runtime settings").
        nice: added to the nice value of each slot's thread and of the ORT threads its session
            starts (0..19; :func:`~trtserve.runtimes.threads.slot_thread`): the event loops run
            first when both want a core.

    Raises:
        BackendError: the file cannot be loaded, or has an input/output type with no
            KServe datatype.
        ValueError: ``nice`` outside 0..19.
    """

    def __init__(
        self,
        path: Path,
        *,
        slots: int = 1,
        batched: bool = True,
        pad_value: float = 0.0,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        cpu_mem_arena: bool = True,
        mem_pattern: bool = True,
        spinning: bool = False,
        nice: int = 0,
    ) -> None:
        import onnxruntime as ort

        options = session_options(
            intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads,
            cpu_mem_arena=cpu_mem_arena, mem_pattern=mem_pattern, spinning=spinning,
        )
        # Each session is created on its slot's thread, so ORT's intra-op threads inherit its priority.
        self._threads = [slot_thread(f"ort-slot{i}", nice) for i in range(slots)]
        try:
            self._sessions = [
                thread.submit(ort.InferenceSession, str(path), options, providers=["CPUExecutionProvider"]).result()
                for thread in self._threads
            ]
        except Exception as exc:
            for thread in self._threads:
                thread.shutdown(wait=False)
            raise BackendError(f"onnxruntime cannot load {path}: {exc}") from exc
        self.inputs, self.outputs = engine_tensors(self._sessions[0], batched, path)
        self.max_batch_rows = fixed_batch_rows(self._sessions[0]) if batched else None
        """The file's bound on a batch (:class:`~trtserve.runtimes.base.BatchBounded`)."""
        self._output_names = [t.name for t in self.outputs]
        self.slots = slots
        self.batched = batched
        self.pad_value = pad_value
        self._staging = [StagingBuffers() for _ in range(slots)]
        self._text_inputs = [t.name for t in self.inputs if t.datatype.name == "BYTES"]

    def prepare(self, segment: Tensors) -> Tensors:
        """ONNX string tensors hold UTF-8 text: BYTES elements are decoded to ``str`` here.

        Raises:
            InvalidRequest: an element is not valid UTF-8 (naming the input and element).
        """
        if not self._text_inputs:
            return segment
        segment = dict(segment)
        for name in self._text_inputs:
            arr = segment[name]
            text = np.empty(arr.shape, dtype=object)
            flat, out = arr.reshape(-1), text.reshape(-1)
            for i, value in enumerate(flat):
                try:
                    out[i] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                except UnicodeDecodeError as exc:
                    raise InvalidRequest(
                        f"input '{name}' element {i} is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                        "ONNX string tensors hold UTF-8 text"
                    ) from None
            segment[name] = text
        return segment

    async def run(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on session ``slot`` in that slot's thread. See :class:`~trtserve.runtimes.base.Backend`."""
        return await on_slot(self._threads[slot], self.run_inline, slot, batch)

    def run_inline(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on session ``slot`` on this thread (:class:`~trtserve.runtimes.base.RunsInline`).

        Raises:
            BackendError: onnxruntime failed (its message, and the batch's rows).
        """
        feed = pack(batch, self.inputs, self._staging[slot], self.pad_value)
        if not self.batched:
            feed = {name: arr[0] for name, arr in feed.items()}
        try:
            results = self._sessions[slot].run(self._output_names, feed)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed on a batch of {batch.rows} rows: {exc}") from exc
        outputs = dict(zip(self._output_names, results))
        if not self.batched:
            outputs = {name: arr[np.newaxis] for name, arr in outputs.items()}
        return outputs

    async def aclose(self) -> None:
        for thread in self._threads:
            thread.shutdown(wait=True)
        self._sessions.clear()


def session_options(
    *,
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    cpu_mem_arena: bool = True,
    mem_pattern: bool = True,
    spinning: bool = False,
) -> onnxruntime.SessionOptions:
    """ONNX Runtime session options as the server sets them (see :class:`OnnxRuntimeBackend`
    for each argument); the bench's raw reference uses the same, so the two stay in step.

    ``spinning`` sets the session config entries ``session.intra_op.allow_spinning`` and
    ``session.inter_op.allow_spinning`` (ONNX Runtime's documented keys, "1" in ORT itself)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.enable_cpu_mem_arena = cpu_mem_arena
    options.enable_mem_pattern = mem_pattern
    flag = "1" if spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", flag)
    options.add_session_config_entry("session.inter_op.allow_spinning", flag)
    return options


def engine_tensors(session: object, batched: bool, path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The (inputs, outputs) of an ``onnxruntime.InferenceSession`` as KServe tensors
    (dims without the batch axis when ``batched``; symbolic dims become -1).

    Raises:
        BackendError: a tensor type with no KServe datatype, or bfloat16 (see below).
    """
    inputs = tuple(_spec(a, batched, path) for a in session.get_inputs())  # type: ignore[attr-defined]
    outputs = tuple(_spec(a, batched, path) for a in session.get_outputs())  # type: ignore[attr-defined]
    return inputs, outputs


def fixed_batch_rows(session: object) -> int | None:
    """The smallest fixed size of axis 0 among the session's inputs and outputs (a file exported
    with a fixed batch, often 1); ``None`` where every tensor leaves axis 0 free (symbolic or
    unknown)."""
    args = [*session.get_inputs(), *session.get_outputs()]  # type: ignore[attr-defined]
    fixed = [a.shape[0] for a in args if a.shape and isinstance(a.shape[0], int) and a.shape[0] > 0]
    return min(fixed, default=None)


def _spec(arg: object, batched: bool, path: Path) -> TensorSpec:
    name = arg.name  # type: ignore[attr-defined]
    datatype = ORT_TYPES.get(arg.type)  # type: ignore[attr-defined]
    if datatype is None:
        raise BackendError(f"{path}: tensor '{name}' has type {arg.type}, which has no KServe datatype")  # type: ignore[attr-defined]
    if datatype.name == "BF16":
        # ORT's Python API can take a bfloat16 input (OrtValue) but cannot hand one back as
        # numpy; refuse at load rather than convert silently.
        raise BackendError(
            f"{path}: tensor '{name}' is bfloat16, which the ONNX Runtime engine cannot exchange with numpy; "
            "cast it to FP32 in the graph or serve the model with TensorRT"
        )
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)  # type: ignore[attr-defined]
    return TensorSpec(name, datatype, dims[1:] if batched else dims)
