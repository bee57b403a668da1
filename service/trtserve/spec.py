"""Immutable descriptions of a model and its tensors, built by :mod:`trtserve.repository`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trtserve.config import BatchingPolicy
from trtserve.datatypes import Datatype


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor.

    Attributes:
        name: tensor name as clients send it.
        datatype: its KServe datatype.
        dims: shape *without* the batch dimension; -1 marks a variable-size dimension.
        optional: an input the request may leave out.
    """

    name: str
    datatype: Datatype
    dims: tuple[int, ...]
    optional: bool = False

    def shape(self, batched: bool) -> list[int]:
        """The shape clients see in ModelMetadata: ``[-1, *dims]`` for a batched model."""
        return [-1, *self.dims] if batched else list(self.dims)

    @cached_property
    def fixed(self) -> bool:
        """Every dimension is a fixed size >= 1 (no -1), so a request's shape is valid exactly
        when it equals :attr:`dims` (after the batch size, for a batched model)."""
        return all(d >= 1 for d in self.dims)


@dataclass(frozen=True)
class ModelSpec:
    """A model as configured in ``engines/<name>/config.pbtxt``.

    Attributes:
        name: model name.
        version: the version served (a numeric directory under the model directory).
        platform: ``onnxruntime_onnx``, ``tensorrt_plan`` or ``python``.
        inputs, outputs: the client-facing tensors (with a handler these may differ from the
            engine's own tensors, which the runtime reads from the model file).
        policy: the batching policy (``max_batch_size``, queue delay, priorities, timeouts).
        instances: execution slots (``instance_group.count``, summed over groups).
        model_dir: ``engines/<name>``; ``version_dir``: ``engines/<name>/<version>``.
        parameters: the config's string ``parameters``.
        config: the parsed ``inference.ModelConfig`` message, returned by the ModelConfig RPC.
        choose_batch_size: the config leaves ``max_batch_size`` to the server (it is omitted, or
            0, with ``dynamic_batching`` present): the warm-up at load chooses it from the
            measured throughput curve, within the model file's batch limit
            (:mod:`trtserve.engine.warmup`). Until then ``policy.max_batch_size`` is 0; the spec
            of a served model carries the chosen value in ``policy`` and ``config``.
    """

    name: str
    version: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    policy: BatchingPolicy
    instances: int
    model_dir: Path
    version_dir: Path
    parameters: dict[str, str] = field(default_factory=dict)
    config: Any = None
    choose_batch_size: bool = False

    @property
    def batched(self) -> bool:
        """Whether tensors carry a leading batch dimension (``max_batch_size > 0``, or left to
        the server to choose)."""
        return self.policy.max_batch_size > 0 or self.choose_batch_size

    def input(self, name: str) -> TensorSpec | None:
        """The client-facing input called ``name``, or ``None`` if the model has none."""
        return self._inputs_by_name.get(name)

    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorSpec]:
        # Looked up for every input of every request: a dict, built once (the first of a name wins).
        by_name: dict[str, TensorSpec] = {}
        for t in self.inputs:
            by_name.setdefault(t.name, t)
        return by_name

    def output(self, name: str) -> TensorSpec | None:
        """The client-facing output called ``name``, or ``None`` if the model has none."""
        return next((t for t in self.outputs if t.name == name), None)
