"""``trtserve bench --protocol`` end to end at tiny durations, against a real server process
(started with its HTTP door on an ephemeral port): the closed-loop unary sweep runs over each
door asked for, every HTTP point is answered without an error, and the door table and targets
are reported. Structure only; the figures belong to ``make bench``."""

from __future__ import annotations

import json

import pytest

from trtserve.cli import build_parser
from trtserve.harness import bench

QUICK = [
    "--models", "tiny", "--modes", "closed-unary", "--concurrency", "4,64", "--connections", "2",
    "--duration", "0.3", "--warmup", "0.1", "--raw-duration", "0.05", "--requests", "80",
]
CPU_TARGET = "tiny at 64 callers: server CPU per call over HTTP <= 0.4 x over gRPC (same run, whole process tree)"
PEAK_TARGET = "tiny peak rows/s over HTTP >= 1.2 x the peer's HTTP peak"


@pytest.mark.parametrize("protocol", ["http", "grpc,http"])
def test_the_unary_sweep_runs_over_each_door_asked_for(engines, tmp_path, capsys, protocol):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), "--protocol", protocol, *QUICK]
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "bench.json").read_text())
    points = [p for p in report["points"] if p["server"] == "trtserve"]
    floor = [p for p in report["points"] if p["server"] == "null"]
    http = [p for p in points if p["mode"] == "closed-http"]
    assert [p["load"] for p in http] == [4, 64]
    for p in http:
        assert p["server"] == "trtserve" and p["requests"] > 0 and p["ok"] == p["requests"] and p["errors"] == {}
        assert p["rows_per_s"] > 0 and p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"]
        assert p["server_cpu_us_per_request"] > 0 and p["client_cpu_us_per_request"] > 0
        assert p["connections"] <= p["load"]  # one kept-alive connection per caller at most
        assert p["mean_batch"] >= 1  # the calls reached the model (ModelStatistics, read over gRPC)
    grpc_modes = [p["mode"] for p in points if p["mode"] != "closed-http"]
    targets = {t["name"]: t["verdict"] for t in report["targets"]}
    if protocol == "http":
        assert grpc_modes == []  # --protocol http: the gRPC sweep (and its one-connection rerun) left out
        assert targets[CPU_TARGET] == "SKIP"
    else:
        assert grpc_modes == ["closed-unary"] * 2 + ["closed-1conn"] * 2
        assert targets[CPU_TARGET] in ("PASS", "MISS")
        assert "trtserve  grpc  c=64" in out
    assert targets[PEAK_TARGET] == "SKIP"  # no --peer
    # The null server ran the same sweep over the same doors, every call answered, and the
    # floor targets set trtserve's CPU per call against it.
    assert sorted((p["mode"], p["load"]) for p in floor) == sorted((p["mode"], p["load"]) for p in points
                                                                    if p["mode"] != "closed-1conn")
    assert all(p["requests"] > 0 and p["ok"] == p["requests"] and p["server_cpu_us_per_request"] > 0 for p in floor)
    http_floor = ("tiny at 64 callers over HTTP: server CPU per call <= 1.3 x the null server's (same run, whole "
                  "process tree)")
    grpc_floor = http_floor.replace("HTTP", "gRPC")
    assert targets[http_floor] in ("PASS", "MISS")
    assert targets[grpc_floor] == "SKIP" if protocol == "http" else targets[grpc_floor] in ("PASS", "MISS")
    assert "null      http  c=64" in out
    assert "tiny · closed-unary by door" in out and "trtserve  http  c=64" in out
    assert f"  {targets[CPU_TARGET]}  {CPU_TARGET}: " in out


def test_an_unknown_protocol_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit):
        build_parser("bench").parse_args(["bench", "--protocol", "grpc,ftp"])
    assert "expected grpc and/or http separated by commas, got 'grpc,ftp'" in capsys.readouterr().err
