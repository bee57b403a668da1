"""C04: a request whose client deadline passed leaves the queue and never runs.

Probe model (``engines/slow``'s behaviour: each batch sleeps T = 2 s), one instance,
batching on (max batch 8). Its zero-filled warm-up batches skip the sleep, so the latency
model starts out believing a batch is quick and admits the B requests into the queue: the
path under test is "queued, then dropped", not "refused at the door". Client A starts a
request with no deadline; 100 ms later B1..B10 each send one with a 500 ms deadline, as the
``timeout`` request parameter (the gRPC deadline is 30 s, so DEADLINE_EXCEEDED can only be the
server's answer). Each B gets the dispatcher's DEADLINE_EXCEEDED ("... it was not run") at about
0.5 s, counted in ``trtserve_deadline_exceeded_total{when="before_run"}``; when A's batch
finishes none of the B ids has run (the probe logs every row id it runs); the queue is empty; a
fresh request returns OK. Not scaled. "At about 0.5 s" is a wall-clock claim: its own test,
under the ``timing`` marker.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import (
    EXPIRED_IN_QUEUE,
    deadline_exceeded,
    logged_ids,
    probe,
    row,
    timed_call,
    wait_for,
    with_timeout,
    write_probe,
)

from trtserve.client import build_request


def expire_b_behind_a(make_server, tmp_path):
    """The case's run; returns the B results as (code, details, seconds), whether the queue
    emptied while A's batch was still running, the probe's log of row ids, and the growth of
    the model's deadline counters."""
    write_probe(tmp_path, "slow", max_batch_size=8, batch_ms=2000, fast_warmup="true")
    srv = make_server(tmp_path, metrics_port=0)
    served = srv.registry.get("slow")
    model = probe(srv, "slow")
    counted = deadline_exceeded(srv, "slow")

    def b_call(c, i):
        return timed_call(c.stub, with_timeout(build_request("slow", row(100 + i)), 0.5), 30)

    with srv.client() as c, ThreadPoolExecutor(11) as pool:
        a = pool.submit(c.infer, "slow", row(1))
        assert wait_for(lambda: served.dispatcher.idle_slots == 0, 5)
        time.sleep(0.1)
        bs = [pool.submit(b_call, c, i) for i in range(1, 11)]
        results = [f.result() for f in bs]
        # Dropped at their deadline (the server learns of it a moment after the client), not
        # when A's batch ends: the queue empties while A still runs (1.5 s to spare).
        assert wait_for(lambda: len(served.dispatcher.queue) == 0 or a.done(), 10)
        emptied_while_a_ran = len(served.dispatcher.queue) == 0 and not a.done()
        np.testing.assert_array_equal(a.result()["OUTPUT0"], row(1)["INPUT0"])
        assert wait_for(lambda: len(served.dispatcher.queue) == 0 and served.dispatcher.idle_slots == 1, 5)
        fresh = c.infer("slow", row(7), timeout=10)
    np.testing.assert_array_equal(fresh["OUTPUT0"], row(7)["INPUT0"])
    after = deadline_exceeded(srv, "slow")
    return results, emptied_while_a_ran, logged_ids(model), {k: after[k] - counted[k] for k in after}


def test_deadline_passed_requests_are_dropped_from_the_queue(make_server, tmp_path):
    results, emptied_while_a_ran, ran, counted = expire_b_behind_a(make_server, tmp_path)
    for code, details, elapsed in results:
        # The server's own answer (the gRPC deadline is 30 s), from the queue: not run.
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_IN_QUEUE in details, (code, details)
        assert elapsed >= 0.4, elapsed  # not refused at the door: they waited in the queue
    assert counted == {"before_run": 10, "finished_late": 0}
    assert emptied_while_a_ran
    assert ran == [1.0, 7.0]  # A and the fresh request; no B ever ran


@pytest.mark.timing
def test_deadline_passed_requests_are_answered_at_their_deadline(make_server, tmp_path):
    """The wall-clock half of C04: each B is answered at about its 0.5 s deadline."""
    results, _, _, _ = expire_b_behind_a(make_server, tmp_path)
    assert all(0.4 <= elapsed <= 0.9 for _, _, elapsed in results), results


def test_an_unmeasured_long_row_is_not_refused_on_a_guess(make_server, tmp_path):
    """The other side of C04: only requests that certainly cannot finish are dropped. The
    warm-up measures rows of 16 floats (mostly fixed overhead); a 200,000-float row has never
    been measured, and scaling the short rows' time by length predicted about a minute, so a
    request with a 2 s deadline used to be refused DEADLINE_EXCEEDED at once. Refusals now use
    a lower bound (``LatencyModel.lower_bound``): it runs, OK, in milliseconds."""
    from casekit import write_identity

    write_identity(tmp_path, "identity_fp32", max_batch_size=8)
    srv = make_server(tmp_path)
    latency = srv.registry.get("identity_fp32").dispatcher.latency
    # A deadline the guess would refuse and the bound allows, whatever this machine's speed.
    budget = latency.predict(1, 200_000) / 2
    assert latency.lower_bound(1, 200_000) < budget / 10
    x = np.arange(200_000, dtype=np.float32).reshape(1, -1)
    with srv.client() as c:
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x}, timeout=budget)["OUTPUT0"], x)
        streamed = ((str(k), {"INPUT0": x * k}) for k in range(3))
        answers = dict(c.stream_infer("identity_fp32", streamed, timeout_us=int(budget * 1e6)))
    assert sorted(answers) == ["0", "1", "2"]  # the same through a stream, with the timeout parameter
    for k, out in answers.items():
        np.testing.assert_array_equal(out["OUTPUT0"], x * int(k))
