"""``trtserve bench --modes embeddings`` against trtserve alone, at short durations: the server
under test opens its HTTP door and minilm answers ``POST /v1/embeddings`` at both request sizes
(1 and 32 texts) with no error, then the long texts (~2,000-word documents) sent whole with
``"long_text": "chunk"`` beside their windows sent as separate texts and pooled by the bench, at one
caller; every point lands in ``bench.json``, and both routes give the same embeddings. Structure
only: the figures depend on the machine and belong to ``make bench`` (``--peer infinity`` adds the
comparison), so the chunk/windows targets are only checked to be reported."""

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
         "--raw-duration", "0.05", "--requests", "80", "--long-text-callers", "1"]
    )
    assert bench.run(args) == 0
    out_text = capsys.readouterr().out
    assert "embeddings (minilm, OpenAI-style HTTP, closed loop):" in out_text
    assert "chunk / windows at 1 caller(s): texts/s" in out_text
    report = json.loads((out / "bench.json").read_text())
    points = report["embeddings"]
    assert [(p["server"], p["texts_per_request"], p["callers"]) for p in points] == [
        ("trtserve", 1, 1), ("trtserve", 32, 1)]
    for p in points:
        assert p["errors"] == {} and p["requests"] > 0, p
        assert p["texts_per_s"] > 0 and p["p50_ms"] > 0 and p["server_cpu_us_per_text"] > 0, p
    long_text = report["embeddings_long_text"]
    assert long_text["documents"] == 8 and long_text["words_per_text"] >= 2000 and long_text["windows_per_text"] > 1
    assert [(p["route"], p["point"]["callers"]) for p in long_text["points"]] == [("chunk", 1), ("windows", 1)]
    for p in long_text["points"]:
        q = p["point"]
        assert q["errors"] == {} and q["requests"] > 0 and q["texts_per_request"] == 1, p
        assert q["texts_per_s"] > 0 and q["p50_ms"] > 0 and q["server_cpu_us_per_text"] > 0, p
        assert p["client_us_per_text"] > 0, p
    assert long_text["max_abs_difference"] <= 1e-5  # the server pools as the client does
    assert set(long_text["handler_cpu_ms"]) == {"chunk", "windows"} and min(long_text["handler_cpu_ms"].values()) > 0
    # No peer ran: the only embeddings targets are the long texts' chunk against windows, texts/s and p50.
    names = [t["name"] for t in report["targets"] if " embeddings " in t["name"]]
    assert len(names) == 2 and all(n.startswith("minilm embeddings long texts, 1 caller(s): chunk ") for n in names)
