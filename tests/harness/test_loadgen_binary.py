"""The Go load generator binary (clients/go/loadgen, `make loadgen`) against a real server on
127.0.0.1, over either door: every scheduled call answered once, with the server's status
(over HTTP, the gRPC code its HTTP status stands for), and its records in the documented file
format. Skipped while the binary is not built (see ``loadgen_binary``).

Nothing here depends on speed: the refusals are decided by the server before it runs
anything (a 1 µs ``timeout`` parameter, a malformed body, an unknown model) or by a 1 ms
deadline on the ``slow`` model, which sleeps 20 ms; the OK answers have no deadline."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import numpy as np

from trtserve.client import build_request
from trtserve.harness.benchlib.goclient import read_records, schedule_rows, write_messages
from trtserve.harness.benchlib.httpclient import rest_request

GRPC_OK, GRPC_INVALID_ARGUMENT, GRPC_DEADLINE_EXCEEDED, GRPC_NOT_FOUND = 0, 3, 4, 5


def start(
    binary: Path, url: str, tmp_path: Path, messages: list[bytes], calls: np.ndarray, connections: int = 2,
    http_path: str | None = None,
) -> subprocess.Popen:
    write_messages(tmp_path / "messages.bin", messages)
    calls.tofile(tmp_path / "schedule.bin")
    return subprocess.Popen(
        [str(binary), "-addr", url, "-connections", str(connections), "-messages", str(tmp_path / "messages.bin"),
         "-schedule", str(tmp_path / "schedule.bin"), "-out", str(tmp_path / "records.bin"),
         *(("-http", http_path) if http_path else ())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run_codes(binary: Path, url: str, tmp_path: Path, messages: list[bytes], keys: list[int],
              deadline_us: list[int] | int = 0, http_path: str | None = None) -> list[int]:
    """Send ``messages[keys[k]]`` as call k (all within 0.2 s), wait for every answer; the
    recorded status code of each call, in schedule order."""
    arrivals = np.linspace(0.0, 0.2, len(keys))
    proc = start(binary, url, tmp_path, messages, schedule_rows(arrivals, np.array(keys), deadline_us),
                 http_path=http_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    records = read_records(tmp_path / "records.bin")
    assert records["message"].tolist() == keys and records["scheduled_s"].tolist() == arrivals.tolist()
    return records["code"].tolist()


def test_every_call_is_answered_with_the_servers_status_and_recorded(server, loadgen_binary, tmp_path):
    x = np.ones((1, 64), np.float32)
    messages = [
        build_request("tiny", {"INPUT": x}).SerializeToString(),  # no deadline: OK
        build_request("tiny", {"INPUT": x}, timeout_us=1).SerializeToString(),  # the server sheds it
        build_request("slow", {"INPUT0": np.ones((1, 4), np.float32)}).SerializeToString(),  # 20 ms run
    ]
    keys = np.array([0, 1, 2, 0, 1, 2, 0, 2] * 3)
    arrivals = np.linspace(0.0, 0.2, len(keys))
    grpc_deadline_us = np.where(np.arange(len(keys)) % 8 == 5, 1000, 0)  # call 5 of every 8: slow with a 1 ms deadline
    proc = start(loadgen_binary, server.url, tmp_path, messages, schedule_rows(arrivals, keys, grpc_deadline_us))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.startswith("start ")

    records = read_records(tmp_path / "records.bin")
    assert records["message"].tolist() == keys.tolist()  # every call once, in schedule order
    assert records["scheduled_s"].tolist() == arrivals.tolist()
    assert (records["sent_s"] >= records["scheduled_s"]).all() and (records["done_s"] >= records["sent_s"]).all()
    expected = [GRPC_DEADLINE_EXCEEDED if key == 1 or k % 8 == 5 else GRPC_OK for k, key in enumerate(keys)]
    assert records["code"].tolist() == expected


def test_a_stop_line_ends_the_sending_but_not_the_answers(server, loadgen_binary, tmp_path):
    message = build_request("slow", {"INPUT0": np.ones((1, 4), np.float32)}).SerializeToString()
    arrivals = np.array([0.0, 0.0, 0.001, 120.0, 121.0])
    proc = start(loadgen_binary, server.url, tmp_path, [message], schedule_rows(arrivals, np.zeros(5, np.int64), 0))
    assert proc.stdout is not None and proc.stdout.readline().startswith("start ")
    _, err = proc.communicate("stop 60\n", timeout=60)
    assert proc.returncode == 0, err
    records = read_records(tmp_path / "records.bin")
    assert records["code"].tolist() == [GRPC_OK] * 3  # the three before 60 s, each answered


def test_bad_arguments_are_refused_with_a_sentence(loadgen_binary, tmp_path):
    message = build_request("tiny", {"INPUT": np.ones((1, 64), np.float32)}).SerializeToString()
    calls = schedule_rows(np.zeros(1), np.zeros(1, np.int64), 0)
    proc = start(loadgen_binary, "10.1.2.3:8001", tmp_path, [message], calls)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not a loopback IP address" in err

    calls = schedule_rows(np.zeros(1), np.ones(1, np.int64), 0)
    proc = start(loadgen_binary, "127.0.0.1:1", tmp_path, [message], calls)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "call 0 sends message 1 of 1" in err

    calls = schedule_rows(np.array([1.0, 0.5]), np.zeros(2, np.int64), 0)
    proc = start(loadgen_binary, "127.0.0.1:1", tmp_path, [message], calls)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "non-decreasing" in err


def test_over_http_every_call_is_answered_with_the_code_its_status_stands_for(http_server, loadgen_binary, tmp_path):
    x = {"INPUT": np.ones((1, 64), np.float32)}
    tiny = [
        rest_request("tiny", x, binary=False).body,  # no deadline: 200
        rest_request("tiny", x, binary=False, timeout_us=1).body,  # the server sheds it: 504
        b'{"inputs": []}',  # 400
    ]
    keys = [0, 1, 2] * 4
    codes = run_codes(loadgen_binary, http_server.http_url, tmp_path, tiny, keys, http_path="/v2/models/tiny/infer")
    assert codes == [GRPC_OK, GRPC_DEADLINE_EXCEEDED, GRPC_INVALID_ARGUMENT] * 4
    codes = run_codes(loadgen_binary, http_server.http_url, tmp_path, tiny, [0, 0], http_path="/v2/models/nope/infer")
    assert codes == [GRPC_NOT_FOUND] * 2

    # slow runs 20 ms: a 1 ms deadline (the trtserve-timeout-us header, then the client's own) ends it early.
    slow = [rest_request("slow", {"INPUT0": np.ones((1, 4), np.float32)}, binary=False).body]
    codes = run_codes(loadgen_binary, http_server.http_url, tmp_path, slow, [0] * 6, [0, 1000] * 3,
                      http_path="/v2/models/slow/infer")
    assert codes == [GRPC_OK, GRPC_DEADLINE_EXCEEDED] * 3


def test_over_http_an_unreachable_server_is_exit_status_1(loadgen_binary, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{s.getsockname()[1]}"
    calls = schedule_rows(np.zeros(1), np.zeros(1, np.int64), 0)
    proc = start(loadgen_binary, url, tmp_path, [b"{}"], calls, http_path="/v2/models/tiny/infer")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == "" and "HTTP connection to " + url in err
