"""``trtserve bench --modes queue`` at tiny durations: the mode starts a redis-server and a server
reading it, drives minilm captions over the gRPC stream and through the queue door at each number
outstanding, and every point lands in ``bench.json`` with the target. Structure only (skipped
without ``redis-server``): the figures depend on the machine and belong to ``make bench``."""

from __future__ import annotations

import gzip
import json

import pytest

from trtserve.cli import build_parser
from trtserve.harness import bench
from trtserve.harness.benchlib.workload import CORPUS
from trtserve.testing.redis_server import missing_reason

SENTENCES = [f"Two children number {i} play with a kite on a windy beach." for i in range(40)]


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    (root / CORPUS).parent.mkdir(parents=True)
    with gzip.open(root / CORPUS, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(SENTENCES))
    return root


def test_queue_mode_measures_both_doors_at_each_number_outstanding(engines, data, tmp_path, capsys):
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "out"
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--data", str(data), "--out", str(out), "--models", "minilm",
         "--modes", "queue", "--concurrency", "1,4", "--duration", "0.5", "--warmup", "0.2", "--requests", "40"]
    )
    assert bench.run(args) == 0
    output = capsys.readouterr().out
    assert "queue door (minilm captions" in output
    report = json.loads((out / "bench.json").read_text())
    assert report["points"] == []  # the main server did not run
    points = report["queue"]
    assert [(p["door"], p["outstanding"]) for p in points] == [("stream", 1), ("queue", 1), ("stream", 4),
                                                               ("queue", 4)]
    for p in points:
        assert p["errors"] == {} and p["requests"] > 0 and p["texts_per_s"] > 0, p
        assert p["p50_ms"] > 0 and p["server_cpu_us_per_request"] > 0, p
        queued = p["door"] == "queue"
        assert (p["pickup_p50_ms"] is not None) == queued and (p["redis_cpu_us_per_request"] is not None) == queued
    names = [t["name"] for t in report["targets"] if "queue door" in t["name"]]
    assert names == ["minilm queue door, 4 outstanding: texts/s >= 0.9 x the gRPC stream's",
                     "minilm queue door, 4 outstanding: pickup delay"]


def test_queue_mode_is_skipped_with_a_sentence_without_minilm(engines, tmp_path, capsys):
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--out", str(tmp_path), "--models", "tiny", "--modes", "queue"]
    )
    assert bench.run(args) == 0
    assert "mode 'queue' skipped: it runs only on minilm, which is not in --models" in capsys.readouterr().out
    assert json.loads((tmp_path / "bench.json").read_text())["queue"] == []
