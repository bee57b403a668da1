"""C18: rows of different lengths batched together never crash the merge; a request that is
ragged within itself is refused.

``seq_int64``: an ONNX Runtime INT64 identity with dims [-1] (a variable-length sequence), max
batch 8. trtserve has no "padding disabled" mode: rows of different lengths in one batch are
padded to the longest with ``pad_value`` and each answer is cut back to its own length (the
C17 behaviour, docs/concepts/dispatch.md), so batching never changes an answer. From 8 threads,
for 5 s (the case: 30 s), interleaved single-row requests of lengths 270 and 252, plus threads
sending only 270s: every answer is OK and exactly its input; equal-length requests still share
batches; the process never crashes. A single request whose two rows have different lengths
cannot be encoded as one tensor: sending 270 + 252 values as a [2, 270] tensor is refused
INVALID_ARGUMENT (byte count) at admission, as is every other shape/byte mismatch.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from casekit import raw_request, write_identity

from trtserve._proto.inference import grpc_service_pb2 as pb


def test_ragged_lengths_batch_correctly_and_ragged_requests_are_refused(make_server, tmp_path):
    write_identity(tmp_path, "seq_int64", "INT64", (-1,), max_batch_size=8)
    srv = make_server(tmp_path)
    stats = srv.registry.get("seq_int64").dispatcher.stats
    stop = threading.Event()
    counts = {"ok": 0}
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        lengths = (270, 252) if k < 6 else (270,)  # 6 interleaving threads, 2 of equal length only
        with srv.client() as c:
            i = 0
            while not stop.is_set():
                n = lengths[i % len(lengths)]
                x = rng.integers(-2**62, 2**62, (1, n), dtype=np.int64)
                out = c.infer("seq_int64", {"INPUT0": x}, timeout=10)["OUTPUT0"]
                assert out.shape == (1, n) and np.array_equal(out, x)
                i += 1
                with lock:
                    counts["ok"] += 1

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(worker, k) for k in range(8)]
        time.sleep(5.0)
        stop.set()
        for f in futures:
            f.result()
    print(f"\nC18: {counts['ok']} requests OK in {stats.batches} batches, "
          f"sizes {dict(sorted(stats.batch_sizes.items()))}, "
          f"padding {stats.padding_ratio:.1%}")
    assert counts["ok"] == stats.rows and max(stats.batch_sizes) > 1
    assert 0 < stats.padding_ratio < 1  # mixed lengths did share batches, padded and cut back

    a, b = np.arange(270, dtype=np.int64), np.arange(252, dtype=np.int64)
    both = np.concatenate([a, b]).tobytes()  # 522 values: neither [2, 270] nor [2, 252]
    with srv.client() as c:
        for request, words in (
            (raw_request("seq_int64", "INT64", [2, 270], both), ["4320 bytes", f"got {8 * 522}"]),
            (raw_request("seq_int64", "INT64", [2, 252], both), ["4032 bytes", f"got {8 * 522}"]),
            (raw_request("seq_int64", "INT32", [1, 270], a.astype(np.int32).tobytes()), ["INT32", "INT64"]),
        ):
            try:
                c.stub.ModelInfer(request, timeout=10)
                raise AssertionError("accepted")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "INPUT0" in exc.details() and all(w in exc.details() for w in words), exc.details()
        typed = pb.ModelInferRequest(model_name="seq_int64")
        typed_input = typed.inputs.add(name="INPUT0", datatype="INT64", shape=[2, 270])
        typed_input.contents.int64_contents.extend(np.concatenate([a, b]).tolist())
        try:
            c.stub.ModelInfer(typed, timeout=10)
            raise AssertionError("accepted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "540" in exc.details() and "522" in exc.details()
        assert c.stub.ServerLive(pb.ServerLiveRequest()).live
