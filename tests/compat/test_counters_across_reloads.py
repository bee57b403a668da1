"""Counters never go backwards: every Prometheus counter (``*_total``, and a histogram's
``_count`` and ``_sum``) and every ModelStatistics count of a version is at least what it was
before, across a reload with a changed config, a version added, a version removed, and an
unload and a load (explicit model control mode, the unchanged tritonclient); and the per-model
series carry the version they count (``version`` label).

A copy of ``tiny`` serving every version (``version_policy { all { } }``) gets a few requests
before each step, so each counter has something to lose.
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request

import numpy as np
import tritonclient.grpc as tc
from prometheus_client.parser import text_string_to_metric_families

from trtserve.testing import ServerProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) → value of every counter and histogram count/sum sample."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text) if f.type in ("counter", "histogram")
        for s in f.samples if not s.name.endswith("_created")
    }


def statistics(client: tc.InferenceServerClient) -> dict[tuple[str, str], int]:
    """(version, field) → count of every ModelStatistics count of ``tiny``."""
    out = {}
    for m in client.get_inference_statistics("tiny", as_json=True).get("model_stats", []):
        v = m["version"]
        out[v, "inference_count"] = int(m.get("inference_count", 0))
        out[v, "execution_count"] = int(m.get("execution_count", 0))
        for field, value in m["inference_stats"].items():
            out[v, field] = int(value.get("count", 0))
        for batch in m.get("batch_stats", []):
            out[v, f"batch {batch['batch_size']}"] = int(batch["compute_infer"].get("count", 0))
    return out


def infer(client: tc.InferenceServerClient, n: int, version: str = "") -> None:
    for rows in range(1, n + 1):
        inp = tc.InferInput("INPUT", [rows, 64], "FP32")
        inp.set_data_from_numpy(np.ones((rows, 64), np.float32))
        client.infer("tiny", [inp], model_version=version)


def not_lower(after: dict, before: dict, step: str) -> None:
    lost = {k: (v, after[k]) for k, v in before.items() if k in after and after[k] < v}
    assert not lost, (step, lost)


def test_counters_and_statistics_never_go_backwards(tmp_path, engines):
    root = tmp_path / "repository"
    shutil.copytree(engines / "tiny", root / "tiny")
    config = root / "tiny" / "config.pbtxt"
    config.write_text(config.read_text() + "version_policy { all { } }\n")
    port = free_port()
    with ServerProcess(root, "--frontends", "2", "--model-control-mode", "explicit", "--load-model", "tiny",
                       "--metrics-port", str(port)) as server:
        c = tc.InferenceServerClient(server.url)
        infer(c, 3)
        before, stats = counters(port), statistics(c)
        assert before[("trtserve_batch_size_rows_count", (("model", "tiny"), ("version", "1")))] > 0

        def step(name: str) -> None:
            nonlocal before, stats
            after, stats_after = counters(port), statistics(c)
            not_lower(after, before, name)
            not_lower(stats_after, stats, name)
            assert set(stats) & set(stats_after), (name, stats, stats_after)  # something was compared
            infer(c, 3)
            before, stats = counters(port), statistics(c)

        override = c.get_model_config("tiny", as_json=True)["config"]
        override["max_batch_size"] = 8
        c.load_model("tiny", config=json.dumps(override))  # a changed config: version 1 is rebuilt
        assert c.get_model_config("tiny").config.max_batch_size == 8
        step("reload with a changed config")

        shutil.copytree(root / "tiny" / "1", root / "tiny" / "2")
        c.load_model("tiny")  # version 2 added (and version 1 rebuilt: the config changed back)
        infer(c, 2, version="1")
        infer(c, 2, version="2")
        assert {v for v, _ in statistics(c)} == {"1", "2"}
        after = counters(port)
        for version in ("1", "2"):  # each version counts its own batches
            assert after[("trtserve_batch_size_rows_count", (("model", "tiny"), ("version", version)))] > 0
        step("version 2 added")

        shutil.rmtree(root / "tiny" / "2")
        c.load_model("tiny")
        assert {v for v, _ in statistics(c)} == {"1"}
        step("version 2 removed")

        c.unload_model("tiny")
        c.load_model("tiny")
        step("unload and load")

        shutil.copytree(root / "tiny" / "1", root / "tiny" / "2")
        c.load_model("tiny")  # version 2 back: it counts on from where it stopped
        step("version 2 back")
