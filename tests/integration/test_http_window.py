"""The HTTP door's concurrency window against a real server on 127.0.0.1, over raw sockets
(issue 36 item 3): beyond the window an inference request waits unread and runs when one in
progress ends; one still waiting at its deadline is answered 504 without running; health,
metadata and statistics are never held; a held request whose client leaves never runs; a drain
answers what is held instead of dropping it.

The window is fixed at one request (``HttpLimits(window=1)``) and filled by the gate model,
which holds its request until the test releases it; waits are bounds on liveness.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from integration.helpers import wait_for_file, write_gate
from integration.test_http_connections import gate_post, gate_stats, read_all, reset, statuses, tiny_post
from integration.test_http_rest import sync_records
from reliability.casekit import wait_for
from trtserve.frontend.http.protocol import HttpLimits


@pytest.fixture
def srv(engines, tmp_path):
    from servers import ServerThread

    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny").symlink_to(engines / "tiny", target_is_directory=True)
    started, release = write_gate(root)
    server = ServerThread(root, frontends=1, http=True, http_limits=HttpLimits(window=1)).start()
    server.gate = (started, release)
    try:
        yield server
    finally:
        release.touch()
        server.stop()


def connect(srv) -> socket.socket:
    host, port = srv.http_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=60)


def get(srv, path: str) -> tuple[int, dict]:
    with connect(srv) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        head, body = read_all(sock).split(b"\r\n\r\n", 1)
    return statuses(head)[0], (json.loads(body) if body else {})


def response(sock: socket.socket) -> bytes:
    """One whole response (headers and a Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def tiny_count(srv) -> int:
    return get(srv, "/v2/models/tiny/stats")[1]["model_stats"][0]["inference_count"]


def hold_of(srv):
    return srv.doors[0].http.hold


def block(srv) -> socket.socket:
    """Fill the window with a gate request; the socket its answer comes on."""
    blocker = connect(srv)
    blocker.sendall(gate_post(7.0))
    wait_for_file(srv.gate[0])
    return blocker


def test_beyond_the_window_a_request_waits_unread_while_health_and_metadata_answer(srv):
    blocker = block(srv)
    waiting = connect(srv)
    try:
        before = tiny_count(srv)
        waiting.sendall(tiny_post("w"))
        assert wait_for(lambda: hold_of(srv).held == 1, 30)
        assert get(srv, "/v2/health/ready")[0] == 200
        assert get(srv, "/v2/models/tiny")[0] == 200
        assert tiny_count(srv) == before  # held, not run
        srv.gate[1].touch()
        assert statuses(response(blocker)) == [200]
        waiting.settimeout(60)
        assert statuses(response(waiting)) == [200]
        assert tiny_count(srv) == before + 1
    finally:
        blocker.close()
        waiting.close()


def test_a_request_held_past_its_deadline_is_answered_504_without_running(srv):
    blocker = block(srv)
    late = connect(srv)
    try:
        before = tiny_count(srv)
        late.sendall(tiny_post("late", extra="trtserve-timeout-us: 200000\r\n"))
        late.settimeout(60)
        answer = response(late)
        assert statuses(answer) == [504] and b"concurrency window" in answer, answer
        late.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")  # the connection stays open
        assert statuses(response(late)) == [200]
        srv.gate[1].touch()
        assert statuses(response(blocker)) == [200]
        assert tiny_count(srv) == before
        sync_records(srv)
        assert srv.core.requests.models["tiny"].refused["window"] == 1
    finally:
        blocker.close()
        late.close()


def test_a_held_request_whose_client_left_never_runs(srv):
    blocker = block(srv)
    try:
        before = tiny_count(srv)
        gone = connect(srv)
        gone.sendall(tiny_post("gone"))
        assert wait_for(lambda: hold_of(srv).held == 1, 30)
        reset(gone)
        assert wait_for(lambda: hold_of(srv).held == 0, 30)
        srv.gate[1].touch()
        assert statuses(response(blocker)) == [200]
        assert gate_stats(srv) >= 1 and tiny_count(srv) == before
    finally:
        blocker.close()


def test_a_drain_answers_the_held_requests(srv):
    blocker = block(srv)
    waiting = connect(srv)
    try:
        waiting.sendall(tiny_post("w"))
        assert wait_for(lambda: hold_of(srv).held == 1, 30)
        draining = threading.Thread(target=srv.stop, kwargs={"grace": 60.0}, daemon=True)
        draining.start()
        waiting.settimeout(60)
        answer = read_all(waiting)
        assert statuses(answer) == [503] and b"shutting down" in answer, answer
        srv.gate[1].touch()
        blocker.settimeout(60)
        assert statuses(read_all(blocker)) == [200]
        draining.join(60)
    finally:
        blocker.close()
        waiting.close()
