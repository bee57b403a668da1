"""Fault injection (issue 10, part 3): engines that fail, hang or answer wrongly, clients that
vanish mid-stream, and a server killed mid-stream.

The engine is the probe Python model (``casekit.PROBE``), which logs every batch it runs and
injects one fault on demand. Expectations:

* an engine that raises on a chosen batch: exactly the requests in that batch get INTERNAL,
  with the exception's text; every other request is answered OK;
* an engine that returns the wrong output shape: INTERNAL naming the output, the expected
  and the returned shape, for that batch alone;
* an engine that hangs past the deadlines: waiting callers get the server's DEADLINE_EXCEEDED
  at their deadlines (``timeout`` parameter; the gRPC deadline is 30 s) — the one in the hung
  batch while that batch still runs, counted as ``finished_late``, the queued ones from the
  queue, counted as ``before_run`` — the slot is marked unhealthy (``Dispatcher.healthy`` / ``unhealthy_slots``;
  ModelReady false while every slot is hung) instead of wedging the model, another slot keeps
  serving, and the slot recovers when the hang ends (the hang threshold, max(20x predicted,
  10 s), is lowered to 1 s here);
* a client that cancels its stream mid-way: its queued rows leave the queue and never run
  (only the batch already running finishes); that they leave within 1 s is a wall-clock claim,
  under the ``timing`` marker;
* a server SIGKILLed mid-stream: the client sees UNAVAILABLE for the stream and for unary calls
  in flight, and no request is answered twice.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import (
    EXPIRED_IN_QUEUE,
    EXPIRED_WHILE_RUNNING,
    deadline_exceeded,
    error_code,
    logged_ids,
    probe,
    row,
    timed_call,
    wait_for,
    with_timeout,
    write_probe,
)

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.batching import watchdog
from trtserve.client import build_request
from trtserve.testing import ServerProcess

call = timed_call  # (code, response or details, seconds)


def fire(srv, model: str, ids: list[float], timeout: float = 30.0) -> dict[float, tuple]:
    """Send one single-row request per id, all at once; id -> (code, response or details, seconds)."""
    go = threading.Barrier(len(ids))
    with srv.client() as c, ThreadPoolExecutor(len(ids)) as pool:
        def send(rid):
            go.wait()
            return call(c.stub, build_request(model, row(rid)), timeout)
        return dict(zip(ids, pool.map(send, ids)))


@pytest.mark.parametrize("fault", ["raise on batch 3", "wrong output shape"])
def test_a_failing_batch_fails_only_its_own_requests(make_server, tmp_path, fault):
    params = {"fail_batch": 3} if fault == "raise on batch 3" else {"bad_shape_on": 13}
    write_probe(tmp_path, "probe", max_batch_size=4, batch_ms=30, **params)
    srv = make_server(tmp_path)
    model = probe(srv)
    results = fire(srv, "probe", [float(i) for i in range(1, 25)])
    failed = {rid for rid, (code, _, _) in results.items() if code != grpc.StatusCode.OK}
    batches = [set(ids) for _, _, ids in model.log]
    bad_batch = batches[2] if fault == "raise on batch 3" else next(b for b in batches if 13.0 in b)
    print(f"\nfaults, {fault}: batches {[sorted(b) for b in batches]}; failed {sorted(failed)}")
    assert failed == bad_batch and len(failed) >= 1
    for rid in failed:
        code, details, _ = results[rid]
        assert code == grpc.StatusCode.INTERNAL
        if fault == "raise on batch 3":
            assert "RuntimeError: injected failure in batch 3" in details
        else:
            assert "OUTPUT0" in details and "expected FP32" in details and "returned float32 of shape" in details
    for rid, (code, response, _) in results.items():
        if rid not in failed:
            assert code == grpc.StatusCode.OK
            assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [rid] * 4
    assert sorted(logged_ids(model)) == sorted(results)  # each ran exactly once
    with srv.client() as c:  # the slot keeps serving
        assert c.infer("probe", row(99.0), timeout=5)["OUTPUT0"][0, 0] == 99.0


def test_a_hung_engine_answers_callers_at_their_deadlines_and_marks_the_slot(make_server, tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "HANG_MIN_S", 1.0)
    write_probe(tmp_path, "probe", max_batch_size=1, instances=2, batch_ms=20, hang_on=77, hang_s=3, fast_warmup="true")
    srv = make_server(tmp_path, metrics_port=0)
    d = srv.registry.get("probe").dispatcher
    counted = deadline_exceeded(srv, "probe")

    def within(rid: float, seconds: float):
        """A request with a server-side deadline of ``seconds`` (the gRPC deadline is 30 s)."""
        return with_timeout(build_request("probe", row(rid)), seconds)

    def hung_ran() -> bool:
        return any(77.0 in logged_ids(probe(srv, slot=s)) for s in (0, 1))

    with srv.client() as c, ThreadPoolExecutor(4) as pool:
        hung = pool.submit(call, c.stub, within(77.0, 0.5))
        assert wait_for(lambda: d.idle_slots == 1, 5)
        code, details, elapsed = hung.result()
        # The server's answer at its 0.5 s deadline, while the batch still hangs (3 s).
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_WHILE_RUNNING in details, (code, details)
        assert not hung_ran() and d.idle_slots == 1, "answered only when the hung batch ended"
        # The other slot keeps serving while the first one hangs.
        served_meanwhile = [call(c.stub, build_request("probe", row(float(i))), 5)[0] for i in range(1, 11)]
        assert served_meanwhile == [grpc.StatusCode.OK] * 10
        assert wait_for(lambda: len(d.unhealthy_slots) == 1, 3)
        assert d.healthy  # one of two slots is still good
        # Both slots hung: the model is unhealthy, and callers still get answers at their deadlines.
        second = pool.submit(call, c.stub, within(77.0, 0.5)).result()
        assert second[0] == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_WHILE_RUNNING in second[1], second
        queued = [pool.submit(call, c.stub, within(float(i), 0.6)) for i in (21, 22)]
        for code, details, _ in (f.result() for f in queued):
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_IN_QUEUE in details, (code, details)
        assert wait_for(lambda: not d.healthy, 3)
        # ModelReady says so, so that a load balancer routes away from the wedged model.
        assert not c.stub.ModelReady(pb.ModelReadyRequest(name="probe"), timeout=5).ready
        # The hangs end: the slots come back and serve.
        assert wait_for(lambda: d.healthy and not d.unhealthy_slots and d.idle_slots == 2, 10)
        assert c.stub.ModelReady(pb.ModelReadyRequest(name="probe"), timeout=5).ready
        assert call(c.stub, build_request("probe", row(5.0)), 5)[0] == grpc.StatusCode.OK
    assert 21.0 not in logged_ids(probe(srv)) and 22.0 not in logged_ids(probe(srv, slot=1))
    grew = {k: v - counted[k] for k, v in deadline_exceeded(srv, "probe").items()}
    assert grew == {"before_run": 2, "finished_late": 2}, grew


@pytest.mark.timing
def test_a_hung_engine_answers_its_caller_at_the_deadline_not_when_the_hang_ends(make_server, tmp_path):
    """The wall-clock half: answered within 0.4..2.5 s of a 0.5 s deadline, not after the 3 s hang."""
    write_probe(tmp_path, "probe", max_batch_size=1, batch_ms=20, hang_on=77, hang_s=3, fast_warmup="true")
    srv = make_server(tmp_path)
    with srv.client() as c:
        code, _, elapsed = call(c.stub, with_timeout(build_request("probe", row(77.0)), 0.5), 30)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and 0.4 < elapsed < 2.5, (code, elapsed)


def cancel_a_stream_mid_way(make_server, tmp_path):
    """Stream 40 rows to a probe (batches of 4, 200 ms each), cancel after the first answer.
    Returns (seconds from the cancel until the queue was seen empty, ids run, batches started
    after that)."""
    write_probe(tmp_path, "probe", max_batch_size=4, batch_ms=200)
    srv = make_server(tmp_path)
    d, model = srv.registry.get("probe").dispatcher, probe(srv)
    with srv.client() as c:
        requests = [build_request("probe", row(float(i)), request_id=str(i)) for i in range(1, 41)]
        stream = c.stub.ModelStreamInfer(iter(requests))
        first = next(stream)
        assert error_code(first) == "OK" and len(d.queue) > 0
        cancelled_at = time.monotonic()
        stream.cancel()
        assert wait_for(lambda: len(d.queue) == 0, 30)
        emptied_at = time.monotonic()
        assert wait_for(lambda: d.idle_slots == 1, 30)
        # Once the queue is empty, nothing of the stream may start.
        ran_after = [ids for start, _, ids in model.log if start > emptied_at]
        # The slot is free for others.
        assert c.infer("probe", row(500.0), timeout=5)["OUTPUT0"][0, 0] == 500.0
    ran = [i for i in logged_ids(model) if i < 500]
    print(f"\nfaults, cancelled stream: queue empty {(emptied_at - cancelled_at) * 1e3:.0f} ms after the cancel; "
          f"{len(ran)} of 40 rows ran (batches started before the cancel)")
    assert srv.admitted == 0
    return emptied_at - cancelled_at, ran, ran_after


def test_a_cancelled_stream_takes_its_queued_rows_out_of_the_queue(make_server, tmp_path):
    _, ran, ran_after = cancel_a_stream_mid_way(make_server, tmp_path)
    assert ran_after == []
    assert len(ran) < 40 and ran == sorted(ran)  # the rest left the queue unrun; what ran, ran in order


@pytest.mark.timing
def test_a_cancelled_stream_leaves_the_queue_within_a_second(make_server, tmp_path):
    """The wall-clock half: the queue is empty within 1 s of the cancel, and only the first
    batch and the one running when the cancel came (8 rows) ran."""
    emptied_after, ran, _ = cancel_a_stream_mid_way(make_server, tmp_path)
    assert emptied_after < 1.0 and len(ran) <= 8, (emptied_after, ran)


def test_a_server_killed_mid_stream_is_unavailable_and_answers_nothing_twice(tmp_path):
    write_probe(tmp_path, "probe", max_batch_size=4, batch_ms=300, fast_warmup="true")
    with ServerProcess(tmp_path) as srv, grpc.insecure_channel(srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        requests = [build_request("probe", row(float(i)), request_id=str(i)) for i in range(1, 21)]
        stream = stub.ModelStreamInfer(iter(requests), timeout=30)
        with ThreadPoolExecutor(2) as pool:
            unary = pool.submit(call, stub, build_request("probe", row(900.0)), 30)
            received, code = [], None
            try:
                for message in stream:
                    received.append(message.infer_response.id)
                    if len(received) == 4:
                        srv.proc.send_signal(signal.SIGKILL)
            except grpc.RpcError as exc:
                code = exc.code()
            unary_code = unary.result()[0]
        srv.proc.wait(10)
    print(f"\nfaults, SIGKILL mid-stream: {len(received)} answers before the kill, stream {code}, unary {unary_code}")
    assert code == grpc.StatusCode.UNAVAILABLE
    assert unary_code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK)
    assert len(received) == len(set(received)) and 4 <= len(received) < 20
