"""Operating trtserve (issue 8): metrics, statistics, health, reflection, graceful drain,
TLS / mutual TLS, bearer-token auth, per-request caps, environment configuration and logs.

In-process servers (``ServerThread``) where a test only talks to the server; real
``trtserve serve`` child processes where it needs signals, start-up or the command line.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from servers import code_of

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import Client, Credentials, build_request
from trtserve.errors import InvalidRequest
from trtserve.protocol import codec
from trtserve.tools.testmodels import config_text, identity, write_model
from trtserve.tools.child_server import ServerProcess

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# A Python model with a known run time: batch_ms per batch (+ row_ms per row); a request whose
# first value is 7 takes late_s more (to overrun its deadline); setup sleeps setup_s (load time).
SLOW = """
    import time


    class Model:
        def setup(self, config):
            p = config.parameters
            self.batch_s = float(p.get("batch_ms", 20)) / 1000
            self.row_s = float(p.get("row_ms", 0)) / 1000
            self.late_s = float(p.get("late_s", 0))
            time.sleep(float(p.get("setup_s", 0)))

        def predict(self, inputs):
            x = inputs["INPUT0"]
            time.sleep(self.batch_s + self.row_s * len(x))
            if (x[:, 0] == 7).any():
                time.sleep(self.late_s)
            return {"OUTPUT0": x}
"""


def write_slow(root: Path, name: str = "slow", *, max_batch_size: int = 8, queue: str = "", **params: float) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(SLOW))
    parameters = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    (root / name / "config.pbtxt").write_text(
        f"""
        name: "{name}" backend: "python" max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        dynamic_batching {{ {queue} }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {parameters}
        """
    )


def write_identity(root: Path, name: str = "ident", extra: str = "dynamic_batching { }") -> None:
    write_model(root, name, identity("FP32", (-1,)), config_text(name, [("INPUT0", "FP32", (-1,))], [("OUTPUT0", "FP32", (-1,))], extra=extra))


def row(n: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, n), value, np.float32)}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


# -- metrics and statistics ------------------------------------------------------------------


@pytest.fixture
def metrics_server(make_server, tmp_path):
    write_identity(tmp_path)
    write_slow(tmp_path, "late", batch_ms=5, late_s=0.4)
    write_slow(tmp_path, "one", max_batch_size=1, batch_ms=300, queue="default_queue_policy { max_queue_size: 1 }")
    return make_server(tmp_path, metrics_port=0)


def test_metrics_after_a_known_workload(metrics_server):
    srv = metrics_server
    stats = srv.repository.get("ident").dispatcher.stats
    lengths = [3, 5, 3, 8, 1, 5, 2, 7, 4, 6]
    with srv.client() as c:
        for n in lengths:
            c.infer("ident", row(n))
        streamed = dict(c.stream_infer("ident", (row(n) for n in lengths)))
        bad = pb.ModelInferRequest(model_name="ident")
        bad.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2]).contents.int_contents.extend([1, 2])
        assert code_of(c.stub.ModelInfer, bad) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(c.stub.ModelInfer, build_request("nope", row(1))) == grpc.StatusCode.NOT_FOUND
        expired = build_request("ident", row(2), timeout_us=1)
        assert code_of(c.stub.ModelInfer, expired) == grpc.StatusCode.DEADLINE_EXCEEDED
        statistics = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="ident")).model_stats[0]
    assert len(streamed) == len(lengths)
    m = scrape(srv.metrics_at())

    ok = 2 * len(lengths)
    assert sample(m, "trtserve_requests_total", model="ident", code="OK") == ok
    assert sample(m, "trtserve_requests_total", model="ident", code="INVALID_ARGUMENT") == 1
    assert sample(m, "trtserve_requests_total", model="ident", code="DEADLINE_EXCEEDED") == 1
    assert sample(m, "trtserve_requests_total", model="_unknown", code="NOT_FOUND") == 1
    assert sample(m, "trtserve_request_duration_seconds_count", model="ident", code="OK") == ok
    assert sample(m, "trtserve_request_duration_seconds_bucket", model="ident", code="OK", le="+Inf") == ok
    assert sample(m, "trtserve_deadline_exceeded_total", model="ident", when="before_run") == 1
    assert sample(m, "trtserve_deadline_exceeded_total", model="ident", when="finished_late") == 0
    # The dispatcher's view: every batch and row (warm-up excluded), and no padding left out.
    assert sample(m, "trtserve_batch_size_rows_count", model="ident") == stats.batches > 0
    assert sample(m, "trtserve_batch_size_rows_sum", model="ident") == stats.rows == ok
    assert sample(m, "trtserve_compute_duration_seconds_count", model="ident") == stats.batches
    real = 2 * sum(lengths)
    elements = sample(m, "trtserve_batch_elements_total", model="ident")
    assert elements - sample(m, "trtserve_padding_elements_total", model="ident") == real
    assert sample(m, "trtserve_padding_ratio", model="ident") == pytest.approx(1 - real / elements)
    assert sample(m, "trtserve_queue_depth", model="ident") == 0
    assert sample(m, "trtserve_slots", model="ident") == 1
    assert sample(m, "trtserve_model_ready", model="ident") == 1
    assert sample(m, "trtserve_slots_unhealthy", model="ident") == 0
    assert sample(m, "trtserve_inflight_requests") == 0
    # The latency model, as the dispatcher sees it: "one" sleeps 300 ms per batch (warm-up rows
    # are 16 long), and the batch cap is the configured max_batch_size.
    assert 0.29 < sample(m, "trtserve_predicted_batch_seconds", model="one", rows="1", length="16") < 0.6
    assert sample(m, "trtserve_batch_cap_rows", model="one") == 1
    assert ("trtserve_arrival_rate_rows", (("model", "ident"),)) in m
    # ModelStatistics carries the same numbers.
    infer = statistics.inference_stats
    assert infer.success.count == ok and infer.success.ns > 0
    assert infer.fail.count == 2  # INVALID_ARGUMENT and DEADLINE_EXCEEDED
    assert statistics.inference_count == stats.rows and statistics.execution_count == stats.batches
    assert sum(b.compute_infer.count for b in statistics.batch_stats) == stats.batches
    assert abs(statistics.last_inference / 1000 - time.time()) < 60
    # Every answered request was queued and ran once: the dispatcher's stats hooks are wired (a
    # count of 0 here means it stopped calling them, and fails, not skips).
    assert sample(m, "trtserve_queue_duration_seconds_count", model="ident") == ok == infer.queue.count
    assert infer.compute_infer.count == ok


def test_queue_full_late_answers_and_busy_slots_are_counted(metrics_server):
    srv = metrics_server
    port = srv.metrics_at()
    scrape(port)  # starts the busy-ratio window
    with srv.client() as c, ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda _: code_of(c.infer, "one", row(2)), range(6)))
        # 7 makes the model overrun the 150 ms the caller allows: DEADLINE_EXCEEDED at the
        # deadline while the batch still runs, counted as finished late.
        assert code_of(c.stub.ModelInfer, build_request("late", row(2, 7.0), timeout_us=150_000)) == grpc.StatusCode.DEADLINE_EXCEEDED
    m = scrape(port)
    rejected = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert rejected >= 1 and codes.count(grpc.StatusCode.OK) == 6 - rejected
    assert sample(m, "trtserve_rejected_total", model="one", reason="queue_full") == rejected
    assert sample(m, "trtserve_requests_total", model="one", code="RESOURCE_EXHAUSTED") == rejected
    assert sample(m, "trtserve_deadline_exceeded_total", model="late", when="finished_late") == 1
    assert sample(m, "trtserve_slot_busy_seconds_total", model="one") >= 0.3 * (6 - rejected) * 0.9
    assert 0 < sample(m, "trtserve_slot_busy_ratio", model="one") <= 1


def test_separate_servers_have_separate_registries(make_server, tmp_path):
    write_identity(tmp_path)
    a, b = make_server(tmp_path, metrics_port=0), make_server(tmp_path, metrics_port=0)
    with a.client() as c:
        c.infer("ident", row(3))
    assert sample(scrape(a.metrics_at()), "trtserve_requests_total", model="ident", code="OK") == 1
    assert sample(scrape(b.metrics_at()), "trtserve_requests_total", model="ident", code="OK") == 0


def test_request_log_line_has_id_model_status_and_duration(server, caplog):
    caplog.set_level(logging.DEBUG, logger="trtserve.requests")
    with server.client() as c:
        c.stub.ModelInfer(build_request("identity_fp32", row(3), request_id="req-42"))
    lines = [r for r in caplog.records if r.name == "trtserve.requests" and getattr(r, "request_id", "") == "req-42"]
    assert len(lines) == 1
    assert (lines[0].model, lines[0].status) == ("identity_fp32", "OK") and lines[0].duration_ms > 0


def test_json_log_format_carries_the_extra_fields():
    from trtserve.logs import JsonFormatter

    record = logging.LogRecord("trtserve.requests", logging.DEBUG, __file__, 1, "OK %s", ("m",), None)
    record.request_id, record.model, record.status, record.duration_ms = "r1", "m", "OK", 1.5
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "OK m" and out["level"] == "DEBUG" and out["logger"] == "trtserve.requests"
    assert (out["request_id"], out["model"], out["status"], out["duration_ms"]) == ("r1", "m", "OK", 1.5)


# -- health and reflection -------------------------------------------------------------------


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
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    assert {"ModelInfer", "ModelStreamInfer", "ModelStatistics"} <= set(described.methods_by_name)


class Spawned:
    """``trtserve serve`` as a child process whose port is known as soon as it is bound
    (before the models load), with its output lines collected."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(root), "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
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
            time.sleep(0.3)
            assert health.Check(health_pb2.HealthCheckRequest()).status == NOT_SERVING
            assert health.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")).status == NOT_SERVING
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


# -- graceful drain (C25) ----------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_admitted(metrics_port: int, model: str, count: int, timeout: float = 30.0) -> None:
    """Until the server has admitted ``count`` requests of ``model`` (answered or in progress)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = await asyncio.to_thread(scrape, metrics_port)
        answered = sum(v for (name, labels), v in m.items() if name == "trtserve_requests_total" and ("model", model) in labels)
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
        second = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        exit_code = srv.proc.wait(10)
        assert time.monotonic() - second < 1.5
        for f in futures:
            f.cancel()
        client.close()
    assert exit_code == 1


# -- TLS, mutual TLS and auth --------------------------------------------------------------------


def _certificates() -> dict[str, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    def cert(name, key, issuer, issuer_key, *, ca=False, usage=None, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    out: dict[str, bytes] = {}
    cas = {}
    for ca_name in ("ca", "other_ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"trtserve test {ca_name}")])
        cas[ca_name] = (key, name)
        out[ca_name] = cert(f"trtserve test {ca_name}", key, name, key, ca=True).public_bytes(serialization.Encoding.PEM)
    ca_key, ca_name = cas["ca"]
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for who, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        out[f"{who}_key"] = pem_key(key)
        out[f"{who}_cert"] = cert(who, key, ca_name, ca_key, usage=usage, san=san if who == "server" else None).public_bytes(serialization.Encoding.PEM)
    return out


@pytest.fixture(scope="module")
def certs():
    return _certificates()


def live(url: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = grpc.secure_channel(url, credentials) if credentials else grpc.insecure_channel(url)
    with channel:
        return code_of(pb_grpc.GRPCInferenceServiceStub(channel).ServerLive, pb.ServerLiveRequest(), timeout=5)


def test_tls_server_needs_a_client_that_trusts_its_ca(make_server, tmp_path, certs):
    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path)
    srv = make_server(tmp_path, tls=TlsConfig(certs["server_cert"], certs["server_key"]))
    assert live(srv.url, grpc.ssl_channel_credentials(root_certificates=certs["ca"])) == grpc.StatusCode.OK
    assert live(srv.url, grpc.ssl_channel_credentials(root_certificates=certs["other_ca"])) == grpc.StatusCode.UNAVAILABLE
    assert live(srv.url, None) == grpc.StatusCode.UNAVAILABLE  # plaintext against TLS


def test_mutual_tls_refuses_a_client_without_a_certificate(make_server, tmp_path, certs):
    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path)
    srv = make_server(tmp_path, tls=TlsConfig(certs["server_cert"], certs["server_key"], client_ca=certs["ca"]))
    with_cert = grpc.ssl_channel_credentials(certs["ca"], private_key=certs["client_key"], certificate_chain=certs["client_cert"])
    assert live(srv.url, with_cert) == grpc.StatusCode.OK
    assert live(srv.url, grpc.ssl_channel_credentials(root_certificates=certs["ca"])) == grpc.StatusCode.UNAVAILABLE
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    # trtserve.client over mutual TLS: values back exact, streams too.
    mutual = Credentials(root_certificates=certs["ca"], private_key=certs["client_key"], certificate_chain=certs["client_cert"])
    with Client(srv.url, credentials=mutual) as c:
        assert c.infer("ident", {"INPUT0": x}, timeout=10)["OUTPUT0"].tolist() == x.tolist()
        assert [out["OUTPUT0"].tolist() for _, out in c.stream_infer("ident", [{"INPUT0": x}])] == [x.tolist()]
    with Client(srv.url, credentials=Credentials(root_certificates=certs["ca"])) as c:  # no client certificate
        assert code_of(c.infer, "ident", {"INPUT0": x}, timeout=10) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("protect_health", [False, True])
def test_bearer_token_is_required_health_and_reflection_configurable(make_server, tmp_path, protect_health):
    write_identity(tmp_path)
    srv = make_server(tmp_path, auth_token="s3cret", auth_health=protect_health)
    good = [("authorization", "Bearer s3cret")]
    with grpc.insecure_channel(srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = build_request("ident", row(3))
        assert code_of(stub.ModelInfer, request) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(stub.ModelInfer, request, metadata=[("authorization", "Bearer wrong")]) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(stub.ModelInfer, request, metadata=[("authorization", "s3cret")]) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(stub.ModelInfer, request, metadata=good) == grpc.StatusCode.OK
        assert code_of(stub.ServerReady, pb.ServerReadyRequest()) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ModelStreamInfer(iter([request])))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(list(stub.ModelStreamInfer(iter([request]), metadata=good))) == 1
        check = health_pb2_grpc.HealthStub(channel).Check
        expected = grpc.StatusCode.UNAUTHENTICATED if protect_health else grpc.StatusCode.OK
        assert code_of(check, health_pb2.HealthCheckRequest()) == expected
        assert code_of(check, health_pb2.HealthCheckRequest(), metadata=good) == grpc.StatusCode.OK
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo
        list_services = reflection_pb2.ServerReflectionRequest(list_services="")
        assert code_of(lambda: list(reflect(iter([list_services])))) == expected
    # trtserve.client sends the token on every call when given one.
    with Client(srv.url, credentials=Credentials(token="s3cret")) as c:
        assert c.is_ready() and c.is_ready("ident")
        assert c.infer("ident", row(3), timeout=10)["OUTPUT0"].shape == (1, 3)
        assert len(list(c.stream_infer("ident", [row(2), row(3)]))) == 2
    with Client(srv.url, credentials=Credentials(token="wrong")) as c:
        assert code_of(c.infer, "ident", row(3), timeout=10) == grpc.StatusCode.UNAUTHENTICATED


def test_bulk_job_over_mutual_tls_with_a_token(make_server, tmp_path, certs):
    """``trtserve bulk --tls-ca --tls-cert --tls-key --auth-token-file`` against a server that
    requires all of them: every row comes back exact."""
    import pyarrow.parquet as pq

    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path / "repo")
    srv = make_server(tmp_path / "repo", tls=TlsConfig(certs["server_cert"], certs["server_key"], client_ca=certs["ca"]),
                      auth_token="s3cret")
    files = {}
    for name in ("ca", "client_cert", "client_key"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(certs[name])
    (tmp_path / "token").write_text("s3cret\n")
    rows = [{"id": f"r{i}", "x": [float(i), i + 0.5, -i, 2.0 * i]} for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "-m", "trtserve", "bulk", "--input", tmp_path / "in.jsonl", "--model", "ident",
               "--input-column", "INPUT0=x", "--endpoint", srv.url, "--output", tmp_path / "out.parquet",
               "--tls-ca", files["ca"], "--tls-cert", files["client_cert"], "--tls-key", files["client_key"],
               "--auth-token-file", tmp_path / "token", "--no-progress"]
    done = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = pq.read_table(tmp_path / "out.parquet").to_pydict()
    got = dict(zip(table["id"], table["OUTPUT0"]))
    assert got == {r["id"]: pytest.approx(r["x"]) for r in rows}
    half = [str(a) for a in command if str(a) != str(files["client_key"]) and a != "--tls-key"]
    refused = subprocess.run(half, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--tls-cert and --tls-key go together" in refused.stderr
    # A wrong token stops the job at once (retrying cannot help), naming the status.
    (tmp_path / "wrong").write_text("nope\nsecond line\n")  # only the first line is the token
    wrong = [str(a) if a != tmp_path / "token" else str(tmp_path / "wrong") for a in command]
    t0 = time.monotonic()
    stopped = subprocess.run(wrong + ["--output", str(tmp_path / "other.parquet")], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 1 and "UNAUTHENTICATED" in stopped.stderr, stopped.stderr
    assert time.monotonic() - t0 < 60  # not the 300 s stall timeout
    (tmp_path / "empty").write_text("")
    empty = [str(a) if a != tmp_path / "token" else str(tmp_path / "empty") for a in command]
    refused = subprocess.run(empty, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "is empty" in refused.stderr


def test_bulk_job_stops_on_sigterm_while_no_server_answers(tmp_path):
    """While the bulk job waits for a server to come up (retrying UNAVAILABLE), SIGTERM stops it
    at once with exit code 1, not after the stall timeout."""
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "x": [1.0]}) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "trtserve", "bulk", "--input", str(tmp_path / "in.jsonl"),
                             "--model", "ident", "--input-column", "INPUT0=x", "--endpoint", f"127.0.0.1:{free_port()}",
                             "--output", str(tmp_path / "out.parquet"), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "retrying" not in line:  # it is in the discovery loop
            assert time.monotonic() < deadline
            line = proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "interrupted by SIGTERM" in err
    assert "never retrieved" not in err


def test_credentials_refuse_a_token_that_cannot_be_a_header(tmp_path):
    for bad in ("", "two words", "line\nbreak", "caf\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII"):
            Credentials(token=bad)
    (tmp_path / "t").write_text("  s3cret  \nignored\n")
    assert Credentials.from_files(token_file=tmp_path / "t").token == "s3cret"


# -- per-request caps -------------------------------------------------------------------------


def raw(model: str, datatype: str, shape: list[int], data: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


FORGED = {
    "shape [2^31, 2^31]": ("identity_fp32", "FP32", [2**31, 2**31], b"\0" * 8),
    "BYTES length past the message": ("echo_bytes", "BYTES", [1, 1], b"\xff\xff\xff\x7f" + b"abc"),
    "BYTES count past the message": ("echo_bytes", "BYTES", [1, 2**28], b"\x01\0\0\0a" * 2),
    "BYTES typed [2^31, 2^31]": ("echo_bytes", "BYTES", [2**31, 2**31], b""),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_sizes_are_refused_without_allocating(server, case):
    model, datatype, shape, data = FORGED[case]
    request = raw(model, datatype, shape, data)
    if not data:
        del request.raw_input_contents[:]
        request.inputs[0].contents.bytes_contents.append(b"x")
    spec = server.repository.get(model).spec
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as err:
            codec.decode_inputs(request, spec, max_elements=512 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "INPUT0" in str(err.value)
    assert peak < 1 << 20, f"{peak} bytes allocated while refusing"
    with server.client() as c:  # and over the wire: INVALID_ARGUMENT, then the server still serves
        assert code_of(c.stub.ModelInfer, request) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(c.infer, "identity_fp32", row(3)) == grpc.StatusCode.OK


def test_max_request_elements_counts_every_input_of_the_request(make_server, tmp_path):
    write_identity(tmp_path)
    srv = make_server(tmp_path, max_request_elements=64)
    with srv.client() as c:
        assert code_of(c.infer, "ident", {"INPUT0": np.ones((2, 32), np.float32)}) == grpc.StatusCode.OK
        with pytest.raises(grpc.RpcError) as err:
            c.infer("ident", {"INPUT0": np.ones((1, 65), np.float32)})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "65 elements" in err.value.details() and "64" in err.value.details()
    from trtserve.repository import load_spec

    (tmp_path / "pair" / "1").mkdir(parents=True)
    (tmp_path / "pair" / "config.pbtxt").write_text(
        'name: "pair" platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ] '
        'output [ { name: "C" data_type: TYPE_FP32 dims: [ -1 ] } ]'
    )
    two = pb.ModelInferRequest(model_name="pair")
    for name in "AB":
        two.inputs.add(name=name, datatype="FP32", shape=[1, 40])
        two.raw_input_contents.append(b"\0" * 160)
    with pytest.raises(InvalidRequest, match="input 'B'.* 80 elements"):
        codec.decode_inputs(two, load_spec(tmp_path / "pair"), max_elements=64)


# -- configuration ------------------------------------------------------------------------------


def test_every_serve_option_is_an_environment_variable(monkeypatch, capsys):
    from trtserve.cli import build_parser

    monkeypatch.setenv("TRTSERVE_PORT", "1234")
    monkeypatch.setenv("TRTSERVE_GRACE_PERIOD", "2.5")
    monkeypatch.setenv("TRTSERVE_AUTH_HEALTH", "true")
    monkeypatch.setenv("TRTSERVE_METRICS_PORT", "9100")
    monkeypatch.setenv("TRTSERVE_LOG_FORMAT", "json")
    monkeypatch.setenv("TRTSERVE_MODEL_REPOSITORY", "/models")
    args = build_parser().parse_args(["serve"])
    assert (args.port, args.grace_period, args.auth_health, args.metrics_port) == (1234, 2.5, True, 9100)
    assert (args.log_format, args.model_repository) == ("json", Path("/models"))
    assert build_parser().parse_args(["serve", "--port", "7"]).port == 7  # the flag wins
    monkeypatch.setenv("TRTSERVE_AUTH_HEALTH", "maybe")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])
    monkeypatch.delenv("TRTSERVE_AUTH_HEALTH")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    flags = set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--help"}
    assert {"--tls-cert", "--tls-key", "--tls-ca", "--auth-token-file", "--metrics-port", "--max-request-elements"} <= flags
    for flag in flags:
        assert f"TRTSERVE_{flag[2:].upper().replace('-', '_')}" in text.replace("\n", " ").replace("  ", ""), flag


def test_serve_refuses_incomplete_tls_or_auth_flags_with_one_sentence(tmp_path):
    write_identity(tmp_path)
    cases = [
        (["--tls-cert", str(tmp_path / "c.pem")], "--tls-cert and --tls-key go together"),
        (["--auth-token-file", str(tmp_path / "missing")], "cannot read --auth-token-file"),
        (["--auth-health"], "--auth-health needs a token"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRTSERVE_AUTH_TOKEN"}
    for extra, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(tmp_path), "--port", "0", *extra],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert done.returncode == 2 and message in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr


def test_token_from_the_environment(tmp_path):
    write_identity(tmp_path)
    env = {**os.environ, "TRTSERVE_AUTH_TOKEN": "from-env"}
    env.pop("TRTSERVE_AUTH_TOKEN_FILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(tmp_path), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if m := re.search(r"listening on ([\d.]+:\d+)", line):
                url = m.group(1)
                break
        assert url
        with grpc.insecure_channel(url) as channel:
            ready = pb_grpc.GRPCInferenceServiceStub(channel).ServerReady
            assert code_of(ready, pb.ServerReadyRequest()) == grpc.StatusCode.UNAUTHENTICATED
            assert ready(pb.ServerReadyRequest(), metadata=[("authorization", "Bearer from-env")]).ready
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
