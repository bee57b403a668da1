"""C29: a streaming client that goes away with a backlog queued takes its backlog with it; a
half-close is not a cancel.

A ``trtserve serve --metrics-port`` child process with the gate model ``gated`` (batches of up
to 4 rows, one slot; it logs the row ids of every batch it starts, then holds the batch until
the test opens the gate), so what runs is decided by events, not by how fast a busy machine
is:

(a) one stream sends 120 messages; the first runs at once (an idle slot never waits) and is
    held, the other 119 queue. The client cancels the stream (still open for writing, or
    after a half-close). The queue empties; a unary
    request then runs, OK, and nothing of the backlog ever starts (the queue stays empty, the
    slot idle): only the batch that was running when the client went away executed;
(b) the same from a child process that is SIGKILLed, so the TCP connection drops without a
    gRPC cancel;
(c) 40 messages, then a half-close (no cancel) while 39 of them are still queued: all 40 are
    answered once, each ran once, then the stream ends OK.

And, under the ``timing`` marker, the case's own numbers: 300 ms per batch of up to 4 rows, the
stream cancelled 0.5 s after it starts sending; the unary request is OK within about two batch
times and at most 8 of the 120 rows ran.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest
from casekit import error_code, gate_batches, row, wait_for, write_gate
from prometheus_client.parser import text_string_to_metric_families

from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess

SERVICE = Path(__file__).resolve().parents[2] / "service"
BACKLOG = 120
UNARY_ID = 500.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gated:
    """The server, its metrics port, and the gate model's log and gate files."""

    def __init__(self, srv: ServerProcess, port: int, root: Path) -> None:
        self.srv, self.port, self.root = srv, port, root
        self.log, self.gate = root / "gated.log", root / "gated.gate"

    def reset(self) -> None:
        """Gate closed, log empty, nothing queued or running."""
        self.gate.touch()
        assert wait_for(lambda: self.metric("trtserve_queue_depth", "gated") == 0
                        and self.metric("trtserve_slots_busy", "gated") == 0, 60)
        self.gate.unlink()
        self.log.unlink(missing_ok=True)

    def metric(self, name: str, model: str) -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and s.labels.get("model") == model:
                    return s.value
        return None

    def ran(self) -> list[float]:
        """Every row id the gate model started, in order."""
        return [i for batch in gate_batches(self.log) for i in batch]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    root = tmp_path_factory.mktemp("c29")
    models = root / "models"
    write_gate(models, "gated", root / "gated.log", root / "gated.gate", max_batch_size=4)
    # The timing test's model: the case's 300 ms per batch, its gate always open.
    (root / "open.gate").touch()
    write_gate(models, "timed", root / "timed.log", root / "open.gate", max_batch_size=4, batch_ms=300)
    port = free_port()
    with ServerProcess(models, "--metrics-port", str(port)) as srv:
        yield Gated(srv, port, root)


def messages(count: int, model: str = "gated", done: threading.Event | None = None,
             hold: threading.Event | None = None):
    """``count`` one-row messages with ids 1..count; sets ``done`` once the last is written.
    With ``hold`` the stream is not half-closed until ``hold`` is set."""
    for i in range(1, count + 1):
        yield build_request(model, row(float(i)), request_id=str(i))
    if done is not None:
        done.set()
    if hold is not None:
        hold.wait()


def first_batch(g: Gated) -> list[float] | None:
    """The rows of the batch held at the gate once everything else waits behind it, or None
    before then. An idle slot never waits, so the first batch starts with the first message;
    messages that reached the engine core together with it share it (up to 4 rows)."""
    ran = g.ran()
    in_order = ran == [float(i) for i in range(1, len(ran) + 1)]
    if ran and in_order and g.metric("trtserve_queue_depth", "gated") == BACKLOG - len(ran):
        return ran
    return None


def backlog_queued(g: Gated) -> bool:
    """The first batch runs (held at the gate) and the rest of the 120 wait behind it."""
    return first_batch(g) is not None


def unary_after_the_client_left(g: Gated, stub) -> None:
    """The backlog leaves the queue; a new request runs and is OK; nothing but the first
    batch and it ever ran."""
    first = g.ran()
    assert wait_for(lambda: g.metric("trtserve_queue_depth", "gated") == 0, 30)
    result: list = []
    request = build_request("gated", row(UNARY_ID))
    unary = threading.Thread(target=lambda: result.append(stub.ModelInfer(request, timeout=60)))
    unary.start()
    assert wait_for(lambda: g.metric("trtserve_queue_depth", "gated") == 1, 30)  # behind the held batch
    g.gate.touch()
    unary.join(60)
    assert len(result) == 1  # OK (an error would have ended the thread without a result)
    assert g.ran() == [*first, UNARY_ID]  # the batch running when the client went away, then the new request


@pytest.mark.parametrize("half_closed", [False, True], ids=["open", "half-closed"])
def test_a_cancelled_stream_takes_its_queued_backlog_with_it(gated, half_closed):
    """C29(a): cancel with 119 queued (the stream still open for writing, or already
    half-closed); only the running batch executes, the backlog never does."""
    g = gated
    g.reset()
    keep_open = None if half_closed else threading.Event()
    with grpc.insecure_channel(g.srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(messages(BACKLOG, hold=keep_open), timeout=120)
        try:
            assert wait_for(lambda: backlog_queued(g), 30), (
                g.ran(), g.metric("trtserve_queue_depth", "gated"), g.metric("trtserve_slots_busy", "gated"))
            call.cancel()
        finally:
            if keep_open is not None:
                keep_open.set()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
        unary_after_the_client_left(g, stub)
        assert wait_for(lambda: g.metric("trtserve_slots_busy", "gated") == 0, 30)
    assert g.ran()[-1] == UNARY_ID and len(g.ran()) <= 5


CHILD = """
import sys
import threading

import grpc
import numpy as np

from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request

stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(sys.argv[1]))


def requests():
    for i in range(1, int(sys.argv[2]) + 1):
        yield build_request("gated", {"INPUT0": np.full((1, 4), float(i), np.float32)}, request_id=str(i))
    threading.Event().wait()  # never half-closes: the stream is open when the process dies


for _ in stub.ModelStreamInfer(requests()):
    pass
"""


def test_a_killed_client_process_takes_its_queued_backlog_with_it(gated):
    """C29(b): the client process is SIGKILLed (the connection drops, no gRPC cancel)."""
    g = gated
    g.reset()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SERVICE), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", CHILD, g.srv.url, str(BACKLOG)], env=env)
    try:
        assert wait_for(lambda: backlog_queued(g), 60)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with grpc.insecure_channel(g.srv.url) as channel:
        unary_after_the_client_left(g, pb_grpc.GRPCInferenceServiceStub(channel))
    assert g.ran()[-1] == UNARY_ID and len(g.ran()) <= 5


def test_a_half_close_with_a_backlog_is_answered_in_full_then_ends_ok(gated):
    """C29(c): half-close while 39 of 40 wait; every message is answered once, then OK."""
    g = gated
    g.reset()
    written = threading.Event()
    with grpc.insecure_channel(g.srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(messages(40, done=written), timeout=120)
        assert written.wait(30)  # the client has half-closed
        assert wait_for(lambda: (ran := g.ran()) and g.metric("trtserve_queue_depth", "gated") == 40 - len(ran), 30)
        g.gate.touch()
        answers = list(call)
        assert call.code() == grpc.StatusCode.OK
    assert Counter(m.infer_response.id for m in answers) == Counter(str(i) for i in range(1, 41))
    assert all(error_code(m) == "OK" for m in answers)
    assert sorted(g.ran()) == [float(i) for i in range(1, 41)]  # each ran once


@pytest.mark.timing
def test_after_a_cancelled_backlog_a_new_request_is_answered_within_two_batch_times(gated):
    """C29(a) with the case's numbers: 300 ms batches, the stream cancelled 0.5 s after it
    starts; the unary request is OK within about two batch times, at most 8 rows ran."""
    g = gated
    log = g.root / "timed.log"
    log.unlink(missing_ok=True)
    with grpc.insecure_channel(g.srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(messages(BACKLOG, "timed"), timeout=120)
        time.sleep(0.5)
        call.cancel()
        start = time.monotonic()
        stub.ModelInfer(build_request("timed", row(UNARY_ID)), timeout=10)
        took = time.monotonic() - start
        time.sleep(1.0)  # anything of the backlog that would still start, starts now
    ran = [i for batch in gate_batches(log) for i in batch]
    backlog_ran = [i for i in ran if i != UNARY_ID]
    print(f"\nC29: unary OK after {took * 1e3:.0f} ms; {len(backlog_ran)} of {BACKLOG} backlog rows ran")
    assert took < 2 * 0.3 + 0.2
    assert len(backlog_ran) <= 8 and ran[-1] == UNARY_ID
