"""C37: idle streams and health Watch calls do not hold up a graceful shutdown.

A ``trtserve serve`` child process with the gate model ``gated`` (batches of up to 4 rows, one
slot; it logs every batch it starts and holds it until the test opens the gate):

* an idle stream A with one answered message, never half-closed;
* a unary request U running (held at the gate), and a busy stream B with 12 messages queued
  behind it, never half-closed;
* with and without a health Watch call open.

SIGTERM; once the drain has begun (ServerReady false), a new message on A, a new message on B
and a new unary request; then the gate opens. Expected: U and B's 12 are OK, then B ends OK;
the new ones are UNAVAILABLE (A's, if A is still open to read it) and never run; A ends with a
status while U and B are still held; the Watch call sees NOT_SERVING and ends; the process
exits 0 after the last answer, not at the end of its grace (600 s here, so the difference
cannot be the machine's load).

Under the ``timing`` marker, the case's numbers: 300 ms per batch, ``--grace-period 20``, the
new calls 0.3 s after SIGTERM; A ends within a second of the signal and the process exits
within a few seconds of the last answer (an open Watch call costs the server's final stop
window, ``FINAL_STOP_S`` = 5 s: gRPC's stop waits that long for calls that never end).
"""

from __future__ import annotations

import queue
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from casekit import error_code, gate_batches, row, wait_for, write_gate
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
A1, A2, U, U2, B_FIRST, B_LATE = 1.0, 2.0, 200.0, 400.0, 301, 313.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def queue_depth(port: int, model: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "trtserve_queue_depth" and s.labels.get("model") == model:
                return s.value
    return None


class Stream:
    """A stream fed from a queue (never half-closed unless :meth:`half_close`), read by a thread."""

    def __init__(self, stub) -> None:
        self.outbox: queue.Queue = queue.Queue()
        self.messages: list[pb.ModelStreamInferResponse] = []
        self.code: grpc.StatusCode | None = None
        self.ended = threading.Event()
        self.ended_at = 0.0
        self.call = stub.ModelStreamInfer(iter(self.outbox.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, rid: float, model: str = "gated") -> None:
        self.outbox.put(build_request(model, row(rid), request_id=repr(rid)))

    def half_close(self) -> None:
        self.outbox.put(None)

    def answers(self) -> dict[str, str]:
        return {m.infer_response.id: error_code(m) for m in self.messages}

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.append(message)
            self.code = self.call.code()
        except grpc.RpcError as exc:
            self.code = exc.code()
        self.ended_at = time.monotonic()
        self.ended.set()


class Watch:
    """A health Watch call read by a thread: the statuses it saw, and whether it ended."""

    def __init__(self, channel) -> None:
        self.statuses: list[int] = []
        self.ended = threading.Event()
        self.call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.statuses.append(response.status)
        except grpc.RpcError:
            pass
        self.ended.set()


def unary(stub, rid: float, model: str = "gated") -> str:
    try:
        stub.ModelInfer(build_request(model, row(rid)), timeout=120)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


@pytest.mark.parametrize("watch", [False, True], ids=["streams", "streams and a Watch call"])
def test_idle_and_busy_streams_end_and_the_process_exits_after_the_last_answer(tmp_path, watch):
    """C37: the drain answers what was admitted, refuses what came after, ends every stream
    and Watch call, and exits 0 without waiting out its grace."""
    log, gate = tmp_path / "gated.log", tmp_path / "gated.gate"
    gate.touch()
    write_gate(tmp_path / "models", "gated", log, gate, max_batch_size=4)
    port = free_port()
    with ServerProcess(tmp_path / "models", "--grace-period", "600", "--metrics-port", str(port)) as srv, \
            grpc.insecure_channel(srv.url) as channel, ThreadPoolExecutor(2) as pool:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        a, b = Stream(stub), Stream(stub)
        a.send(A1)
        assert wait_for(lambda: a.answers() == {repr(A1): "OK"}, 60)
        gate.unlink()  # the next batch holds
        running = pool.submit(unary, stub, U)
        assert wait_for(lambda: gate_batches(log)[-1:] == [[U]], 60)
        for i in range(12):
            b.send(float(B_FIRST + i))
        assert wait_for(lambda: queue_depth(port, "gated") == 12, 60)
        watcher = Watch(channel) if watch else None
        if watcher is not None:
            assert wait_for(lambda: watcher.statuses[:1] == [SERVING], 60)

        srv.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: not stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready, 60)
        if watcher is not None:
            assert wait_for(lambda: NOT_SERVING in watcher.statuses, 60)
        a.send(A2)
        b.send(B_LATE)
        assert unary(stub, U2) == "UNAVAILABLE"
        # A had nothing left to answer: it ends at once (before or after its new message,
        # which, if read, is refused).
        assert a.ended.wait(60) and a.code is not None
        assert a.answers() in ({repr(A1): "OK"}, {repr(A1): "OK", repr(A2): "UNAVAILABLE"})
        assert wait_for(lambda: b.answers().get(repr(B_LATE)) == "UNAVAILABLE", 60)
        assert not b.ended.is_set() and srv.proc.poll() is None  # B's 12 are still to come

        gate.touch()
        assert running.result(120) == "OK"
        assert b.ended.wait(120) and b.code == grpc.StatusCode.OK
        assert b.answers() == {**{repr(float(B_FIRST + i)): "OK" for i in range(12)}, repr(B_LATE): "UNAVAILABLE"}
        # Not held open for the grace (600 s): it exits once the last answer is written.
        assert srv.proc.wait(60) == 0
        if watcher is not None:
            assert watcher.ended.wait(10)
            assert watcher.statuses[0] == SERVING and watcher.statuses[-1] == NOT_SERVING
    ran = [i for batch in gate_batches(log) for i in batch]
    assert sorted(ran) == sorted([A1, U, *(float(B_FIRST + i) for i in range(12))])  # nothing sent after SIGTERM ran


@pytest.mark.timing
@pytest.mark.parametrize("watch", [False, True], ids=["streams", "streams and a Watch call"])
def test_the_case_numbers_idle_stream_ends_promptly_and_exit_follows_the_last_answer(tmp_path, watch):
    """C37 with the case's numbers: 300 ms batches, grace 20 s, new calls 0.3 s after SIGTERM."""
    log, gate = tmp_path / "timed.log", tmp_path / "open.gate"
    gate.touch()
    write_gate(tmp_path / "models", "timed", log, gate, max_batch_size=4, batch_ms=300)
    with ServerProcess(tmp_path / "models", "--grace-period", "20") as srv, \
            grpc.insecure_channel(srv.url) as channel, ThreadPoolExecutor(2) as pool:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        a, b = Stream(stub), Stream(stub)
        a.send(A1, "timed")
        assert wait_for(lambda: a.answers() == {repr(A1): "OK"}, 30)
        watcher = Watch(channel) if watch else None
        running = pool.submit(unary, stub, U, "timed")
        time.sleep(0.05)
        for i in range(12):
            b.send(float(B_FIRST + i), "timed")
        time.sleep(0.1)
        srv.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        time.sleep(0.3)
        a.send(A2, "timed")
        b.send(B_LATE, "timed")
        assert unary(stub, U2, "timed") == "UNAVAILABLE"
        assert running.result(30) == "OK"
        assert b.ended.wait(30) and b.code == grpc.StatusCode.OK
        last_answer = b.ended_at
        exit_code = srv.proc.wait(30)
        exited = time.monotonic()
        assert a.ended.wait(1)
    print(f"\nC37: A ended {a.ended_at - sigterm:.2f} s after SIGTERM; "
          f"B's last answer at {last_answer - sigterm:.2f} s; "
          f"exit at {exited - sigterm:.2f} s (grace 20 s)")
    assert exit_code == 0
    assert a.ended_at - sigterm < 1.0
    assert exited - last_answer < (6.0 if watch else 3.0)
    if watcher is not None:
        assert watcher.ended.wait(5) and NOT_SERVING in watcher.statuses
