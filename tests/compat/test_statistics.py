"""tritonclient's get_inference_statistics shows real numbers, the same as the metrics endpoint."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from integration.helpers import scrape
from trtserve.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stats_server(tmp_path_factory):
    """A server of its own (the session one serves other tests' traffic), with metrics."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "tiny").symlink_to(ROOT / "engines" / "tiny", target_is_directory=True)
    port = free_port()
    with ServerProcess(repo, "--metrics-port", str(port)) as server:
        yield server.url, port




def test_statistics_count_a_known_workload_and_match_the_metrics(stats_server):
    url, metrics_port = stats_server
    client = tc.InferenceServerClient(url)
    rows = [1, 3, 2, 4, 1, 5, 2, 2]
    for n in rows:
        inp = tc.InferInput("INPUT", [n, 64], "FP32")
        inp.set_data_from_numpy(np.ones((n, 64), np.float32))
        client.infer("tiny", [inp])
    bad = tc.InferInput("INPUT", [64], "FP32")
    bad.set_data_from_numpy(np.ones(64, np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("tiny", [bad])

    stats = client.get_inference_statistics("tiny", as_json=True)["model_stats"][0]
    infer = stats["inference_stats"]
    m = scrape(metrics_port)

    def metric(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    assert stats["name"] == "tiny" and stats["version"] == "1"
    assert int(infer["success"]["count"]) == len(rows) == metric("trtserve_requests_total", model="tiny", code="OK")
    assert int(infer["fail"]["count"]) == 1 == metric("trtserve_requests_total", model="tiny", code="INVALID_ARGUMENT")
    assert int(infer["success"]["ns"]) > 0
    duration = metric("trtserve_request_duration_seconds_sum", model="tiny", code="OK")
    assert int(infer["success"]["ns"]) / 1e9 == pytest.approx(duration, rel=1e-3)
    rows_run = metric("trtserve_batch_size_rows_sum", model="tiny", version="1")
    assert int(stats["inference_count"]) == sum(rows) == rows_run
    executions = int(stats["execution_count"])
    runs = metric("trtserve_batch_size_rows_count", model="tiny", version="1")
    assert 1 <= executions <= len(rows) and executions == runs
    batch_stats = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(batch_stats.values()) == executions
    assert sum(size * runs for size, runs in batch_stats.items()) == sum(rows)
    assert abs(int(stats["last_inference"]) / 1000 - time.time()) < 60
    # Every request was queued and ran once (the dispatcher's stats hooks; a 0 fails, not skips).
    # JSON leaves a zero count out, hence .get.
    queued = metric("trtserve_queue_duration_seconds_count", model="tiny", version="1")
    assert int(infer["queue"].get("count", 0)) == len(rows) == queued
    assert int(infer["compute_infer"].get("count", 0)) == len(rows)
