"""The Python side of the Go load generator: its input files as the binary reads them, its
records turned into the bench's per-request records (times on the bench's clock, status
names, late answers), and the bodies it sends over HTTP (the JSON encoding of the very request
sent over gRPC). Exact answers from fixed bytes; nothing runs the binary."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from trtserve.client import build_request
from trtserve.harness.benchlib.goclient import RECORD, add_records, read_records, schedule_rows, write_messages
from trtserve.harness.benchlib.httpclient import rest_request
from trtserve.harness.benchlib.load import json_bodies
from trtserve.harness.benchlib.records import Recorder
from trtserve.protocol.rest import parse_infer


def test_messages_are_written_length_prefixed_little_endian(tmp_path):
    write_messages(tmp_path / "m.bin", [b"ab", b"", b"xyz"])
    expected = struct.pack("<Q", 2) + b"ab" + struct.pack("<Q", 0) + struct.pack("<Q", 3) + b"xyz"
    assert (tmp_path / "m.bin").read_bytes() == expected


def test_schedule_rows_are_24_bytes_per_call_with_one_or_per_call_deadlines(tmp_path):
    rows = schedule_rows(np.array([0.0, 0.25]), np.array([3, 1]), 5000)
    rows.tofile(tmp_path / "s.bin")
    assert (tmp_path / "s.bin").read_bytes() == struct.pack("<dqqdqq", 0.0, 3, 5000, 0.25, 1, 5000)
    assert schedule_rows(np.array([0.0, 1.0]), np.array([0, 0]), np.array([7, 0]))["deadline_us"].tolist() == [7, 0]


def test_records_become_the_recorders_requests_on_the_bench_clock(tmp_path):
    # message, scheduled, sent, done (s from the binary's start), gRPC status code
    raw = [(1, 0.5, 0.5001, 0.5020, 0), (0, 0.6, 0.6002, 0.6500, 0), (1, 0.7, 0.7, 0.7010, 4), (0, 0.8, 0.81, 0.82, 8),
           (1, 0.9, 0.9, 0.91, 99)]
    (tmp_path / "r.bin").write_bytes(b"".join(struct.pack("<qdddq", *r) for r in raw))
    records = read_records(tmp_path / "r.bin")
    assert records.dtype == RECORD and len(records) == 5

    recorder = Recorder()
    add_records(recorder, records, start_s=1000.0, deadlines_s=[0.010, 0.005])
    assert recorder.keys == [1, 0, 1, 0, 1]
    assert recorder.scheduled == pytest.approx([1000.5, 1000.6, 1000.7, 1000.8, 1000.9])
    assert recorder.sent[1] == pytest.approx(1000.6002) and recorder.done[1] == pytest.approx(1000.65)
    assert recorder.codes == ["OK", "OK", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CODE_99"]
    # Late: OK but answered more than its message's deadline after it was sent (message 0: 10 ms).
    assert recorder.late == [False, True, False, False, False]


def test_a_truncated_records_file_is_refused(tmp_path):
    (tmp_path / "r.bin").write_bytes(struct.pack("<qdddq", 0, 0.0, 0.0, 0.0, 0)[:-1])
    with pytest.raises(ValueError, match="not a whole number of 40-byte records"):
        read_records(tmp_path / "r.bin")


def test_the_client_flag_picks_go_only_when_built_and_says_so_when_it_falls_back(monkeypatch, tmp_path, capsys):
    from trtserve.harness import bench

    monkeypatch.setattr(bench, "LOADGEN", tmp_path / "loadgen")
    assert bench._open_loop_client("auto") is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Python client" in out and "is not built" in out
    with pytest.raises(SystemExit, match="--client go: .*loadgen is not built"):
        bench._open_loop_client("go")

    (tmp_path / "loadgen").write_text("#!/bin/sh\n")
    (tmp_path / "loadgen").chmod(0o755)
    assert bench._open_loop_client("auto") is True and bench._open_loop_client("go") is True
    assert bench._open_loop_client("python") is False
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("inputs", [
    {"INPUT": np.arange(64, dtype=np.float32).reshape(1, 64) / 7},  # tiny: FP32 values that JSON must keep exact
    {"TEXT": np.array([["a café".encode()]], dtype=object)},  # text: BYTES as UTF-8 strings
])
def test_the_http_doors_json_body_is_the_grpc_request_the_server_decodes(inputs):
    rest = rest_request("m", inputs, binary=False, timeout_us=5000)
    assert rest.headers == {} and rest.path == "/v2/models/m/infer"  # JSON alone: the binary sends no header
    decoded = parse_infer(rest.body, None, "m", "")
    assert decoded.request == build_request("m", inputs, timeout_us=5000)
    assert decoded.binary_default  # outputs come back raw, as over gRPC


def test_the_go_client_sends_json_bodies_to_one_path_and_refuses_others():
    x = {"INPUT": np.ones((1, 64), np.float32)}
    one, two = rest_request("tiny", x, binary=False), rest_request("tiny", x, binary=False, timeout_us=9)
    assert json_bodies([one, two, one]) == ("/v2/models/tiny/infer", [one.body, two.body, one.body])
    with pytest.raises(ValueError, match="one path"):
        json_bodies([one, rest_request("other", x, binary=False)])
    with pytest.raises(ValueError, match="binary=False"):
        json_bodies([one, rest_request("tiny", x)])  # the binary tensor extension needs its header
