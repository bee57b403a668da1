"""One served model: optional handler pre/post-processing around the batching dispatcher.

A model may have a handler beside its config (``engines/<model>/handler.py``) defining::

    class Handler:
        def __init__(self, model_dir: pathlib.Path, spec: trtserve.spec.ModelSpec): ...
        def preprocess(self, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]] | dict[str, np.ndarray]
        def postprocess(self, inputs: dict[str, np.ndarray], outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]

``preprocess`` turns one request's validated tensors into engine rows: one or more
*segments*, each a dict of engine-input name → array with rows on axis 0 (segments may differ
in their variable-length dims; the dispatcher pads to the longest row of each batch).
``postprocess`` receives one output dict per segment, in order, cut back to that segment's
rows, and returns the response tensors. Both run on the CPU pool, off the event loop, so the
preprocessing of request N+1 overlaps the engine running batch N. Raising
:class:`~trtserve.errors.InvalidRequest` answers INVALID_ARGUMENT; any other exception is
INTERNAL.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import numpy as np

from .batching.dispatcher import Dispatcher
from .batching.latency import LatencyModel
from .clock import Clock
from .errors import BackendError, TrtServeError
from .runtimes.base import Backend, Tensors
from .spec import ModelSpec, TensorSpec

HANDLER_FILE = "handler.py"
WARMUP_LENGTH = 16
WARMUP_SWEEPS = 2
"""Warm-up passes over the batch sizes; the last one seeds the latency model."""
T = TypeVar("T")


def load_handler(spec: ModelSpec) -> Any | None:
    """Instantiate ``Handler`` from ``<model_dir>/handler.py``, or ``None`` if there is no such file.

    Raises:
        ImportError / AttributeError: the file does not define ``Handler``; the model then
            fails to load with that reason.
    """
    path = spec.model_dir / HANDLER_FILE
    if not path.is_file():
        return None
    module_name = f"trtserve_handler_{spec.name}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module.Handler(spec.model_dir, spec)


class ServedModel:
    """A loaded model: spec, handler, runtime and dispatcher.

    Args:
        spec: the model's configuration.
        backend: its engine runtime.
        clock: time source for deadlines.
        pool: executor for handler pre/post-processing.
    """

    def __init__(self, spec: ModelSpec, backend: Backend, *, clock: Clock, pool: Executor) -> None:
        self.spec = spec
        self.backend = backend
        self.clock = clock
        self.pool = pool
        self.handler = load_handler(spec)
        if self.handler is None:
            check_engine_io(spec, backend)
        self.dispatcher = Dispatcher(backend, spec.policy, clock=clock)

    async def start(self) -> None:
        """Start the dispatcher and warm the model up: synthetic batches of 1, 2, 4, ...
        ``max_batch_size`` rows (variable dims at ``warmup_length``, parameter, default 16),
        run ``WARMUP_SWEEPS`` times, so that the first real request pays for no lazy
        initialisation and the latency model starts from a measured profile (of the last
        sweep). The model is reported ready only after this."""
        self.dispatcher.start()
        length = int(self.spec.parameters.get("warmup_length", WARMUP_LENGTH))
        sizes = [1]
        while sizes[-1] * 2 <= self.spec.policy.max_batch_size:
            sizes.append(sizes[-1] * 2)
        if sizes[-1] < self.spec.policy.max_batch_size:
            sizes.append(self.spec.policy.max_batch_size)
        for sweep in range(WARMUP_SWEEPS):
            if sweep == WARMUP_SWEEPS - 1:
                # The first sweep pays for first-run costs (allocations, kernel selection, a
                # cold cache); only the last one seeds the latency model.
                self.dispatcher.latency = LatencyModel()
            for rows in sizes:
                warm = sample_inputs(self.backend.inputs, rows, length)
                await self.dispatcher.submit([self.backend.prepare(warm)])
        self.dispatcher.stats.reset()  # statistics and metrics count traffic, not the warm-up

    async def infer(self, inputs: Tensors, *, priority: int = 0, deadline: float = math.inf) -> Tensors:
        """Run one request through pre-processing, the dispatcher and post-processing.

        Args:
            inputs: validated request tensors (batch on axis 0 for a batched model).
            priority: 1 is the most urgent; 0 for the model's default.
            deadline: monotonic seconds by which the answer is needed (``math.inf``: none).

        Returns:
            Output name → array (batch on axis 0 for a batched model).

        Raises:
            InvalidRequest, QueueFull, RequestTimeout, ShuttingDown, BackendError: see
            :meth:`Dispatcher.submit` and the handler contract above.
        """
        if self.handler is not None:
            pre = await self._on_pool(self.handler.preprocess, inputs)
            segments = [pre] if isinstance(pre, dict) else list(pre)
        elif self.spec.batched:
            segments = [inputs]
        else:
            segments = [{name: arr[np.newaxis] for name, arr in inputs.items()}]
        segments = [self.backend.prepare(segment) for segment in segments]
        outputs = await self.dispatcher.submit(segments, priority=priority, deadline=deadline)
        if self.handler is not None:
            return await self._on_pool(self.handler.postprocess, inputs, outputs)
        out = outputs[0]
        if not self.spec.batched:
            out = {name: arr[0] for name, arr in out.items()}
        return out

    async def _on_pool(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except TrtServeError:
            raise
        except Exception as exc:
            raise BackendError(
                f"handler {getattr(fn, '__name__', 'stage')} of model '{self.spec.name}' failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        """Finish queued and running requests, then release the runtime."""
        await self.dispatcher.aclose()
        await self.backend.aclose()


def check_engine_io(spec: ModelSpec, backend: Backend) -> None:
    """Without a handler, the config's tensors must be the engine's own.

    Raises:
        ValueError: a configured input or output the engine lacks, or whose datatype differs.
    """
    for kind, configured, actual in (("input", spec.inputs, backend.inputs), ("output", spec.outputs, backend.outputs)):
        engine = {t.name: t for t in actual}
        for t in configured:
            e = engine.get(t.name)
            if e is None:
                raise ValueError(
                    f"config {kind} '{t.name}' is not in the model file (it has {sorted(engine)})"
                )
            if e.datatype != t.datatype:
                raise ValueError(
                    f"config {kind} '{t.name}' is {t.datatype.name} but the model file has {e.datatype.name}"
                )
    missing = {t.name for t in backend.inputs} - {t.name for t in spec.inputs}
    if missing:
        raise ValueError(f"the model file needs inputs {sorted(missing)} that the config does not declare")


def sample_inputs(specs: Sequence[TensorSpec], rows: int, length: int) -> Tensors:
    """Zero-filled engine inputs of ``rows`` rows, variable (-1) dims at ``length``
    (BYTES as empty strings): for warm-up and profiling."""
    out: Tensors = {}
    for t in specs:
        shape = (rows, *(length if d == -1 else d for d in t.dims))
        if t.datatype.numpy == np.dtype(object):
            arr = np.empty(shape, dtype=object)
            arr.fill(b"")
        else:
            arr = np.zeros(shape, dtype=t.datatype.numpy)
        out[t.name] = arr
    return out
