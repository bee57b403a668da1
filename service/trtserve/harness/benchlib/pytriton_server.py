"""The benchmark's Triton peer: NVIDIA PyTriton serving trtserve's model files.

Run by :mod:`.peer` with the peer's own virtual environment (``nvidia-pytriton``,
onnxruntime, the handlers' libraries) and a path holding only the ``trtserve`` package::

    python -m trtserve.harness.benchlib.pytriton_server WORKSPACE MAX_QUEUE_DELAY_US SPECS

``SPECS`` is a pickle of the models' :class:`~trtserve.spec.ModelSpec` list, written by
the bench (the peer cannot parse ``config.pbtxt`` itself: trtserve's generated
``inference`` protos and tritonclient's, which PyTriton imports, claim the same names in
protobuf's default pool). For each model: the same ``model.onnx`` in an ONNX Runtime session with the
server's own session options (a Python model, platform ``python``: the same ``model.py``, its
``Model`` set up with the same spec and its ``predict`` called on each batch), bound to Triton
with the model's configured inputs, outputs and ``max_batch_size`` and Triton's dynamic batcher
(``MAX_QUEUE_DELAY_US`` µs; a request's ``timeout`` parameter honoured, as trtserve honours it:
the default queue policy allows the override and rejects a request whose timeout passes in the
queue). A batch Triton forms for an ONNX model goes through the model's handler
(``preprocess``: tokenization for minilm), is packed and padded by trtserve's own ``pack`` (so
the engine sees the feeds the bench's raw reference times) and cut back with ``unpack`` and
``postprocess``. So both servers take the very same request bytes and do the same work per row.

Prints ``HTTP on 127.0.0.1:PORT`` (Triton's HTTP door) and then ``listening on
127.0.0.1:PORT`` (the gRPC port) once Triton serves, and stops
Triton (and its worker processes) on SIGTERM or SIGINT. Imports numpy, onnxruntime,
pytriton and the parts of trtserve without grpc or protobuf.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import signal
import socket
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

from trtserve.handlers import load_handler
from trtserve.runtimes.base import Batch, StagingBuffers, pack, unpack
from trtserve.runtimes.onnxruntime import engine_tensors, session_options
from trtserve.spec import ModelSpec, TensorSpec

HOST = "127.0.0.1"


def _free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 now (Triton takes port numbers, not port 0)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tensor(spec: TensorSpec) -> Tensor:
    dtype = np.bytes_ if spec.datatype.name == "BYTES" else spec.datatype.numpy.type
    return Tensor(name=spec.name, dtype=dtype, shape=tuple(spec.dims), optional=spec.optional)


def _python_model_func(spec: ModelSpec):
    """The batch function of a Python model: ``<version_dir>/model.py``'s ``Model``, set up with
    ``spec`` (what trtserve's python runtime hands it), its ``predict`` on each batch."""
    module_spec = importlib.util.spec_from_file_location(f"peer_model_{spec.name}", spec.version_dir / "model.py")
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {spec.version_dir / 'model.py'}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    model = module.Model()
    model.setup(spec)

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return model.predict(inputs)

    return infer


def _infer_func(spec: ModelSpec):
    """The batch function of one model: handler, pack, ONNX Runtime, unpack, handler (a Python
    model: :func:`_python_model_func`)."""
    if spec.platform == "python":
        return _python_model_func(spec)
    path = spec.version_dir / "model.onnx"
    session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    engine_inputs, engine_outputs = engine_tensors(session, True, path)
    names = [o.name for o in engine_outputs]
    handler = load_handler(spec)
    staging = StagingBuffers()

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        segments = handler.preprocess(inputs) if handler is not None else [inputs]
        work = Batch(tuple(segments), sum(next(iter(s.values())).shape[0] for s in segments))
        outputs = dict(zip(names, session.run(names, pack(work, engine_inputs, staging, spec.policy.pad_value))))
        if handler is None:
            return outputs
        return handler.postprocess(inputs, unpack(work, outputs, engine_outputs))

    return infer


def main(argv: list[str]) -> int:
    workspace, delay_us = Path(argv[0]), int(argv[1])
    specs: list[ModelSpec] = pickle.loads(Path(argv[2]).read_bytes())
    # The python backend's stub links libpython from the default library path; point it at
    # this interpreter's own, or a stub of another patch release loads this one's stdlib.
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = ":".join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p)
    grpc_port, http_port, metrics_port = _free_ports(3)
    config = TritonConfig(grpc_address=HOST, grpc_port=grpc_port, http_address=HOST, http_port=http_port,
                          metrics_port=metrics_port, log_verbose=0)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # No restricted endpoints: the bench reads ModelStatistics (127.0.0.1 only).
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, workspace=workspace, security_config=security) as triton:
        for spec in specs:
            triton.bind(
                model_name=spec.name, infer_func=_infer_func(spec),
                inputs=[_tensor(t) for t in spec.inputs], outputs=[_tensor(t) for t in spec.outputs],
                config=ModelConfig(max_batch_size=spec.policy.max_batch_size,
                                   batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us,
                                                          default_queue_policy=QueuePolicy(allow_timeout_override=True))),
                strict=True,
            )
        triton.run()
        print(f"HTTP on {HOST}:{http_port}", flush=True)
        print(f"listening on {HOST}:{grpc_port}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
