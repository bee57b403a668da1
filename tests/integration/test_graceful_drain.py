"""Graceful drain on SIGTERM (issue 8; the failure case is C25,
``tests/reliability/test_graceful_shutdown.py``): every accepted request of 64 open streams is
answered, new work is refused UNAVAILABLE, readiness drops while liveness stays; what the grace
period cannot finish is refused UNAVAILABLE naming the grace; a second signal exits at once.

Real ``trtserve serve`` child processes (``ServerProcess``) with a slow Python model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from integration.helpers import free_port, row, sample, scrape, write_slow
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def wait_admitted(metrics_port: int, model: str, count: int, timeout: float = 30.0) -> None:
    """Until the server has admitted ``count`` requests of ``model`` (answered or in progress)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = await asyncio.to_thread(scrape, metrics_port)
        answered = sum(
            v for (name, labels), v in m.items() if name == "trtserve_requests_total" and ("model", model) in labels
        )
        if answered + sample(m, "trtserve_inflight_requests") >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the server did not admit {count} requests in {timeout} s")


async def test_sigterm_during_64_streams_answers_every_accepted_request(tmp_path):
    streams, per_stream, grace = 64, 5, 20.0
    write_slow(tmp_path, "slow", batch_ms=40, row_ms=1)  # 320 rows in batches of 8: about 2 s of work
    metrics_port = free_port()
    with ServerProcess(tmp_path, "--grace-period", str(grace), "--metrics-port", str(metrics_port)) as srv:
        async with grpc.aio.insecure_channel(srv.url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            received: list[tuple[str, str, float]] = []  # (id, error, time)
            calls = []

            async def client(k: int) -> grpc.StatusCode:
                call = stub.ModelStreamInfer()
                calls.append(call)
                for j in range(per_stream):
                    await call.write(build_request("slow", row(1, float(j)), request_id=f"{k}-{j}"))
                if k % 2:
                    await call.done_writing()  # half close; the other half keep the stream open
                async for message in call:
                    received.append((message.infer_response.id, message.error_message, time.monotonic()))
                return await call.code()

            tasks = [asyncio.ensure_future(client(k)) for k in range(streams)]
            await wait_admitted(metrics_port, "slow", streams * per_stream)  # every message accepted
            answered_before = len(received)
            sigterm = time.monotonic()
            os.kill(srv.pid, signal.SIGTERM)
            await asyncio.sleep(0.1)
            # New work is refused UNAVAILABLE (never NOT_FOUND), readiness drops, liveness stays.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(build_request("slow", row(2)))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            late = stub.ModelStreamInfer()
            await late.write(build_request("slow", row(2), request_id="after"))
            late_messages = [m async for m in late]
            assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == NOT_SERVING
            codes = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        exit_code = srv.proc.wait(grace)
        stopped_after = time.monotonic() - sigterm
    assert answered_before < streams * per_stream, "the signal came after all the work was done"
    assert all(code == grpc.StatusCode.OK for code in codes)  # each stream ends OK after its last answer
    assert [error for _, error, _ in received if error] == []
    assert sorted(i for i, _, _ in received) == sorted(f"{k}-{j}" for k in range(streams) for j in range(per_stream))
    assert any(t > sigterm for _, _, t in received)  # answers kept coming after the signal
    assert [m.infer_response.parameters["error_code"].string_param for m in late_messages] == ["UNAVAILABLE"]
    assert exit_code == 0 and stopped_after < grace


async def test_when_the_grace_runs_out_the_rest_get_unavailable(tmp_path):
    write_slow(tmp_path, "slow", max_batch_size=1, batch_ms=1000)
    metrics_port = free_port()
    with ServerProcess(tmp_path, "--grace-period", "1", "--metrics-port", str(metrics_port)) as srv:
        async with grpc.aio.insecure_channel(srv.url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            async def one(i: int) -> tuple[grpc.StatusCode, str]:
                try:
                    await stub.ModelInfer(build_request("slow", row(2), request_id=str(i)))
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), exc.details() or ""
                return grpc.StatusCode.OK, ""

            tasks = [asyncio.ensure_future(one(i)) for i in range(3)]
            await wait_admitted(metrics_port, "slow", 3)
            sigterm = time.monotonic()
            os.kill(srv.pid, signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        exit_code = srv.proc.wait(30)
        stopped_after = time.monotonic() - sigterm
    codes = [code for code, _ in results]
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, results
    assert codes.count(grpc.StatusCode.UNAVAILABLE) >= 1
    assert all("grace" in details for code, details in results if code == grpc.StatusCode.UNAVAILABLE)
    assert exit_code == 0 and stopped_after < 1 + 1 + 3  # the grace, the batch still running, exit


def test_a_second_signal_exits_at_once(tmp_path):
    write_slow(tmp_path, "slow", max_batch_size=1, batch_ms=1000)
    with ServerProcess(tmp_path, "--grace-period", "30") as srv:
        client = grpc.insecure_channel(srv.url)
        stub = pb_grpc.GRPCInferenceServiceStub(client)
        futures = [stub.ModelInfer.future(build_request("slow", row(2))) for _ in range(5)]
        time.sleep(1.0)  # all five admitted: 5 s of work to drain
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert srv.proc.poll() is None  # draining 5 s of work
        srv.proc.send_signal(signal.SIGTERM)
        exit_code = srv.proc.wait(30)
        # It exited without draining: the 1 s batches still queued were never answered OK.
        errors = [f.exception(30) for f in futures]
        codes = [grpc.StatusCode.OK if e is None else e.code() for e in errors]
        client.close()
    assert exit_code == 1
    assert codes.count(grpc.StatusCode.OK) < 5, codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
