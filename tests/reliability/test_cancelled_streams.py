"""C30: streams cancelled right after writing leave no bookkeeping behind.

A ``trtserve serve --frontends 2`` child process with ``identity_fp32``. Rounds of streams
that each write 8 messages back to back and are cancelled as soon as the last one is handed to
gRPC, without reading; in each round messages reach the server (``trtserve_requests_total``
grows: the cancels race real work, not empty streams); after each round the inflight gauge
returns to 0 and the queue is empty (every admitted message is released exactly once, also when
its task was cancelled before it started). Then SIGTERM on the idle
server exits 0 at once, not at the end of its 600 s grace period.
"""

from __future__ import annotations

import signal
import socket
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from casekit import wait_for
from prometheus_client.parser import text_string_to_metric_families

from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess

ENGINES = Path(__file__).resolve().parents[2] / "engines"
ROUNDS, STREAMS, MESSAGES = 3, 200, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gauge(port: int, name: str, model: str | None = None) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and (model is None or s.labels.get("model") == model):
                return s.value
    return -1.0


def counted(port: int, model: str) -> float:
    """``trtserve_requests_total`` of ``model``, every status together (CANCELLED included)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "trtserve_requests_total" and s.labels.get("model") == model)


def cancelled_stream(url: str) -> None:
    """Open a stream (its own connection), write 8 messages of 64 KiB, cancel without reading
    once gRPC has taken the last one."""
    x = np.ones((1, 16384), np.float32)
    with grpc.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        requests = [build_request("identity_fp32", {"INPUT0": x}, request_id=str(i)) for i in range(MESSAGES)]
        written = threading.Event()

        def messages():
            yield from requests
            written.set()  # gRPC asked for one more: all 8 are written

        call = stub.ModelStreamInfer(messages())
        written.wait(30)
        call.cancel()


def test_cancelled_streams_release_every_message_and_an_idle_server_exits_at_once():
    metrics = free_port()
    def inflight() -> float:
        return gauge(metrics, "trtserve_inflight_requests")

    with ServerProcess(ENGINES, "--frontends", "2", "--metrics-port", str(metrics), "--grace-period", "600") as srv:
        for _ in range(ROUNDS):
            before = counted(metrics, "identity_fp32")
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda _i: cancelled_stream(srv.url), range(STREAMS)))
            assert wait_for(lambda: inflight() == 0, 30), inflight()
            assert gauge(metrics, "trtserve_queue_depth", "identity_fp32") == 0
            # Messages did reach the server (answered, or cancelled after admission).
            reached = counted(metrics, "identity_fp32") - before
            print(f"\nC30 round: {reached:.0f} of {STREAMS * MESSAGES} messages reached the server")
            assert reached > 0
        with grpc.insecure_channel(srv.url) as channel:  # still serving
            out = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                build_request("identity_fp32", {"INPUT0": np.ones((1, 4), np.float32)}), timeout=30)
            assert out.raw_output_contents
        srv.proc.send_signal(signal.SIGTERM)
        # Idle: nothing admitted is left, so the drain does not wait for its grace period.
        assert srv.proc.wait(60) == 0
