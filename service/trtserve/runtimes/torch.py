"""PyTorch programs: a TorchScript module (``model.pt``) or a ``torch.export`` program (``model.pt2``).

What Triton's pytorch backend serves (config ``platform: "pytorch_libtorch"`` or ``backend:
"pytorch"``). One copy of the program's weights is shared by every execution slot; each slot runs
on its own thread (:func:`~trtserve.runtimes.threads.slot_thread`, like ONNX Runtime's), under
``torch.inference_mode``. Where ``torch.cuda.is_available()``, the program moves to the GPU and
each slot gets its own CUDA stream, page-locked input staging and CUDA graphs per batch bucket
(:mod:`trtserve.runtimes.torch_cuda`; run on an H200, docs/guide/gpu.md says what was measured).

The engine's tensors (what :attr:`TorchBackend.inputs` and ``outputs`` report):

* ``model.pt2`` carries them: the inputs are the program's user inputs (their names, dtypes, and
  -1 for each dimension exported as dynamic), the outputs the keys of the dict it returns
  (``OUTPUT__0``, ``OUTPUT__1``, ... for a tensor or tuple). Its batch axis's upper bound, when the
  export gave one, bounds a batch (:class:`~trtserve.runtimes.base.BatchBounded`).
* ``model.pt`` does not (TorchScript keeps argument names but no dtypes or shapes), so, as in
  Triton, the config's tensors are the engine's: each config input is a ``forward`` argument of
  the same name, or ``<anything>__<i>`` for the i-th argument; each output is a key of the dict
  ``forward`` returns, or ``<anything>__<i>`` for the i-th tensor of the tuple it returns (a single
  tensor is ``__0``). A model whose config describes its handler's tensors instead (text in,
  embeddings out) needs a ``model.pt2``.

torch failures become :class:`~trtserve.errors.BackendError` here and nowhere else.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtserve.datatypes import BY_NUMPY, Datatype, Tensors
from trtserve.errors import BackendError, Unsupported
from trtserve.runtimes.base import Batch, StagingBuffers, pack
from trtserve.runtimes.threads import on_slot, slot_thread
from trtserve.spec import TensorSpec

log = logging.getLogger(__name__)

PROGRAM_FILES = ("model.pt2", "model.pt")
"""The files a version directory of this platform holds, exactly one of them."""
_POSITIONAL = re.compile(r"^.*__(\d+)$")

# A request's rows arrive as read-only numpy views over its bytes; the program only reads its
# inputs, so torch's "not writable" warning on torch.from_numpy says nothing here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


class TorchBackend:
    """A PyTorch program on the CPU, or on the GPU where CUDA is available.

    Args:
        version_dir: the version directory, holding ``model.pt`` or ``model.pt2``.
        config_inputs, config_outputs: the config's tensors (the engine's own for ``model.pt``).
        slots: execution slots, each with its own thread (and CUDA stream on a GPU).
        batched: whether axis 0 of every tensor is the batch (``max_batch_size > 0``).
        pad_value: fills variable-length dims up to the longest row of a batch.
        nice: added to the nice value of each slot's thread and of the threads it starts (0..19).
        cuda_graphs: on a GPU, replay CUDA graphs per batch bucket (config parameter
            ``torch_cuda_graphs``, default ``"true"``); no effect on the CPU.

    Raises:
        BackendError: no program file or both, a file torch cannot load, a tensor type with no
            KServe datatype, or (``model.pt``) config tensors that are not the program's.
        Unsupported: torch is not installed.
    """

    def __init__(
        self,
        version_dir: Path,
        *,
        config_inputs: Sequence[TensorSpec],
        config_outputs: Sequence[TensorSpec],
        slots: int = 1,
        batched: bool = True,
        pad_value: float = 0.0,
        nice: int = 0,
        cuda_graphs: bool = True,
    ) -> None:
        torch = import_torch()
        path = program_file(version_dir)
        self.slots = slots
        self.batched = batched
        self.pad_value = pad_value
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        """Where the program runs: ``"cpu"`` or ``"cuda"`` (the current CUDA device)."""
        self.max_batch_rows: int | None = None
        """The program's bound on a batch (:class:`~trtserve.runtimes.base.BatchBounded`)."""
        try:
            if path.suffix == ".pt2":
                program = torch.export.load(str(path))
                self.inputs, self.outputs, self._output_keys, self.max_batch_rows = exported_tensors(
                    program, batched, path)
                self._arg_order = [t.name for t in self.inputs]
                if self.device == "cuda":  # also rewrites the device the program's factory calls name
                    # The submodule is imported by name: torch 2.11 does not import it with torch.export.
                    from torch.export.passes import move_to_device_pass

                    program = move_to_device_pass(program, self.device)
                module = program.module()
            else:
                module = torch.jit.load(str(path), map_location=self.device).eval()
                args = [a.name for a in module.forward.schema.arguments[1:]]
                self.inputs, self._arg_order = scripted_inputs(config_inputs, args, path)
                self.outputs = tuple(config_outputs)
                self._output_keys = [_key(t.name) for t in self.outputs]
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"torch cannot load {path}: {exc}") from exc
        self._module = module
        self._torch = torch
        self._threads = [slot_thread(f"torch-slot{i}", nice) for i in range(slots)]
        self._staging = [StagingBuffers() for _ in range(slots)]
        self._cuda = None
        if self.device == "cuda":
            from trtserve.runtimes.torch_cuda import CudaSlots

            self._cuda = CudaSlots(module, self.inputs, self._arg_order, slots, batched=batched,
                                   pad_value=pad_value, graphs=cuda_graphs)

    def prepare(self, segment: Tensors) -> Tensors:
        """Numeric tensors pass as they are (the codec has checked their dtype)."""
        return segment

    async def run(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on slot ``slot`` in that slot's thread. See :class:`~trtserve.runtimes.base.Backend`."""
        return await on_slot(self._threads[slot], self.run_inline, slot, batch)

    def run_inline(self, slot: int, batch: Batch) -> Tensors:
        """Run ``batch`` on slot ``slot`` on this thread (:class:`~trtserve.runtimes.base.RunsInline`).

        Returns every output as a numpy array with ``batch.rows`` rows on axis 0 (a fresh array,
        not one the next batch overwrites).

        Raises:
            BackendError: the program failed (torch's message, and the batch's rows), or returned
                something other than its outputs.
        """
        torch = self._torch
        feed: Tensors = {}
        try:
            with torch.inference_mode():
                if self._cuda is not None:
                    result = self._cuda.run(slot, batch)
                else:
                    feed = pack(batch, self.inputs, self._staging[slot], self.pad_value)
                    args = [torch.from_numpy(self._unbatch(feed[name])) for name in self._arg_order]
                    result = self._module(*args)
                outputs = {name: t.detach().cpu().numpy() for name, t in self._named(result).items()}
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"torch failed on a batch of {batch.rows} rows: {exc}") from exc
        # On the CPU an output the program returns as (a view of) an input is the slot's staging
        # buffer, which its next batch overwrites (a staged one, before these answers are
        # delivered): such an output is copied.
        return {
            name: self._rebatch(arr.copy() if any(np.may_share_memory(arr, x) for x in feed.values()) else arr)
            for name, arr in outputs.items()
        }

    def _unbatch(self, arr: np.ndarray) -> np.ndarray:
        return arr if self.batched else arr[0]

    def _rebatch(self, arr: np.ndarray) -> np.ndarray:
        return arr if self.batched else arr[np.newaxis]

    def _named(self, result: Any) -> dict[str, Any]:
        """The program's result (a dict, a tuple or list, or one tensor) by output name.

        Raises:
            BackendError: an output the result lacks (naming what it holds).
        """
        if isinstance(result, dict):
            held: dict[Any, Any] = result
        elif isinstance(result, (tuple, list)):
            held = dict(enumerate(result))
        else:
            held = {0: result}
        missing = [t.name for t, key in zip(self.outputs, self._output_keys) if key not in held]
        if missing:
            raise BackendError(
                f"the program's result has no output {missing} (it returned {sorted(map(str, held))}); "
                "name outputs by the keys of the dict it returns or as <name>__<index>"
            )
        return {t.name: held[key] for t, key in zip(self.outputs, self._output_keys)}

    async def aclose(self) -> None:
        for thread in self._threads:
            thread.shutdown(wait=True)
        if self._cuda is not None:
            self._cuda.close()


def import_torch() -> Any:
    """``torch``, or one sentence saying it is missing.

    Raises:
        Unsupported: torch is not installed in this environment.
    """
    try:
        import torch
    except ImportError as exc:
        raise Unsupported(
            f"the pytorch platform needs torch, which this environment lacks ({exc}); "
            "pip install torch (CPU build: --index-url https://download.pytorch.org/whl/cpu)"
        ) from exc
    return torch


def program_file(version_dir: Path) -> Path:
    """The version's program: ``model.pt2`` or ``model.pt``.

    Raises:
        BackendError: neither or both are there (one sentence saying which).
    """
    present = [version_dir / name for name in PROGRAM_FILES if (version_dir / name).is_file()]
    if not present:
        raise BackendError(f"{version_dir} holds no PyTorch program (model.pt: TorchScript, model.pt2: torch.export)")
    if len(present) > 1:
        raise BackendError(f"{version_dir} holds both model.pt and model.pt2; keep the one to serve")
    return present[0]


def kserve_type(dtype: Any, name: str, path: Path) -> Datatype:
    """The KServe datatype of a torch dtype.

    Raises:
        BackendError: a dtype numpy cannot hold (bfloat16, complex, quantized), naming the tensor.
    """
    import torch

    try:
        numpy_dtype = np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
    except (TypeError, RuntimeError):
        numpy_dtype = None
    datatype = BY_NUMPY.get(numpy_dtype) if numpy_dtype is not None else None
    if datatype is None:
        raise BackendError(
            f"{path}: tensor '{name}' is {dtype}, which has no numpy form to exchange; "
            "cast it inside the program (e.g. to float32)"
        )
    return datatype


def exported_tensors(
    program: Any, batched: bool, path: Path
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], list[Any], int | None]:
    """(inputs, outputs, the output keys in the program's result, batch bound) of a
    ``torch.export.ExportedProgram``. Dims are -1 where the export made them dynamic; without
    the batch axis when ``batched``.

    Raises:
        BackendError: a dtype with no KServe datatype, or a batch axis of rank 0.
    """
    nodes = {n.name: n for n in program.graph.nodes}
    user_inputs = list(program.graph_signature.user_inputs)
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    output_values = [n.meta["val"] for n in output_node.args[0][-len(program.graph_signature.user_outputs):]]
    spec = program.call_spec.out_spec
    keys: list[Any] = list(spec.context) if spec is not None and spec.type is dict else list(range(len(output_values)))
    names = [str(k) if isinstance(k, str) else f"OUTPUT__{k}" for k in keys]
    bounds: list[int] = []

    def tensor(name: str, value: Any) -> TensorSpec:
        dims = []
        for axis, size in enumerate(value.shape):
            if isinstance(size, int):
                dims.append(size)
                continue
            dims.append(-1)
            if axis == 0 and batched:
                upper = program.range_constraints.get(size.node.expr)
                if upper is not None and upper.upper.is_finite:
                    bounds.append(int(upper.upper))
        if batched and not dims:
            raise BackendError(f"{path}: tensor '{name}' has no batch axis (rank 0) but max_batch_size > 0")
        datatype = kserve_type(value.dtype, name, path)
        return TensorSpec(name, datatype, tuple(dims[1:] if batched else dims))

    inputs = tuple(tensor(n, nodes[n].meta["val"]) for n in user_inputs)
    outputs = tuple(tensor(n, v) for n, v in zip(names, output_values))
    return inputs, outputs, keys, min(bounds, default=None)


def scripted_inputs(
    config_inputs: Sequence[TensorSpec], args: list[str], path: Path
) -> tuple[tuple[TensorSpec, ...], list[str]]:
    """The inputs of a TorchScript program: the config's, each matched to a ``forward`` argument
    by name or by ``__<i>``. Returns (inputs, input names in argument order).

    Raises:
        BackendError: a config input that is no argument, or an argument no input feeds.
    """
    by_arg: dict[str, str] = {}
    for t in config_inputs:
        if t.name in args:
            by_arg[t.name] = t.name
            continue
        match = _POSITIONAL.match(t.name)
        if match is None or int(match.group(1)) >= len(args):
            raise BackendError(
                f"{path}: config input '{t.name}' is not an argument of the program's forward{tuple(args)}; "
                "name it as the argument or <name>__<index> (a model whose config describes its handler's "
                "tensors needs a torch.export program, model.pt2, which names its own)"
            )
        by_arg[args[int(match.group(1))]] = t.name
    unfed = [a for a in args if a not in by_arg]
    if unfed:
        raise BackendError(f"{path}: the program's forward takes {unfed}, which no config input feeds")
    return tuple(config_inputs), [by_arg[a] for a in args]


def _key(name: str) -> Any:
    """Where a TorchScript output is in the result: ``__<i>`` an index, else a dict key."""
    match = _POSITIONAL.match(name)
    return int(match.group(1)) if match else name


__all__ = ["PROGRAM_FILES", "TorchBackend", "exported_tensors", "import_torch", "program_file", "scripted_inputs"]
