"""``trtserve bench --modes embeddings`` against trtserve alone, at short durations: the server
under test opens its HTTP door and minilm answers ``POST /v1/embeddings`` at both request sizes
(1 and 32 texts) with no error; every point lands in ``bench.json``. Structure only: the figures
depend on the machine and belong to ``make bench`` (``--peer infinity`` adds the comparison)."""

from __future__ import annotations

import gzip
import json

from trtserve.cli import build_parser
from trtserve.harness import bench
from trtserve.harness.benchlib.workload import CORPUS

SENTENCES = [f"A dog number {i} runs across the green field after a red ball." for i in range(80)]


def test_embeddings_mode_serves_both_request_sizes_without_errors(engines, tmp_path, capsys):
    data = tmp_path / "data"
    (data / CORPUS).parent.mkdir(parents=True)
    with gzip.open(data / CORPUS, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(SENTENCES))
    out = tmp_path / "out"
    args = build_parser("bench").parse_args(
        ["bench", "--model-repository", str(engines), "--data", str(data), "--out", str(out), "--models", "minilm",
         "--modes", "embeddings", "--concurrency", "1", "--duration", "3", "--warmup", "0.1",
         "--raw-duration", "0.05", "--requests", "80"]
    )
    assert bench.run(args) == 0
    assert "embeddings (minilm, OpenAI-style HTTP, closed loop):" in capsys.readouterr().out
    report = json.loads((out / "bench.json").read_text())
    points = report["embeddings"]
    assert [(p["server"], p["texts_per_request"], p["callers"]) for p in points] == [
        ("trtserve", 1, 1), ("trtserve", 32, 1)]
    for p in points:
        assert p["errors"] == {} and p["requests"] > 0, p
        assert p["texts_per_s"] > 0 and p["p50_ms"] > 0 and p["server_cpu_us_per_text"] > 0, p
    # No peer ran: no embeddings target is checked.
    assert not [t for t in report["targets"] if " embeddings " in t["name"]]
