"""The HTTP door's connections, over raw sockets against a real server on 127.0.0.1: every
resource a client can hold is bounded (C49, C51), a half-closed or pipelined request is answered
in order (C52), a request whose client reset the connection while queued is not run (C54), and
answers during a drain say ``Connection: close`` (issue 37 items 1-4; ``../shared/cases.md``).

The server runs with small limits (:data:`LIMITS`) so a slow client is refused in seconds; the
waits below are bounds on liveness, not measurements.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

from integration.helpers import wait_for_file, write_gate
from integration.test_http_rest import sync_records
from reliability.casekit import wait_for
from trtserve.frontend.http.protocol import HttpLimits

LIMITS = HttpLimits(header_timeout=1.0, body_timeout=1.0, body_min_rate=1000, max_header_bytes=4096,
                    max_headers=20, keepalive_timeout=1.0)
BODY_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def srv(engines, tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("repo") / "models"
    root.mkdir()
    (root / "tiny").symlink_to(engines / "tiny", target_is_directory=True)
    started, release = write_gate(root)
    with ServerThread(root, frontends=1, http=True, max_receive_bytes=BODY_LIMIT, http_limits=LIMITS) as server:
        server.gate = (started, release)
        yield server


def connect(srv) -> socket.socket:
    host, port = srv.http_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=60)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def tiny_post(rid: str, *, extra: str = "", version: str = "1.1") -> bytes:
    x = np.full((1, 64), 0.5, np.float32)
    body = json.dumps({"id": rid, "inputs": [{"name": "INPUT", "shape": [1, 64], "datatype": "FP32",
                                              "data": x.reshape(-1).tolist()}]}).encode()
    return (f"POST /v2/models/tiny/infer HTTP/{version}\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def gate_post(value: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32",
                                   "data": [value, 0.0, 0.0]}]}).encode()
    return f"POST /v2/models/gate/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def statuses(stream: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", stream)]


def test_slow_and_silent_clients_are_refused_408_or_closed_while_others_are_served(srv, caplog):
    """C49: a connection that never sends a byte, ones trickling a header and ones trickling a
    body are each closed (408 where a request began) within the limits, one warning each, while
    normal requests on new connections are answered throughout."""
    caplog.set_level(logging.WARNING, "trtserve.frontend.http.protocol")
    silent = connect(srv)
    headers = [connect(srv) for _ in range(3)]
    bodies = [connect(srv) for _ in range(2)]
    for sock in headers:
        sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    for sock in bodies:
        sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n{")
    slow = headers + bodies
    answers: dict[socket.socket, bytes] = {}
    served = 0
    end = time.monotonic() + 60
    while len(answers) < len(slow) and time.monotonic() < end:
        for sock in slow:
            if sock in answers:
                continue
            try:
                sock.sendall(b"a")  # one more byte: the server must not count it as progress
            except OSError:
                answers[sock] = b""
                continue
            sock.settimeout(0.05)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            answers[sock] = data + (read_all(sock) if data else b"")
        with connect(srv) as normal:
            normal.sendall(tiny_post(str(served), extra="Connection: close\r\n"))
            assert statuses(read_all(normal)) == [200]
            served += 1
    assert len(answers) == len(slow), "a slow connection was still open after 60 s"
    for data in answers.values():
        assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data
        assert not data or b"connection: close" in data.lower(), data
    silent.settimeout(60)
    assert silent.recv(1) == b""  # closed after the keep-alive timeout, having sent nothing
    refusals = [r for r in caplog.records if "408" in r.getMessage()]
    assert len(refusals) == len(slow), [r.getMessage() for r in refusals]
    for sock in [silent, *slow]:
        sock.close()


@pytest.mark.parametrize("head", [
    "X-Big: " + "b" * 5000 + "\r\n",
    "".join(f"X-{i}: v\r\n" for i in range(25)),
], ids=["bytes", "count"])
def test_headers_over_the_limits_are_answered_431_and_closed(srv, head):
    """C49: the size and the number of a request's headers are bounded (431, then close)."""
    with connect(srv) as sock:
        sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n{head}\r\n".encode())
        data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 431 ") and b"connection: close" in data.lower(), data


def test_a_body_over_the_limit_is_refused_413_without_100_continue_and_ends_the_connection(srv):
    """C51 (b): an over-limit Content-Length with ``Expect: 100-continue`` is answered 413 at
    once, never 100; the body sent anyway is never parsed as requests: the connection closes."""
    with connect(srv) as sock:
        sock.sendall(f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                     f"Content-Length: {BODY_LIMIT + 1}\r\n\r\n".encode())
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in first, first
        smuggled = b"GET /v2/smuggled HTTP/1.1\r\nHost: t\r\n\r\n" * 100
        try:
            sock.sendall(smuggled + b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
            rest = read_all(sock)
        except ConnectionResetError:
            rest = b""
    assert b"404" not in rest and statuses(first + rest) == [413], first + rest


def test_a_chunked_body_streamed_past_the_limit_is_cut_off_within_a_bounded_amount(srv):
    """C51 (h): after its 413 the server closes the connection rather than reading and
    discarding whatever the client goes on sending."""
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    sent = 0
    with connect(srv) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        with pytest.raises(OSError):  # EPIPE or ECONNRESET once the server has closed
            while sent < 64 * BODY_LIMIT:
                sock.sendall(chunk)
                sent += len(chunk)
    assert sent < 8 * BODY_LIMIT, f"{sent} bytes accepted for a {BODY_LIMIT}-byte limit"


@pytest.mark.parametrize("request_bytes", [
    b"POST /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /v2/smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
], ids=["cl-and-te", "two-content-lengths", "bad-chunk-size"])
def test_ambiguous_framing_is_refused_400_and_closed(srv, request_bytes):
    """C51 (d, e, g): Content-Length with Transfer-Encoding, two Content-Lengths and a malformed
    chunk size are 400 and close; nothing after them is parsed as a request."""
    with connect(srv) as sock:
        sock.sendall(request_bytes)
        data = read_all(sock)
    assert statuses(data) == [400] and b"smuggled" not in data, data


@pytest.mark.parametrize("first", [b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n", tiny_post("half")],
                         ids=["live", "infer"])
def test_a_request_followed_by_a_half_close_is_answered(srv, first):
    """C52 (g): the client's FIN says it has finished sending, not that it is gone."""
    with connect(srv) as sock:
        sock.sendall(first)
        sock.shutdown(socket.SHUT_WR)
        data = read_all(sock)
    assert statuses(data) == [200], data


def test_pipelined_requests_are_answered_in_order_and_nothing_after_a_close(srv):
    """C52 (b, c): 50 requests in one write answered in order with their ids; after a request
    that asked for close, nothing more is answered."""
    with connect(srv) as sock:
        sock.sendall(b"".join(tiny_post(str(i)) for i in range(50)) + tiny_post("last", extra="Connection: close\r\n"))
        data = read_all(sock)
    assert re.findall(rb'"id":"(\w+)"', data) == [str(i).encode() for i in range(50)] + [b"last"]
    with connect(srv) as sock:
        sock.sendall(tiny_post("a", extra="Connection: close\r\n") + tiny_post("b") + tiny_post("c"))
        data = read_all(sock)
    assert re.findall(rb'"id":"(\w+)"', data) == [b"a"], data


def test_http_1_0_and_absolute_form_requests_get_framed_answers(srv):
    """C52 (d, f): HTTP/1.0 without Host gets a whole answer (Content-Length) and then the close;
    an absolute-form target is served."""
    with connect(srv) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 200 ") and b"content-length: 0" in data.lower(), data
    with connect(srv) as sock:
        sock.sendall(tiny_post("old", version="1.0"))
        data = read_all(sock)
    head, body = data.split(b"\r\n\r\n", 1)
    assert int(re.search(rb"content-length: (\d+)", head.lower()).group(1)) == len(body) and b'"old"' in body
    with connect(srv) as sock:
        sock.sendall(f"GET http://{srv.http_url}/v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                     .encode())
        assert statuses(read_all(sock)) == [200]


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client that is killed or times out."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def gate_stats(srv) -> int:
    with connect(srv) as sock:
        sock.sendall(b"GET /v2/models/gate/stats HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        body = read_all(sock).split(b"\r\n\r\n", 1)[1]
    return json.loads(body)["model_stats"][0]["inference_count"]


def cancelled(srv) -> int:
    """The gate model's requests counted CANCELLED (the count a cancelled gRPC call adds to)."""
    hist = srv.core.requests.models.get("gate", None)
    found = hist.by_code.get("CANCELLED") if hist is not None else None
    return sum(found.snapshot()[0]) if found is not None else 0


def test_a_request_whose_client_reset_while_queued_is_not_run(srv):
    """C54 (a): requests whose connection was reset while they waited behind a held batch leave
    the queue, as cancelled gRPC calls do: none runs, each is counted CANCELLED, and the
    in-flight count returns to the blocker's."""
    started, release = srv.gate
    before, cancelled_before = gate_stats(srv), cancelled(srv)
    blocker = connect(srv)
    blocker.sendall(gate_post(7.0))
    wait_for_file(started)
    gone = [connect(srv) for _ in range(6)]
    for i, sock in enumerate(gone):
        sock.sendall(gate_post(float(i + 1)))
    assert wait_for(lambda: srv.admitted == 1 + len(gone), 30), srv.admitted
    for sock in gone:
        reset(sock)
    assert wait_for(lambda: srv.admitted == 1, 30), srv.admitted
    release.touch()
    try:
        blocker.settimeout(60)
        assert statuses(blocker.recv(65536)) == [200]
    finally:
        blocker.close()
    assert gate_stats(srv) == before + 1  # the blocker's row only
    sync_records(srv)
    assert cancelled(srv) == cancelled_before + len(gone)


def test_answers_during_a_drain_say_connection_close(engines, tmp_path):
    """Issue 37 item 4: while draining, an answer on a kept-alive connection carries
    ``Connection: close`` (and 503 with Retry-After for a new request), so the client reconnects
    instead of writing its next request onto a socket about to close."""
    from servers import ServerThread

    root = tmp_path / "models"
    root.mkdir()
    started, release = write_gate(root)
    srv = ServerThread(root, frontends=1, http=True).start()
    kept = connect(srv)
    try:
        kept.sendall(gate_post(1.0))
        first = kept.recv(65536)
        assert statuses(first) == [200] and b"connection: close" not in first.lower(), first
        blocker = connect(srv)
        blocker.sendall(gate_post(7.0))
        wait_for_file(started)
        draining = threading.Thread(target=srv.stop, kwargs={"grace": 60.0}, daemon=True)
        draining.start()
        assert wait_for(lambda: srv.services[0].inflight.draining, 30)
        kept.sendall(gate_post(2.0))
        data = read_all(kept)
        assert statuses(data) == [503] and b"connection: close" in data.lower() and b"retry-after: 1" in data.lower()
        release.touch()
        blocker.settimeout(60)
        answer = read_all(blocker)
        assert statuses(answer) == [200] and b"connection: close" in answer.lower(), answer
        draining.join(60)
    finally:
        release.touch()
        kept.close()
        srv.stop()
