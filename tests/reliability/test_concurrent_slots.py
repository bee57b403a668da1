"""C15: concurrent batches on several execution slots never mix up outputs (CPU part).

The TensorRT part of the case needs a GPU: ``tests/gpu/test_tensorrt_concurrent_slots.py`` runs the
same workload on a tiny plan with 2 slots (2 execution contexts, 2 CUDA streams, 2 sets of
pinned buffers) and compares every output with ONNX Runtime. Here, on the CPU, the logic both
paths share:

* ``pack`` / ``unpack``: random ragged batches packed into staging buffers, and into raw byte
  buffers the way the TensorRT slots pack into their pinned memory (``out=``), come back as
  exactly each piece's rows;
* the served path: ``tiny`` (FP32 MLP) with 2 ONNX Runtime instances (2 sessions on 2 slot
  threads), 16 client threads sending 1000 random inputs of 1 to 8 rows (the case: 2000),
  every output compared with a reference run one request at a time on a separate ORT session
  (max abs error 1e-5); no NaN or Inf, all OK, and both slots did run batches at the same time;
* a request with more rows than ``max_batch_size``, split over both slots (the probe Python
  model, 2 instances, max batch 4: 6 rows run as 4 + 2 at the same time, the piece with the
  first rows held 3 s longer, so the piece with the last rows finishes first): the answer has
  every row, in row order, and each row ran once.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
from casekit import logged_ids, probe, write_probe

from trtserve.datatypes import DATATYPES
from trtserve.runtimes.base import Batch, StagingBuffers, pack, unpack
from trtserve.spec import TensorSpec
from trtserve.testing.models import tiny_mlp

FP32 = DATATYPES["FP32"]


def test_pack_and_unpack_round_trip_every_piece_into_staging_and_raw_buffers():
    rng = np.random.default_rng(3)
    specs = (TensorSpec("x", FP32, (-1, 3)),)
    out_specs = (TensorSpec("y", FP32, (-1, 3)),)
    raw = {"x": np.empty(64 * 40 * 3 * 4, np.uint8)}
    staging = StagingBuffers()
    for _ in range(200):
        pieces = [{"x": rng.standard_normal((int(rng.integers(1, 9)), int(rng.integers(1, 41)), 3)).astype(np.float32)}
                  for _ in range(int(rng.integers(1, 9)))]
        batch = Batch(tuple(pieces), sum(len(p["x"]) for p in pieces))
        a = pack(batch, specs, staging, -1.0)["x"]
        b = pack(batch, specs, None, -1.0, out=raw)["x"]
        np.testing.assert_array_equal(a, b)
        assert b.base is not None and np.shares_memory(b, raw["x"])
        for piece, cut in zip(pieces, unpack(batch, {"y": a.copy()}, out_specs)):
            np.testing.assert_array_equal(cut["y"], piece["x"])


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread
    from trtserve.testing.models import config_text, write_model

    root = tmp_path_factory.mktemp("c15")
    write_model(root, "tiny", tiny_mlp(), config_text(
        "tiny", [("INPUT", "FP32", (64,))], [("OUTPUT", "FP32", (16,))], max_batch_size=64,
        extra="dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]"))
    with ServerThread(root) as s:
        yield s


def test_two_slots_under_16_threads_give_every_request_its_own_exact_answer(srv, tmp_path):
    served = srv.registry.get("tiny")
    backend = served.backend
    running, peak, slots_used = 0, 0, set()
    lock = threading.Lock()
    original = backend.run_inline

    def counting_run(slot, batch):
        # On the slot's thread, once the batch has begun (a batch staged behind another waits
        # before this: only runs count).
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            slots_used.add(slot)
        try:
            return original(slot, batch)
        finally:
            with lock:
                running -= 1

    backend.run_inline = counting_run
    try:
        rng = np.random.default_rng(15)
        inputs = [rng.standard_normal((int(rng.integers(1, 9)), 64)).astype(np.float32) * 3 for _ in range(1000)]
        model_file = str(served.spec.version_dir / "model.onnx")
        reference = ort.InferenceSession(model_file, providers=["CPUExecutionProvider"])
        expected = [reference.run(None, {"INPUT": x})[0] for x in inputs]

        def client(k: int) -> float:
            worst = 0.0
            with srv.client() as c:
                for i in range(k, len(inputs), 16):
                    out = c.infer("tiny", {"INPUT": inputs[i]}, timeout=30)["OUTPUT"]
                    assert out.shape == expected[i].shape and np.isfinite(out).all()
                    worst = max(worst, float(np.abs(out - expected[i]).max()))
            return worst

        with ThreadPoolExecutor(16) as pool:
            worst = max(pool.map(client, range(16)))
    finally:
        backend.run_inline = original
    stats = served.dispatcher.stats
    print(f"\nC15 (CPU): {len(inputs)} requests in {stats.batches} batches (mean {stats.mean_batch_size:.1f} rows), "
          f"max abs error {worst:.1e}, slots {sorted(slots_used)}, peak concurrent batches {peak}")
    assert worst <= 1e-5
    assert slots_used == {0, 1} and peak == 2


def test_a_request_split_over_two_slots_is_gathered_in_row_order_when_its_last_rows_finish_first(
        make_server, tmp_path):
    # Row ids 1..6 (the probe reads the first value of a row as its id); id 1 holds its batch 3 s.
    write_probe(tmp_path, "probe", max_batch_size=4, instances=2, fast_warmup="true", hang_on=1, hang_s=3)
    srv = make_server(tmp_path)
    x = np.repeat(np.arange(1, 7, dtype=np.float32)[:, None], 4, axis=1)
    with srv.client() as c:
        out = c.infer("probe", {"INPUT0": x}, timeout=60)["OUTPUT0"]
    np.testing.assert_array_equal(out, x)  # every row, in row order
    batches = sorted((start, end, ids) for slot in (0, 1) for start, end, ids in probe(srv, slot=slot).log)
    print(f"\nsplit over two slots: {[(ids, round(end - batches[0][0], 2)) for _, end, ids in batches]}")
    pieces = {tuple(sorted(ids)): (start, end) for start, end, ids in batches}
    assert sorted(pieces) == [(1.0, 2.0, 3.0, 4.0), (5.0, 6.0)], pieces  # split at max_batch_size
    assert sorted(logged_ids(probe(srv)) + logged_ids(probe(srv, slot=1))) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    (_first_start, first_end), (_last_start, last_end) = pieces[1.0, 2.0, 3.0, 4.0], pieces[5.0, 6.0]
    assert len(probe(srv).log) == len(probe(srv, slot=1).log) == 1  # one piece on each slot
    # The last rows came back first (whether the two pieces overlapped in time is up to the OS's
    # scheduling of the slot threads on a loaded machine; which rows finish first is not).
    assert last_end < first_end
