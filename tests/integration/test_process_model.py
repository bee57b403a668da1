"""The process tree of ``trtserve serve --frontends 2``: one engine core, two front ends on one
port, a supervisor; what crosses between them and what happens when one of them dies.

Real ``trtserve serve`` child processes on 127.0.0.1 with the gate model (it logs the row ids
of every batch it starts and holds the batch until the test opens its gate), so what runs is
decided by events, not by how busy the machine is.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reliability.casekit import gate_batches, wait_for, write_gate
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.testing import ServerProcess

CONNECTIONS = 24  # the kernel hashes each connection to a front end: all 24 on one has p = 2**-23
# gRPC shares one connection between channels of equal target and options (its global
# subchannel pool): each channel here gets its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def channel(url: str) -> grpc.Channel:
    """A channel with a TCP connection of its own."""
    return grpc.insecure_channel(url, options=OWN_CONNECTION)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def pids(srv: ServerProcess) -> dict[str, int]:
    """The engine core's and each front end's pid, from the supervisor's log lines."""
    out: dict[str, int] = {}
    for line in list(srv.output):
        if m := re.search(r"engine core started \(pid (\d+)\)", line):
            out["engine"] = int(m.group(1))
        if m := re.search(r"front end (\d+) started on port \d+ \(pid (\d+)\)", line):
            out[f"frontend{m.group(1)}"] = int(m.group(2))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def request(rid: float) -> pb.ModelInferRequest:
    return build_request("gated", {"INPUT0": np.full((1, 4), rid, np.float32)}, request_id=str(rid))


class Tree:
    """A running server with the gate model: its url, metrics port, gate and log."""

    def __init__(self, srv: ServerProcess, metrics: int, root: Path) -> None:
        self.srv, self.metrics, self.log, self.gate = srv, metrics, root / "gated.log", root / "gated.gate"

    def metric(self, name: str, **labels: str) -> float:
        return scrape(self.metrics).get((name, tuple(sorted(labels.items()))), 0.0)

    def ran(self) -> list[float]:
        return [i for batch in gate_batches(self.log) for i in batch]


def start(tmp_path: Path, *extra: str) -> tuple[ServerProcess, Tree]:
    models = tmp_path / "models"
    write_gate(models, "gated", tmp_path / "gated.log", tmp_path / "gated.gate", max_batch_size=4)
    metrics = free_port()
    srv = ServerProcess(models, "--frontends", "2", "--metrics-port", str(metrics), *extra).__enter__()
    return srv, Tree(srv, metrics, tmp_path)


@pytest.fixture
def tree(tmp_path):
    srv, t = start(tmp_path)
    (tmp_path / "gated.gate").touch()  # open unless a test closes it
    yield t
    (tmp_path / "gated.gate").touch()
    srv.stop()


def test_two_front_ends_share_one_port_and_the_server_counts_as_one(tree):
    """Connections spread over both front ends; requests_total, ModelStatistics and the
    per-front-end counters add up to what the clients sent."""
    channels = [channel(tree.srv.url) for _ in range(CONNECTIONS)]
    try:
        for k, conn in enumerate(channels):
            stub = pb_grpc.GRPCInferenceServiceStub(conn)
            for j in range(3):
                stub.ModelInfer(request(k * 10 + j + 1), timeout=30)
        sent = 3 * CONNECTIONS
        stub = pb_grpc.GRPCInferenceServiceStub(channels[0])

        def successes() -> int:
            stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="gated"), timeout=30)
            return stats.model_stats[0].inference_stats.success.count

        # The asking front end's own records go before its query; the other front end's follow
        # on its next loop turn, which a loaded machine may delay past the query.
        assert wait_for(lambda: successes() == sent, 10)
    finally:
        for conn in channels:
            conn.close()
    assert wait_for(lambda: tree.metric("trtserve_requests_total", model="gated", code="OK") == sent, 10)
    per_frontend = [tree.metric("trtserve_frontend_requests_total", frontend=str(i)) for i in (0, 1)]
    assert sum(per_frontend) == sent and all(n > 0 for n in per_frontend), per_frontend
    assert tree.metric("trtserve_inflight_requests") == 0


def test_a_cancelled_call_leaves_the_engine_core_queue_and_never_runs(tree):
    """Cancellation crosses the process boundary: a unary call cancelled while its rows wait
    in the engine core's queue is taken out at once; its rows never run."""
    tree.gate.unlink(missing_ok=True)
    conn = channel(tree.srv.url)
    stub = pb_grpc.GRPCInferenceServiceStub(conn)
    try:
        first = stub.ModelInfer.future(request(1.0), timeout=60)
        assert wait_for(lambda: tree.ran() == [1.0], 30)  # held at the gate
        doomed = [stub.ModelInfer.future(request(100.0 + i), timeout=60) for i in range(3)]
        assert wait_for(lambda: tree.metric("trtserve_queue_depth", model="gated", version="1") == 3, 30)
        for call in doomed:
            call.cancel()
        assert wait_for(lambda: tree.metric("trtserve_queue_depth", model="gated", version="1") == 0, 30)
        tree.gate.touch()
        first.result(timeout=30)
        stub.ModelInfer(request(2.0), timeout=30)
    finally:
        tree.gate.touch()
        conn.close()
    assert tree.ran() == [1.0, 2.0]  # none of the cancelled rows ran


def test_a_front_end_killed_mid_stream_is_restarted_and_the_other_is_unaffected(tmp_path):
    """SIGKILL one front end while streams run on both: the streams on it fail UNAVAILABLE,
    the others finish OK, the supervisor starts a new front end on the same port, and the
    engine core drops the dead one's queued rows."""
    srv, t = start(tmp_path)
    try:
        procs = pids(srv)
        t.gate.unlink(missing_ok=True)  # batches hold: every stream has a request in flight when the kill comes
        results: dict[int, object] = {}

        def run_stream(k: int) -> None:
            with channel(srv.url) as conn:
                stub = pb_grpc.GRPCInferenceServiceStub(conn)
                try:
                    answers = list(stub.ModelStreamInfer(iter([request(1000.0 + k)]), timeout=60))
                    results[k] = ("OK", len(answers))
                except grpc.RpcError as exc:
                    results[k] = (exc.code().name, 0)

        threads = [threading.Thread(target=run_stream, args=(k,)) for k in range(CONNECTIONS)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: t.metric("trtserve_inflight_requests") == CONNECTIONS, 30)
        os.kill(procs["frontend1"], signal.SIGKILL)
        assert wait_for(lambda: len(results) > 0, 30)  # the killed front end's streams end
        time.sleep(0.5)
        t.gate.touch()
        for thread in threads:
            thread.join(60)
        codes = Counter(code for code, _ in results.values())
        assert set(codes) == {"OK", "UNAVAILABLE"} and codes["OK"] > 0, codes
        assert all(n == 1 for code, n in results.values() if code == "OK")
        assert wait_for(lambda: "frontend1" in pids(srv) and pids(srv)["frontend1"] != procs["frontend1"], 60)
        assert any("front end 1" in line and "restarting" in line for line in srv.output)
        with channel(srv.url) as conn:  # the server serves on, both front ends up
            pb_grpc.GRPCInferenceServiceStub(conn).ModelInfer(request(7.0), timeout=30)
        assert alive(pids(srv)["frontend1"]) and alive(procs["frontend0"]) and alive(procs["engine"])
    finally:
        t.gate.touch()
        assert srv.stop() == 0


def test_an_engine_core_that_dies_stops_the_server_non_zero_with_no_orphans(tmp_path):
    srv, t = start(tmp_path)
    try:
        procs = pids(srv)
        assert set(procs) == {"engine", "frontend0", "frontend1"}
        os.kill(procs["engine"], signal.SIGKILL)
        assert srv.proc.wait(30) != 0
        assert any("engine core exited (killed by SIGKILL)" in line for line in srv.output), list(srv.output)
        assert wait_for(lambda: not any(alive(p) for p in procs.values()), 10), {k: alive(p) for k, p in procs.items()}
    finally:
        srv.stop()


def test_a_killed_supervisor_takes_its_children_with_it(tmp_path):
    srv, t = start(tmp_path)
    try:
        procs = pids(srv)
        os.kill(srv.pid, signal.SIGKILL)
        assert wait_for(lambda: not any(alive(p) for p in procs.values()), 10), {k: alive(p) for k, p in procs.items()}
    finally:
        srv.stop()


def test_sigterm_with_two_front_ends_answers_everything_admitted_and_exits_0(tmp_path):
    """Drain over the whole tree: requests admitted on both front ends before SIGTERM are
    answered OK after it (the engine core keeps serving until every front end has drained);
    requests after it are UNAVAILABLE; every process exits 0."""
    srv, t = start(tmp_path, "--grace-period", "60")
    procs = pids(srv)
    t.gate.unlink(missing_ok=True)
    channels = [channel(srv.url) for _ in range(CONNECTIONS)]
    try:
        _drain_while_admitted(srv, t, procs, channels)
    finally:
        t.gate.touch()
        srv.stop()


def _drain_while_admitted(srv: ServerProcess, t: Tree, procs: dict[str, int], channels: list[grpc.Channel]) -> None:
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            # Ids from 1: the gate model passes all-zero rows (the warm-up's) through its gate.
            admitted = [pool.submit(pb_grpc.GRPCInferenceServiceStub(c).ModelInfer, request(float(k + 1)), timeout=60)
                        for k, c in enumerate(channels)]
            assert wait_for(lambda: t.metric("trtserve_inflight_requests") == CONNECTIONS, 30), (
                t.metric("trtserve_inflight_requests"), t.metric("trtserve_queue_depth", model="gated", version="1"),
                t.ran(),
                [f for f in admitted if f.done()][:2],
                [t.metric("trtserve_frontend_requests_total", frontend=str(i)) for i in (0, 1)])
            srv.proc.send_signal(signal.SIGTERM)
            with channel(srv.url) as late:
                assert wait_for(lambda: _refused(late), 10)
            t.gate.touch()
            answers = [f.result(timeout=60) for f in admitted]
    finally:
        for conn in channels:
            conn.close()
    assert sorted(float(a.id) for a in answers) == [float(k + 1) for k in range(CONNECTIONS)]
    assert srv.proc.wait(60) == 0
    assert not any(alive(p) for p in procs.values())
    assert sorted(t.ran()) == [float(k + 1) for k in range(CONNECTIONS)]


def _refused(channel: grpc.Channel) -> bool:
    try:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request(999.0), timeout=5)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def test_a_request_that_cannot_finish_in_time_is_refused_before_it_crosses(make_server, tmp_path):
    """With every answer the engine core sends the least run time of a batch of one; a front
    end refuses DEADLINE_EXCEEDED, without sending it, a request whose deadline comes sooner
    (counted as expired before running, like the engine core's own refusals)."""
    from reliability.casekit import row, write_probe

    write_probe(tmp_path, "slow", batch_ms=300)  # every batch takes 300 ms, the warm-up too
    srv = make_server(tmp_path, frontends=1, metrics_port=0)
    with srv.client() as c:
        c.infer("slow", row(1.0), timeout=30)  # the hint comes back with the answer
        crossed = srv.core.frontend_requests[0]
        with pytest.raises(grpc.RpcError) as err:
            c.infer("slow", row(2.0), timeout=0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "takes at least" in err.value.details()
        assert srv.core.frontend_requests[0] == crossed  # it never reached the engine core
        c.infer("slow", row(3.0), timeout=30)  # one that can finish still runs
    m = scrape(srv.metrics_at())
    assert m[("trtserve_deadline_exceeded_total", (("model", "slow"), ("when", "before_run")))] == 1
