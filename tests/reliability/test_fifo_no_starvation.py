"""C19: equal-priority requests run in arrival order; the early ones are never starved.

``engines/slow`` itself (copied; T = 1 s per batch: batch_ms 1000, row_ms 0), max batch 1,
one instance. R0..R9 are sent 100 ms apart, each with a 6 s deadline as the ``timeout``
request parameter (the gRPC deadline is 60 s: a DEADLINE_EXCEEDED is the server's) and the
same priority. Expected: execution and completion follow arrival order (completion times
increase); R0..R5 return OK; the ones that cannot finish in time are the latest arrivals
(R6..R9) and get the dispatcher's DEADLINE_EXCEEDED from the queue ("... it was not run",
counted as ``before_run``) without being executed (``slow`` counts the rows it ran); an early
request never fails while a later one succeeds. Not scaled. That R_k finishes at about k+1 s
is a wall-clock claim: its own test, under the ``timing`` marker.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from casekit import EXPIRED_IN_QUEUE, deadline_exceeded, row, timed_call, with_timeout

from trtserve.client import build_request, parse_response

ENGINES = Path(__file__).resolve().parents[2] / "engines"


def send_ten_100_ms_apart(make_server, tmp_path):
    """The case's run: (code, details, completion s after R0 was sent) of R0..R9, the rows
    ``slow`` ran meanwhile, and the growth of its deadline counters."""
    shutil.copytree(ENGINES / "slow", tmp_path / "slow")
    config = tmp_path / "slow" / "config.pbtxt"
    text = re.sub(r"max_batch_size: \d+", "max_batch_size: 1", config.read_text())
    text = text.replace('string_value: "20"', 'string_value: "1000"')  # batch_ms
    text = text.replace('string_value: "1" }', 'string_value: "0" }')  # row_ms
    config.write_text(text)
    srv = make_server(tmp_path, metrics_port=0)
    served = srv.registry.get("slow")
    assert served.spec.parameters == {"batch_ms": "1000", "row_ms": "0"} and served.spec.policy.max_batch_size == 1
    model = served.backend.models[0]
    executed = model.executed
    counted = deadline_exceeded(srv, "slow")

    def one(c, k: int):
        code, out, _ = timed_call(c.stub, with_timeout(build_request("slow", row(k + 1)), 6.0), 60)
        if code == grpc.StatusCode.OK:
            assert np.all(parse_response(out)["OUTPUT0"] == k + 1)
            out = ""
        return code, out, time.monotonic()

    start = time.monotonic()
    with srv.client() as c, ThreadPoolExecutor(10) as pool:
        futures = []
        for k in range(10):
            time.sleep(max(0.0, start + 0.1 * k - time.monotonic()))
            futures.append(pool.submit(one, c, k))
        results = [f.result() for f in futures]
    after = deadline_exceeded(srv, "slow")
    print(f"\nC19: {[code.name for code, _, _ in results]}; completion s {[round(t - start, 2) for *_, t in results]}")
    return ([(code, details, t - start) for code, details, t in results], model.executed - executed,
            {k: after[k] - counted[k] for k in after})


def test_requests_complete_in_arrival_order_and_only_the_latest_expire(make_server, tmp_path):
    results, ran, counted = send_ten_100_ms_apart(make_server, tmp_path)
    codes = [code for code, _, _ in results]
    done = [t for _, _, t in results]
    ok = [k for k, code in enumerate(codes) if code == grpc.StatusCode.OK]
    late = [k for k, code in enumerate(codes) if code != grpc.StatusCode.OK]
    assert ok == list(range(len(ok))) and len(ok) >= 5  # a prefix: no early failure while a later one succeeds
    for k in late:  # the server's answer from the queue (the gRPC deadline is 60 s)
        assert codes[k] == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_IN_QUEUE in results[k][1], results[k]
    assert late == list(range(6, 10))
    assert counted == {"before_run": 4, "finished_late": 0}
    assert [done[k] for k in ok] == sorted(done[k] for k in ok)  # completion follows arrival
    assert ran == len(ok)  # the expired ones never ran


@pytest.mark.timing
def test_each_request_finishes_when_those_ahead_of_it_have_run(make_server, tmp_path):
    """The wall-clock half of C19: R_k finishes at about k+1 s (one 1 s batch each, in order)."""
    results, _, _ = send_ten_100_ms_apart(make_server, tmp_path)
    done = [t for code, _, t in results if code == grpc.StatusCode.OK]
    assert all(abs(t - (k + 1)) < 0.3 for k, t in enumerate(done)), done
