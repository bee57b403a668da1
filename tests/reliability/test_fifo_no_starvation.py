"""C19: equal-priority requests run in arrival order; the early ones are never starved.

``engines/slow`` itself (copied; T = 1 s per batch: batch_ms 1000, row_ms 0), max batch 1,
one instance. R0..R9 are sent 100 ms apart, each with a 6 s gRPC deadline and the same
priority. Expected: execution and completion follow arrival order (completion times
increase); R0..R5 return OK (R_k finishes at about k+1 s, within 0.1k + 6 s); the ones that
cannot finish in time are the latest arrivals (R6..R9) and get DEADLINE_EXCEEDED without being
executed (``slow`` counts the rows it ran); an early request never fails while a later one
succeeds. Not scaled.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from harness import row

ENGINES = Path(__file__).resolve().parents[2] / "engines"


def test_requests_complete_in_arrival_order_and_only_the_latest_expire(make_server, tmp_path):
    shutil.copytree(ENGINES / "slow", tmp_path / "slow")
    config = tmp_path / "slow" / "config.pbtxt"
    text = re.sub(r"max_batch_size: \d+", "max_batch_size: 1", config.read_text())
    text = text.replace('string_value: "20"', 'string_value: "1000"')  # batch_ms
    text = text.replace('string_value: "1" }', 'string_value: "0" }')  # row_ms
    config.write_text(text)
    srv = make_server(tmp_path)
    served = srv.registry.get("slow")
    assert served.spec.parameters == {"batch_ms": "1000", "row_ms": "0"} and served.spec.policy.max_batch_size == 1
    model = served.backend.models[0]
    executed = model.executed

    def one(c, k: int):
        try:
            out = c.infer("slow", row(k + 1), timeout=6.0)
            code = grpc.StatusCode.OK
            assert np.all(out["OUTPUT0"] == k + 1)
        except grpc.RpcError as exc:
            code = exc.code()
        return code, time.monotonic()

    start = time.monotonic()
    with srv.client() as c, ThreadPoolExecutor(10) as pool:
        futures = []
        for k in range(10):
            time.sleep(max(0.0, start + 0.1 * k - time.monotonic()))
            futures.append(pool.submit(one, c, k))
        results = [f.result() for f in futures]
    codes = [code for code, _ in results]
    done = [t - start for _, t in results]
    print(f"\nC19: {[c.name for c in codes]}; completion s {[round(t, 2) for t in done]}")
    ok = [k for k, code in enumerate(codes) if code == grpc.StatusCode.OK]
    late = [k for k, code in enumerate(codes) if code != grpc.StatusCode.OK]
    assert ok == list(range(len(ok))) and len(ok) >= 5  # a prefix: no early failure while a later one succeeds
    assert all(codes[k] == grpc.StatusCode.DEADLINE_EXCEEDED for k in late)
    assert late == list(range(6, 10))
    assert [done[k] for k in ok] == sorted(done[k] for k in ok)  # completion follows arrival
    for k in ok:
        assert abs(done[k] - (k + 1)) < 0.3, done
    assert model.executed - executed == len(ok)  # the expired ones never ran
