"""C39: a port belongs to one server (``../shared/cases.md``, issue 27 item 1).

gRPC sets SO_REUSEPORT on its server sockets by default, and Linux lets any later socket of the
same user with SO_REUSEPORT join a port whose sockets carry it, the kernel then handing new
connections to either. Every listener here is on 127.0.0.1, on a port the test picks free.

* (a) one front end: a plain grpc Python server (default options) cannot bind trtserve's port.
* (b) ``--frontends 2`` (the front ends share the port): the plain server may bind (see the
  port rule, docs/guide/operating.md), but none of 12 new connections reaches it: RepositoryIndex is answered
  by trtserve on every one.
* (c) a second trtserve on the port, with one front end and with two, and (e) trtserve on a
  port held by a plain listening socket: exit 2 with one line naming the address.
* The HTTP door's port, with one front end and with two: a SO_REUSEPORT socket cannot bind it.
* (d) two ``trtserve serve --frontends 2`` started together on one port, with different
  repositories: exactly one serves (every connection reaches it), the other exits 2 with that
  line.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from casekit import write_identity

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.testing import ServerProcess

CONNECTIONS = 12


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def repository(root: Path, model: str) -> Path:
    write_identity(root, model)
    return root


def serve_args(repo: Path, port: int, frontends: int) -> list[str]:
    return [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(repo), "--host", "127.0.0.1",
            "--port", str(port), "--frontends", str(frontends), "--http-port", "0", "--metrics-port", "0"]


def answered_by(port: int) -> list[str]:
    """Who answers RepositoryIndex on each of 12 new connections: the model names trtserve
    lists, or the status another server answers with (UNIMPLEMENTED for a bare grpc server)."""
    answers = []
    for _ in range(CONNECTIONS):
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            try:
                index = pb_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(pb.RepositoryIndexRequest(),
                                                                                   timeout=30)
                answers.append(",".join(sorted(model.name for model in index.models)))
            except grpc.RpcError as exc:
                answers.append(exc.code().name)
    return answers


def assert_refused(result: subprocess.CompletedProcess, port: int) -> None:
    """Exit 2, and the output is one line naming the address (no traceback)."""
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, lines
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], lines


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_b_no_connection_reaches_a_plain_grpc_server_on_the_port(tmp_path, frontends):
    with ServerProcess(repository(tmp_path, "alpha"), "--port", str(free_port()),
                       "--frontends", str(frontends)) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        other = grpc.server(ThreadPoolExecutor(2))  # default options: SO_REUSEPORT on
        try:
            try:
                bound = other.add_insecure_port(f"127.0.0.1:{port}")
            except RuntimeError:  # grpcio's "Failed to bind"
                bound = 0
            if frontends == 1:
                assert bound == 0, "a plain grpc server bound the port of a one-front-end trtserve"
            if bound:
                other.start()
            assert answered_by(port) == ["alpha"] * CONNECTIONS
        finally:
            other.stop(None)


@pytest.mark.parametrize("frontends", [1, 2])
def test_c_a_second_trtserve_on_the_port_exits_2_with_one_line(tmp_path, frontends):
    with ServerProcess(repository(tmp_path / "a", "alpha"), "--port", str(free_port()), "--frontends", "2") as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        second = subprocess.run(serve_args(repository(tmp_path / "b", "beta"), port, frontends),
                                capture_output=True, text=True, timeout=120)
        assert_refused(second, port)
        assert answered_by(port) == ["alpha"] * CONNECTIONS


def test_d_two_trtserve_started_together_one_serves_the_other_exits_2(tmp_path):
    port = free_port()
    repos = {"alpha": repository(tmp_path / "a", "alpha"), "beta": repository(tmp_path / "b", "beta")}
    procs = {model: subprocess.Popen(serve_args(repo, port, 2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True) for model, repo in repos.items()}
    try:
        # The loser exits at once; the winner serves until stopped.
        done = {}
        while not done:
            for model, proc in procs.items():
                try:
                    done[model] = proc.communicate(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        assert len(done) == 1, f"both exited: {done}"
        (loser, (out, err)), = done.items()
        assert_refused(subprocess.CompletedProcess([], procs[loser].returncode, out, err), port)
        (winner,) = set(procs) - {loser}
        while True:  # the winner may still be loading: wait for it to answer
            answers = answered_by(port)
            if "UNAVAILABLE" not in answers:
                break
        assert answers == [winner] * CONNECTIONS
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=60)


@pytest.mark.parametrize("frontends", [1, 2])
def test_e_a_port_held_by_a_plain_socket_exits_2_with_one_line(tmp_path, frontends):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = subprocess.run(serve_args(repository(tmp_path, "alpha"), port, frontends),
                                capture_output=True, text=True, timeout=120)
    assert_refused(result, port)


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_reuseport_socket_cannot_bind_the_http_port(tmp_path, frontends):
    with ServerProcess(repository(tmp_path, "alpha"), "--frontends", str(frontends), "--allow-http", "true",
                       "--http-port", "0") as srv:
        (port,) = {int(m.group(1)) for line in srv.output if (m := re.search(r"HTTP on [\d.]+:(\d+)", line))}
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
