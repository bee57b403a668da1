"""The raw reference: the model's ONNX file run directly in ONNX Runtime, no server.

Same file, same session settings as the server's default
(:func:`~trtserve.runtimes.onnxruntime.session_options` at ``--intra-op-threads 0``: CPU
execution provider, one thread per core) but with ORT's own default thread spinning, which the
server turns off (docs/benchmarks.md, "ONNX Runtime settings"), same rows packed the same way, at
batch sizes 1, 2, 4, … max_batch_size. Run it while the server is idle.
"""

from __future__ import annotations

import time

import onnxruntime as ort

from trtserve.datatypes import Tensors
from trtserve.harness.benchlib.report import RawReference, RawSize
from trtserve.harness.benchlib.workload import Workload
from trtserve.runtimes.onnxruntime import engine_tensors, session_options

WARMUP_RUNS = 2
MIN_RUNS = 6
ROUNDS = 3
FEEDS_PER_SIZE = 64


def batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, … up to ``max_batch_size``, which is always included."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return [*sizes, max_batch_size]


def measure_raw(workload: Workload, seconds_per_size: float) -> RawReference:
    """Time ``session.run`` alone (inputs prebuilt, cycling over different rows) for about
    ``seconds_per_size`` seconds of wall time (at least :data:`MIN_RUNS` runs) at each batch
    size; rows/s is rows over the summed run times (:attr:`RawSize.rows_per_s`).

    The time of each size is spread over :data:`ROUNDS` rounds through all sizes, so that
    a stretch of load from elsewhere on the machine weighs on every size alike.
    """
    options = session_options(spinning=True)
    session = ort.InferenceSession(str(workload.onnx_path), options, providers=["CPUExecutionProvider"])
    engine_inputs, _ = engine_tensors(session, True, workload.onnx_path)
    output_names = [o.name for o in session.get_outputs()]
    feeds: dict[int, list[Tensors]] = {}
    for batch in batch_sizes(workload.spec.policy.max_batch_size):
        feeds[batch] = workload.engine_batches(batch, engine_inputs, FEEDS_PER_SIZE)
        if not feeds[batch]:
            raise ValueError(f"{workload.spec.name}: {len(workload.segments)} rows cannot fill a batch of {batch}")
        for i in range(WARMUP_RUNS):
            session.run(output_names, feeds[batch][i % len(feeds[batch])])
    latencies: dict[int, list[float]] = {batch: [] for batch in feeds}
    for _ in range(ROUNDS):
        for batch, batch_feeds in feeds.items():
            runs = latencies[batch]
            round_end = time.perf_counter() + seconds_per_size / ROUNDS
            least = len(runs) + MIN_RUNS // ROUNDS
            while time.perf_counter() < round_end or len(runs) < least:
                feed = batch_feeds[len(runs) % len(batch_feeds)]
                start = time.perf_counter()
                session.run(output_names, feed)
                runs.append((time.perf_counter() - start) * 1e6)
    return RawReference(workload.spec.name, tuple(RawSize(batch, tuple(runs)) for batch, runs in latencies.items()))
