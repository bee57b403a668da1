"""Small ONNX models for tests, examples and the overhead benchmark, made with ``onnx.helper``.

``make engine`` builds the ones in ``engines/`` through their one-line ``build.py`` recipes;
tests also write their own variants (every datatype, no batch dimension) into a temporary
repository with :func:`write_model`. Needs the ``onnx`` package (``export`` or ``dev`` extra).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from trtserve.datatypes import DATATYPES

OPSET = 17

# KServe datatype → ONNX TensorProto element type name.
ONNX_TYPES = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
    "INT8": "INT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "FP16": "FLOAT16",
    "BF16": "BFLOAT16",
    "FP32": "FLOAT",
    "FP64": "DOUBLE",
    "BYTES": "STRING",
}

TINY_IN, TINY_HIDDEN, TINY_OUT = 64, 32, 16


def _save(model: object, path: Path) -> bool:
    """Write ``model`` to ``path`` atomically; a no-op (False) when the bytes are unchanged."""
    data = model.SerializeToString()  # type: ignore[attr-defined]
    if path.exists() and hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True


def tiny_mlp():
    """The ``tiny`` model: FP32 INPUT [-1, 64] → OUTPUT [-1, 16] = tanh(x·W1 + b1)·W2 + b2.

    Weights are fixed (seeded), so outputs are reproducible across builds.
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 0.2, (TINY_IN, TINY_HIDDEN)).astype(np.float32)
    b1 = rng.normal(0, 0.1, TINY_HIDDEN).astype(np.float32)
    w2 = rng.normal(0, 0.2, (TINY_HIDDEN, TINY_OUT)).astype(np.float32)
    b2 = rng.normal(0, 0.1, TINY_OUT).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["INPUT", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", TINY_IN])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", TINY_OUT])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    return _model(graph)


def identity(datatype: str = "FP32", dims: tuple[int, ...] = (-1,), batched: bool = True):
    """An identity model: INPUT0 → OUTPUT0 of KServe ``datatype`` and ``dims`` (-1: variable)."""
    from onnx import TensorProto, helper

    elem = getattr(TensorProto, ONNX_TYPES[datatype])
    shape: list[object] = [f"d{i}" if d == -1 else d for i, d in enumerate(dims)]
    if batched:
        shape = ["batch", *shape]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)],
    )
    return _model(graph)


def mean_over_sequence():
    """A batch-*unsafe* model: FP32 INPUT0 [-1, -1] → OUTPUT0 [-1, 1], the mean over axis 1.

    Padding a short row to a batch's longest row changes its mean: ``trtserve check`` must
    catch it.
    """
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["INPUT0"], ["OUTPUT0"], axes=[1], keepdims=1)],  # opset 17 form
        "mean_over_sequence",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])],
    )
    return _model(graph)


def _model(graph: object):
    from onnx import checker, helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    checker.check_model(model)
    return model


def config_text(
    name: str,
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]],
    *,
    max_batch_size: int = 8,
    extra: str = "dynamic_batching { }",
) -> str:
    """A ``config.pbtxt`` for ONNX Runtime; tensors as (name, KServe datatype, dims)."""

    def tensors(items: list[tuple[str, str, tuple[int, ...]]]) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: {DATATYPES[t].config_name} dims: [{", ".join(map(str, d))}] }}'
            for n, t, d in items
        )

    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n{extra}\n"
    )


def write_model(root: Path, name: str, model: object, config: str) -> Path:
    """Write ``root/name/config.pbtxt`` and ``root/name/1/model.onnx``; returns the model dir."""
    model_dir = Path(root) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    _save(model, model_dir / "1" / "model.onnx")
    return model_dir


def build_tiny(model_dir: Path, force: bool = False) -> bool:
    """Recipe of ``engines/tiny``: writes ``1/model.onnx`` (the config is committed)."""
    return _save(tiny_mlp(), Path(model_dir) / "1" / "model.onnx") or force


def build_identity_fp32(model_dir: Path, force: bool = False) -> bool:
    """Recipe of ``engines/identity_fp32``: FP32 [-1] identity."""
    return _save(identity("FP32", (-1,)), Path(model_dir) / "1" / "model.onnx") or force


def build_echo_bytes(model_dir: Path, force: bool = False) -> bool:
    """Recipe of ``engines/echo_bytes``: BYTES [-1] identity."""
    return _save(identity("BYTES", (-1,)), Path(model_dir) / "1" / "model.onnx") or force
