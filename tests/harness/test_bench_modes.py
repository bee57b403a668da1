"""``trtserve bench`` end to end at tiny durations, against a real server process: the
overload, mixed and policy modes run (overload and mixed over either door), report every
figure with a target and write them to ``bench.json``. Structure only (what ran, what was
recorded, which targets exist): the figures themselves depend on the machine and belong to
``make bench``."""

from __future__ import annotations

import json

import pytest

from trtserve.cli import build_parser
from trtserve.harness import bench

QUICK = [
    "--models", "tiny", "--modes", "overload,mixed,policy", "--policies", "adaptive,fixed:2", "--concurrency", "4",
    "--duration", "0.3", "--warmup", "0.1", "--raw-duration", "0.05", "--requests", "64",
    "--overload-multiples", "1,2", "--overload-duration", "0.3", "--mixed-duration", "0.3",
    "--policy-concurrency", "4", "--policy-rates", "0.5", "--policy-rounds", "1", "--policy-duration", "0.3",
]


def test_overload_mixed_and_policy_modes_report_every_point_with_its_target(engines, tmp_path, capsys):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), *QUICK]
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "| model | policy | door | offered/s | deadline ms | goodput/s |" in out
    assert "| tiny | fixed 2 ms | grpc | " in out
    report = json.loads((tmp_path / "bench.json").read_text())
    points = report["points"]
    modes = [(p["mode"], p["policy"]) for p in points]
    # The quick capacity loops (no closed-loop sweep in --modes): unary for overload and mixed, a stream for the
    # policy rows.
    assert modes.count(("capacity-unary", None)) == 1 and modes.count(("capacity-stream", None)) == 1
    for policy in ("adaptive", "fixed 2 ms"):
        assert modes.count(("overload", policy)) == 2 and modes.count(("mixed", policy)) == 1
        assert modes.count(("policy-closed", policy)) == 1 and modes.count(("policy", policy)) == 1
    for p in points:
        if p["mode"] == "overload":
            (one,) = p["classes"]
            # tiny's 10x batch of one is below the floor
            assert one["requests"] == p["requests"] and one["deadline_ms"] == 5.0
            assert p["rss_start_mib"] > 0 and p["rss_end_mib"] > 0
        if p["mode"] == "mixed":
            tight, loose = p["classes"]
            assert (tight["name"], tight["deadline_ms"]) == ("tight", 5.0)
            assert (loose["name"], loose["deadline_ms"]) == ("loose", 50.0)
            assert tight["requests"] + loose["requests"] == p["requests"]
    names = [t["name"] for t in report["targets"]]
    for policy in ("adaptive", "fixed 2 ms"):
        assert f"tiny overload {policy} at 2x capacity: goodput >= 0.8 x peak" in names
        assert any(n.startswith(f"tiny overload {policy}: server RSS") for n in names)
        assert any(n.startswith(f"tiny mixed {policy} at 65% capacity, tight (5.0 ms)") for n in names)
    assert "tiny closed-unary c=4: adaptive >= best fixed timer within 2 s.e." in names
    assert (tmp_path / "tiny_overload.png").is_file()


def test_overload_and_mixed_run_over_the_http_door_against_its_own_capacity(engines, loadgen_binary, tmp_path, capsys):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), *QUICK, "--modes", "overload,mixed",
         "--policies", "adaptive", "--open-door", "http", "--client", "go"]
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "| tiny | adaptive | http | " in out and "| tiny | adaptive | grpc | " not in out
    report = json.loads((tmp_path / "bench.json").read_text())
    points = report["points"]
    # The quick capacity loop ran over HTTP; the open loop's points are all HTTP, every request answered.
    assert [(p["mode"], p["door"]) for p in points] == [("capacity-http", "http")] + [("overload", "http")] * 2 + [
        ("mixed", "http")]
    for p in points[1:]:
        assert p["requests"] > 0 and sum(c["requests"] for c in p["classes"]) == p["requests"]
        assert all(not code.startswith(("HTTP", "CODE_")) for code in p["errors"])  # recorded as gRPC names
    names = [t["name"] for t in report["targets"]]
    assert "tiny overload adaptive over HTTP at 2x capacity: goodput >= 0.8 x peak" in names
    assert any(n.startswith("tiny mixed adaptive over HTTP at 65% capacity, tight") for n in names)


def test_the_http_door_of_the_open_loop_needs_the_go_client(engines, tmp_path):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), *QUICK, "--open-door", "http",
         "--client", "python"]
    )
    with pytest.raises(SystemExit, match="--open-door http: the open loop over HTTP is the Go load generator's"):
        bench.run(args)
