"""One model inside the engine core: its runtime and its batching dispatcher.

The engine core runs engine rows; the handler's pre/post-processing and everything per
request run in the front ends (:mod:`trtserve.frontend.pipeline`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import numpy as np

from trtserve.batching.dispatcher import Dispatcher
from trtserve.clock import Clock
from trtserve.datatypes import Tensors
from trtserve.engine import warmup
from trtserve.engine.warmup import WARMUP_LENGTH, search_limit, warm_up
from trtserve.handlers import has_handler
from trtserve.ipc.admission import Ask, admit
from trtserve.runtimes.base import Backend, batch_limit
from trtserve.spec import ModelSpec, TensorSpec


class EngineModel:
    """A loaded model: spec, runtime and dispatcher.

    Args:
        spec: the model's configuration.
        backend: its engine runtime.
        clock: time source for deadlines.

    Raises:
        ValueError: a model without a handler whose config tensors are not the engine's own
            (see :func:`check_engine_io`).
    """

    def __init__(self, spec: ModelSpec, backend: Backend, *, clock: Clock) -> None:
        self.spec = spec
        self.backend = backend
        self.clock = clock
        if not has_handler(spec):
            check_engine_io(spec, backend)
        if spec.choose_batch_size:
            # The hard limit is the file's (search_limit); the cap in force is learned below it:
            # the warm-up measures where it starts, the dispatcher moves it while serving.
            self.spec = _with_limit(spec, search_limit(batch_limit(backend)))
        self.dispatcher = Dispatcher(backend, self.spec.policy, clock=clock,
                                     name=f"model {spec.name} version {spec.version}")

    async def start(self) -> None:
        """Start the dispatcher and warm the model up (:func:`~trtserve.engine.warmup.warm_up`):
        synthetic batches of 1, 2, 4, ... ``max_batch_size`` rows (variable dims at the
        ``warmup_length`` parameter, default :data:`~trtserve.engine.warmup.WARMUP_LENGTH`),
        each run twice, so that the first real request pays for no lazy initialisation and the
        latency model starts from a measured profile. Where the batch cap is live (the config
        leaves ``max_batch_size`` to the server, :attr:`~trtserve.spec.ModelSpec.choose_batch_size`,
        or asks for ``adaptive_batch_size``), the warm-up's curve gives where the cap starts
        (:func:`~trtserve.engine.warmup.choose`); the dispatcher then moves it while serving
        (:class:`~trtserve.batching.cap.BatchCap`). The model is reported ready only after this."""
        self.dispatcher.start()
        length = int(self.spec.parameters.get("warmup_length", WARMUP_LENGTH))
        policy = self.spec.policy
        limit = policy.max_batch_size

        def feed(rows: int) -> Tensors:
            return self.backend.prepare(sample_inputs(self.backend.inputs, rows, length))

        curve = await warm_up(self.dispatcher, feed, limit, search=self.spec.choose_batch_size)
        if policy.adaptive_batch_size:
            start = warmup.choose(curve, policy.latency_budget) or limit
            self.dispatcher.start_cap(start, "the knee of the warm-up's curve (rows/s by batch size: " +
                                      ", ".join(f"{b}: {b / t:.0f}" for b, t in curve.items()) +
                                      f"; the hard limit is {limit})")
        self.dispatcher.stats.reset()  # statistics and metrics count traffic, not the warm-up

    def submit(self, segments: list[Tensors], ask: Ask) -> tuple[asyncio.Future[list[Tensors]], float]:
        """Admit one request's engine rows: convert them for the engine, resolve its level and
        deadline (:func:`~trtserve.ipc.admission.admit`, with the policy in force) and queue
        them. Returns at once.

        Args:
            segments: engine-input name → array with rows on axis 0, one dict per segment.
            ask: the request's timing (:class:`~trtserve.ipc.admission.Ask`).

        Returns:
            (future of one output dict per segment, the deadline: monotonic seconds).

        Raises:
            InvalidRequest, QueueFull, RequestTimeout, ShuttingDown: see
            :meth:`~trtserve.runtimes.base.Backend.prepare`, :func:`~trtserve.ipc.admission.admit`
            and :meth:`~trtserve.batching.dispatcher.Dispatcher.submit`.
        """
        prepared = [self.backend.prepare(s) for s in segments]
        level, deadline = admit(self.dispatcher.policy, ask, self.clock.now())
        return self.dispatcher.submit(prepared, priority=level, deadline=deadline), deadline

    async def aclose(self) -> None:
        """Finish queued and running requests, then release the runtime."""
        await self.dispatcher.aclose()
        await self.backend.aclose()


def _with_limit(spec: ModelSpec, limit: int) -> ModelSpec:
    """``spec`` with ``max_batch_size`` set to ``limit`` (policy and config, which ModelConfig
    returns) and a live cap below it (``adaptive_batch_size``)."""
    policy = dataclasses.replace(spec.policy, max_batch_size=limit, adaptive_batch_size=True)
    config = type(spec.config)()
    config.CopyFrom(spec.config)
    config.max_batch_size = limit
    return dataclasses.replace(spec, policy=policy, config=config)


def check_engine_io(spec: ModelSpec, backend: Backend) -> None:
    """Without a handler, the config's tensors must be the engine's own.

    Raises:
        ValueError: a configured input or output the engine lacks, or whose datatype or dims
            differ (:func:`dims_fit`; Triton refuses the same at load). The runtime reads its
            tensors without the batch axis when ``max_batch_size > 0``, so a ``max_batch_size: 0``
            config on a model with a batch axis differs in rank and is refused too.
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
            if not dims_fit(t.dims, e.dims):
                batch = " (without the batch axis: the model batches)" if spec.batched else ""
                raise ValueError(
                    f"config {kind} '{t.name}' has dims {list(t.dims)} but the model file has {list(e.dims)}{batch}; "
                    "-1 in the model file takes any size, a fixed size must be the same in both"
                )
    missing = {t.name for t in backend.inputs} - {t.name for t in spec.inputs}
    if missing:
        raise ValueError(f"the model file needs inputs {sorted(missing)} that the config does not declare")


def dims_fit(configured: Sequence[int], engine: Sequence[int]) -> bool:
    """Whether config dims (batch axis left out) describe the engine's: the same rank, and every
    dimension the engine fixes fixed to the same size in the config (-1 in the engine takes any size,
    so the config may fix it or leave it -1)."""
    return len(configured) == len(engine) and all(e == -1 or c == e for c, e in zip(configured, engine))


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
