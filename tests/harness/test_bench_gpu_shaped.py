"""``trtserve bench --modes gpu-shaped`` against trtserve alone, at tiny durations: the ``slow``
model copied with the GPU-like curve (4 ms + 0.1 ms a row, max batch 64) is served, and for
one-row and 8-row requests every point of (a) to (d) is measured and lands in ``bench.json``
with its target, beside the simulator's ideal. Structure only: the figures depend on the
machine and belong to ``make bench`` (``--peer triton`` adds Triton's)."""

from __future__ import annotations

import json

from trtserve.cli import build_parser
from trtserve.harness import bench
from trtserve.harness.benchlib.gpushaped import CURVE, Curve, write_repository
from trtserve.repository import load_spec

QUICK = [
    "--modes", "gpu-shaped", "--duration", "0.3", "--warmup", "0.1", "--requests", "64",
    "--overload-multiples", "1,2", "--overload-duration", "0.3", "--mixed-duration", "0.3",
]


def test_the_repository_copy_has_the_curve(engines, tmp_path):
    spec = load_spec(write_repository(engines / "slow", tmp_path, Curve(batch_ms=4.0, row_ms=0.1, max_batch=64)))
    assert spec.name == "slow" and spec.platform == "python" and spec.policy.max_batch_size == 64
    assert spec.parameters == {"batch_ms": "4", "row_ms": "0.1"}
    assert round(CURVE.capacity_rows_per_s) == 6154


def test_gpu_shaped_mode_measures_every_point_for_both_request_sizes(engines, tmp_path, capsys):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), *QUICK]
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "gpu-shaped: slow at 4 ms + 0.1 ms/row, max batch 64" in out
    assert "| rows/request | figure | target | trtserve | trtserve CPU |" in out
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["points"] == []  # the main modes did not run
    section = report["gpu-shaped"]
    assert set(section["simulator_ideal_misses"]) == {"1", "8"}
    points = section["points"]
    for rows, callers in ((1, [128, 256]), (8, [16, 32])):
        mine = [p for p in points if p["rows_per_request"] == rows]
        assert {p["server"] for p in mine} == {"trtserve"}
        assert [p["load"] for p in mine if p["mode"] == "gpu-closed"] == callers
        assert [p["fraction"] for p in mine if p["mode"] == "gpu-open"] == [0.8]
        assert [p["fraction"] for p in mine if p["mode"] == "gpu-overload"] == [1.0, 2.0]
        assert [p["fraction"] for p in mine if p["mode"] == "gpu-mixed"] == [0.65]
        for p in mine:
            assert p["requests"] > 0 and p["server_cpu_us_per_request"] > 0, p
            if p["mode"] != "gpu-closed":
                assert sum(c["requests"] for c in p["classes"]) == p["requests"], p
        closed = [p for p in mine if p["mode"] == "gpu-closed"]
        assert all(p["ok"] == p["requests"] and p["ratio"] > 0 for p in closed), closed
    names = [t["name"] for t in report["targets"]]
    for rows in (1, 8):
        who = f"slow gpu-shaped {rows}-row requests"
        assert f"{who}: closed-loop rows/s >= 0.95 x the engine's 6154" in names
        assert f"{who}: open loop at 80% capacity, missed <= simulator's ideal + 1%" in names
        assert f"{who}: overload at 2x capacity, goodput >= 0.8 x peak" in names
        assert f"{who}: mixed at 65% capacity, tight (41 ms) missed <= 5%" in names
        assert f"{who}: mixed at 65% capacity, loose (410 ms) missed <= 1%" in names
