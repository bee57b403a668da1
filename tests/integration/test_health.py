"""Health and reflection (issue 8): the gRPC health service and reflection list trtserve's
services; health is NOT_SERVING while the models load, SERVING once they have, and NOT_SERVING
again while the server drains, and the JSON logs of ``--log-format json`` / ``--log-requests``
from the environment.

An in-process server for the listing; a real ``trtserve serve`` child process for start-up and
SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from integration.helpers import row, write_slow
from servers import code_of
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_and_reflection_list_the_services(server):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(server.url) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        assert check(health_pb2.HealthCheckRequest(service="")).status == SERVING
        assert check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")).status == SERVING
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        described = DescriptorPool(db).FindServiceByName("inference.GRPCInferenceService")
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= services
    assert {"ModelInfer", "ModelStreamInfer", "ModelStatistics"} <= set(described.methods_by_name)


class Spawned:
    """``trtserve serve`` as a child process whose port is known as soon as it is bound
    (before the models load), with its output lines collected."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(root),
               "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--metrics-port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.bound = threading.Event()
        self.listening = threading.Event()
        self.url = ""
        threading.Thread(target=self._pump, daemon=True).start()
        if not self.bound.wait(60):
            self.proc.kill()
            raise RuntimeError("no 'bound' line:\n" + "".join(self.lines))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if m := re.search(r"trtserve bound ([\d.]+):(\d+)", line):
                self.url = f"{m.group(1)}:{m.group(2)}"
                self.bound.set()
            if "listening on" in line:
                self.listening.set()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_health_not_serving_while_loading_serving_after_and_not_serving_while_draining(tmp_path):
    write_slow(tmp_path, "slow", batch_ms=5, setup_s=3, late_s=2)
    env = {"TRTSERVE_LOG_FORMAT": "json", "TRTSERVE_LOG_REQUESTS": "1", "TRTSERVE_GRACE_PERIOD": "20"}
    srv = Spawned(tmp_path, env=env)
    try:
        with grpc.insecure_channel(srv.url) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            # Loading (setup takes 3 s): live, not ready, NOT_SERVING, requests UNAVAILABLE.
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == NOT_SERVING
            assert stub.ServerLive(pb.ServerLiveRequest()).live
            assert not stub.ServerReady(pb.ServerReadyRequest()).ready
            assert not stub.ModelReady(pb.ModelReadyRequest(name="slow")).ready
            assert code_of(stub.ModelInfer, build_request("slow", row(2))) == grpc.StatusCode.UNAVAILABLE
            assert srv.listening.wait(60), "".join(srv.lines)
            assert health.Check(health_pb2.HealthCheckRequest()).status == SERVING
            assert stub.ServerReady(pb.ServerReadyRequest()).ready
            # Draining: a 2 s request is in flight when SIGTERM comes.
            slow_call = stub.ModelInfer.future(build_request("slow", row(2, 7.0), request_id="long"))
            time.sleep(0.3)
            srv.proc.send_signal(signal.SIGTERM)
            # NOT_SERVING once the signal is handled (waited for: no bound on how soon).
            deadline = time.monotonic() + 20
            while health.Check(health_pb2.HealthCheckRequest(), timeout=10).status != NOT_SERVING:
                assert time.monotonic() < deadline, "health stayed SERVING after SIGTERM"
                time.sleep(0.01)
            inference = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
            assert health.Check(inference).status == NOT_SERVING
            assert not stub.ServerReady(pb.ServerReadyRequest()).ready
            assert stub.ServerLive(pb.ServerLiveRequest()).live
            assert code_of(stub.ModelInfer, build_request("slow", row(2))) == grpc.StatusCode.UNAVAILABLE
            assert slow_call.result(timeout=20).id == "long"
        assert srv.wait(20) == 0
    finally:
        srv.kill()
    # --log-format json and --log-requests from the environment: every log line is JSON,
    # one of them the request line.
    logged = [json.loads(line) for line in srv.lines if line.startswith("{")]
    assert any(r.get("request_id") == "long" and r.get("status") == "OK" and r.get("model") == "slow" for r in logged)
    assert any(r.get("logger") == "trtserve" and "draining" in r.get("message", "") for r in logged)
    text_format = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")
    assert not [line for line in srv.lines if text_format.match(line)]
