"""C25: on SIGTERM every accepted request is served, new ones are refused UNAVAILABLE (never
NOT_FOUND), and the process exits within its grace period.

A ``trtserve serve`` child process (``--grace-period 10``) with the probe model (T = 2 s per
batch, max batch 32; its warm-up is instant). In flight when SIGTERM comes: 20 unary requests
and one open stream with 5 pending requests (the stream is not half-closed). For the next 5 s
(or until the process exits) the client keeps sending a new unary request every 50 ms and polls
ServerReady and ServerLive. Expected:

* ServerReady turns false at once; ServerLive stays true for as long as the process runs;
* every request accepted before the signal completes OK, the 5 stream requests too, after
  which the server ends the stream OK;
* every request sent after the signal fails UNAVAILABLE, never NOT_FOUND ("unknown model"):
  models unload only after the in-flight work is drained;
* the process exits 0 within the grace period.

And when the grace runs out first (``--grace-period 1``, 3 s of queued work, max batch 1): the
requests still in progress are answered UNAVAILABLE with a message naming the grace period,
not dropped, and the process still exits promptly.
"""

from __future__ import annotations

import queue
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import error_code, row, write_probe

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess


def call(stub, request, timeout=30):
    try:
        return grpc.StatusCode.OK, stub.ModelInfer(request, timeout=timeout), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""


@pytest.mark.timing
def test_sigterm_drains_accepted_work_and_refuses_new_work_unavailable(tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=32, batch_ms=2000, fast_warmup="true")
    grace = 10.0
    with ServerProcess(tmp_path, "--grace-period", str(grace)) as srv:
        channel = grpc.insecure_channel(srv.url)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        outbox: queue.Queue = queue.Queue()

        def messages():
            while (item := outbox.get()) is not None:
                yield item

        with ThreadPoolExecutor(24) as pool:
            accepted = [
                pool.submit(call, stub, build_request("slow", row(i + 1), request_id=str(i))) for i in range(20)
            ]
            stream = stub.ModelStreamInfer(messages(), timeout=60)
            for j in range(5):
                outbox.put(build_request("slow", row(100 + j), request_id=f"s{j}"))
            streamed = pool.submit(lambda: [m for m in stream])
            time.sleep(0.5)  # all 25 are read and queued (the first batch is running)
            sigterm = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            after, ready, live = [], [], []
            while time.monotonic() - sigterm < 5 and srv.proc.poll() is None:
                after.append(call(stub, build_request("slow", row(500)), timeout=5)[:3:2])
                running = srv.proc.poll() is None
                ready.append(stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready if running else None)
                try:
                    alive = stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
                except grpc.RpcError:
                    alive = srv.proc.poll() is not None and None  # gone: the process has exited
                live.append(alive)
                time.sleep(0.05)
            results = [f.result() for f in accepted]
            stream_messages = streamed.result(timeout=30)
            stream_code = stream.code()
            outbox.put(None)
        exit_code = srv.proc.wait(grace)
        exited_after = time.monotonic() - sigterm
        channel.close()

    print(f"\nC25: {len(after)} requests refused after SIGTERM, exit {exit_code} after {exited_after:.1f} s")
    assert [code for code, _, _ in results] == [grpc.StatusCode.OK] * 20
    for i, (_, response, _) in enumerate(results):
        assert np.frombuffer(response.raw_output_contents[0], np.float32)[0] == i + 1
    assert sorted(m.infer_response.id for m in stream_messages) == [f"s{j}" for j in range(5)]
    assert {error_code(m) for m in stream_messages} == {"OK"} and stream_code == grpc.StatusCode.OK
    assert len(after) >= 20
    assert {code for code, _ in after} == {grpc.StatusCode.UNAVAILABLE}, after
    assert all("shutting down" in details for _, details in after)
    assert [r for r in ready if r is not None] and not any(ready)  # false from the first poll on
    assert all(alive in (True, None) for alive in live) and live[0] is True
    assert exit_code == 0 and exited_after < grace


def test_when_the_grace_runs_out_the_rest_are_answered_unavailable(tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=1000, fast_warmup="true")
    with ServerProcess(tmp_path, "--grace-period", "1") as srv, grpc.insecure_channel(srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(call, stub, build_request("slow", row(i + 1))) for i in range(3)]
            time.sleep(0.3)
            sigterm = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            results = [f.result() for f in futures]
        exit_code = srv.proc.wait(10)
        exited_after = time.monotonic() - sigterm
    codes = [code for code, _, _ in results]
    assert codes.count(grpc.StatusCode.OK) >= 1 and codes.count(grpc.StatusCode.UNAVAILABLE) >= 1, results
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert all("grace" in details for code, _, details in results if code == grpc.StatusCode.UNAVAILABLE)
    assert exit_code == 0 and exited_after < 1 + 3
