"""The raw reference: the model's ONNX file run directly in ONNX Runtime, no server.

Same file, same session settings as the server's default (CPU execution provider,
``intra_op_num_threads`` 0 and ``inter_op_num_threads`` 0: ONNX Runtime's own choice, one
thread per core), same rows packed the same way, at batch sizes 1, 2, 4, … max_batch_size.
Run it while the server is idle.
"""

from __future__ import annotations

import time

import onnxruntime as ort

from ...runtimes.onnxruntime import ORT_TYPES
from ...spec import TensorSpec
from .report import RawReference, RawSize
from .workload import Workload

WARMUP_RUNS = 2
MIN_RUNS = 5
FEEDS_PER_SIZE = 64


def batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, … up to ``max_batch_size``, which is always included."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return [*sizes, max_batch_size]


def measure_raw(workload: Workload, seconds_per_size: float) -> RawReference:
    """Time ``session.run`` alone (inputs prebuilt) for about ``seconds_per_size`` seconds
    (at least :data:`MIN_RUNS` runs) at each batch size, cycling over different rows."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 0
    options.inter_op_num_threads = 0
    session = ort.InferenceSession(str(workload.onnx_path), options, providers=["CPUExecutionProvider"])
    engine_inputs = [TensorSpec(a.name, ORT_TYPES[a.type], ()) for a in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    sizes = []
    for batch in batch_sizes(workload.spec.policy.max_batch_size):
        feeds = workload.engine_batches(batch, engine_inputs, FEEDS_PER_SIZE)
        if not feeds:
            raise ValueError(f"{workload.spec.name}: {len(workload.segments)} rows cannot fill a batch of {batch}")
        for i in range(WARMUP_RUNS):
            session.run(output_names, feeds[i % len(feeds)])
        latencies: list[float] = []
        spent = 0.0
        while spent < seconds_per_size or len(latencies) < MIN_RUNS:
            feed = feeds[len(latencies) % len(feeds)]
            start = time.perf_counter()
            session.run(output_names, feed)
            elapsed = time.perf_counter() - start
            latencies.append(elapsed * 1e6)
            spent += elapsed
        sizes.append(RawSize(batch, tuple(latencies)))
    return RawReference(workload.spec.name, tuple(sizes))
