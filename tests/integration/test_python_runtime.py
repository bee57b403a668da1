"""Python models (platform ``python``) on a real server: batching, deadlines, failures, isolation."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from helpers import SHARED_DATA

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request

ISOLATIONS = ["thread", "process"]


def write_python_model(
    root: Path,
    name: str,
    source: str,
    *,
    isolation: str = "thread",
    dims: tuple[int, ...] = (-1,),
    max_batch_size: int = 8,
) -> None:
    """``root/name``: ``1/model.py`` from ``source``; INPUT0 → OUTPUT0, both FP32 ``dims``."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    shape = ", ".join(map(str, dims))
    batching = "dynamic_batching { }" if max_batch_size else ""
    (root / name / "config.pbtxt").write_text(
        f"""
        name: "{name}" backend: "python" max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {shape} ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {shape} ] }} ]
        {batching}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "isolation" value: {{ string_value: "{isolation}" }} }}
        """
    )


DOUBLE = """
    import time


    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            time.sleep(0.002)  # a batch takes a moment, so requests queue behind it and batch
            return {"OUTPUT0": inputs["INPUT0"] * 2}
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_16_concurrent_clients_unary_and_streaming_are_batched(make_server, tmp_path, isolation):
    write_python_model(tmp_path, "double", DOUBLE, isolation=isolation)
    srv = make_server(tmp_path)
    rng = np.random.default_rng(11)
    # Rows of varying width, so batches are padded and cut back.
    inputs = [rng.standard_normal((1 + i % 3, 1 + i % 5)).astype(np.float32) for i in range(16 * 12)]
    start = threading.Barrier(16)

    def client(k: int) -> int:
        mine = inputs[k::16]
        with srv.client() as c:
            start.wait()
            for x in mine[:6]:
                np.testing.assert_array_equal(c.infer("double", {"INPUT0": x})["OUTPUT0"], 2 * x)
            streamed = dict(c.stream_infer("double", ({"INPUT0": x} for x in mine[6:])))
        assert sorted(streamed) == [str(i) for i in range(len(mine) - 6)]
        for i, x in enumerate(mine[6:]):
            np.testing.assert_array_equal(streamed[str(i)]["OUTPUT0"], 2 * x)
        return len(mine)

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(client, range(16))) == len(inputs)
    stats = srv.registry.get("double").dispatcher.stats
    assert max(stats.batch_sizes) > 1, stats.batch_sizes
    assert stats.batches < len(inputs)


def test_model_without_batch_dimension(make_server, tmp_path):
    write_python_model(tmp_path, "double", DOUBLE, dims=(2, 3), max_batch_size=0)
    srv = make_server(tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with srv.client() as c:
        np.testing.assert_array_equal(c.infer("double", {"INPUT0": x})["OUTPUT0"], 2 * x)


def test_slow_expired_requests_are_never_executed(make_server, engines, tmp_path):
    # A server of its own, with two priority levels: urgent requests (1) keep the slot busy
    # while the others (2, the default) wait behind them.
    shutil.copytree(engines / "slow", tmp_path / "slow")
    config = tmp_path / "slow" / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            "dynamic_batching { }", "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"
        )
    )
    srv = make_server(tmp_path)
    served = srv.registry.get("slow")
    model = served.backend.models[0]
    executed, expired = model.executed, served.dispatcher.stats.expired_before_run
    x = np.ones((8, 4), np.float32)
    with srv.client() as c, ThreadPoolExecutor(8) as pool:
        # Four batches of 8 rows, 28 ms each (20 ms + 1 ms/row).
        urgent = [pool.submit(c.infer, "slow", {"INPUT0": x}, priority=1) for _ in range(4)]
        deadline = time.monotonic() + 5
        while served.dispatcher.idle_slots and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert not served.dispatcher.idle_slots
        # Admitted (40 ms leave room for a batch), but it waits behind the urgent batches
        # until it can no longer finish in time: expired in the queue, never run.
        queued = pool.submit(c.stub.ModelInfer, build_request("slow", {"INPUT0": x[:3]}, timeout_us=40_000))
        # 1 ms cannot fit a 21 ms batch: answered at once, never queued.
        hopeless = pool.submit(c.stub.ModelInfer, build_request("slow", {"INPUT0": x[:2]}, timeout_us=1000))
        patient = pool.submit(c.infer, "slow", {"INPUT0": x[:1]}, timeout=10)
        for call, when in ((queued, "in the queue; it was not run"), (hopeless, "before it could run")):
            with pytest.raises(grpc.RpcError) as err:
                call.result()
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert when in err.value.details()
        for out in (f.result() for f in urgent):
            np.testing.assert_array_equal(out["OUTPUT0"], x)
        np.testing.assert_array_equal(patient.result()["OUTPUT0"], x[:1])
        stats = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow")).model_stats[0]
    # The urgent requests ran as four full batches, the patient row alone.
    assert {b.batch_size: b.compute_infer.count for b in stats.batch_stats} == {8: 4, 1: 1}
    assert model.executed - executed == 4 * 8 + 1  # the urgent batches and the patient row, nothing else
    assert served.dispatcher.stats.expired_before_run - expired == 2


FAULTY = """
    import os

    import numpy as np


    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            x = inputs["INPUT0"]
            code = int(x[0, 0])
            if code == 1:
                raise ValueError("bad value 1")
            if code == 2:
                return {"OUTPUT0": x.astype(np.float64)}
            if code == 3:
                return {"OUTPUT0": np.concatenate([x, x])}
            if code == 4:
                return {"OUTPUT0": x[:, :3]}
            if code == 5:
                return {"OTHER": x}
            if code == 6:
                os._exit(3)
            return {"OUTPUT0": x + 1}
"""

FAILURES = {
    "exception": (1, ["ValueError", "bad value 1"]),
    "wrong dtype": (2, ["OUTPUT0", "FP32", "float64"]),
    "wrong rows": (3, ["OUTPUT0", "[1, 4]", "[2, 4]"]),
    "wrong dims": (4, ["OUTPUT0", "[1, 4]", "[1, 3]"]),
    "missing output": (5, ["OUTPUT0", "no output", "OTHER"]),
}


@pytest.fixture(scope="module", params=ISOLATIONS)
def faulty(request, tmp_path_factory):
    """A server with the ``faulty`` model in thread or process isolation."""
    from servers import ServerThread

    root = tmp_path_factory.mktemp(f"faulty-{request.param}")
    write_python_model(root, "faulty", FAULTY, isolation=request.param, dims=(4,))
    with ServerThread(root) as srv:
        yield srv


def faulty_input(code: int) -> np.ndarray:
    x = np.zeros((1, 4), np.float32)
    x[0, 0] = code
    return x


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failing_predict_fails_only_its_batch(faulty, case):
    code, words = FAILURES[case]
    with faulty.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.infer("faulty", {"INPUT0": faulty_input(code)})
        np.testing.assert_array_equal(c.infer("faulty", {"INPUT0": faulty_input(0)})["OUTPUT0"], faulty_input(0) + 1)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    for word in words:
        assert word in err.value.details()


def test_a_stream_survives_a_failing_batch(faulty):
    failed = threading.Event()

    def items():
        yield "bad", {"INPUT0": faulty_input(1)}
        failed.wait(10)  # the next message goes in a batch of its own
        yield "good", {"INPUT0": faulty_input(0)}

    results = {}
    with faulty.client() as c:
        for request_id, result in c.stream_infer("faulty", items()):
            results[request_id] = result
            failed.set()
    assert results["bad"].code == "INTERNAL" and "bad value 1" in results["bad"].message
    np.testing.assert_array_equal(results["good"]["OUTPUT0"], faulty_input(0) + 1)


def workers(name: str) -> list[multiprocessing.Process]:
    """The server's (in-process) worker processes of model ``name``."""
    return [p for p in multiprocessing.active_children() if p.name.startswith(f"trtserve-{name}-slot")]


def test_a_worker_that_dies_during_a_batch_is_replaced(make_server, tmp_path):
    write_python_model(tmp_path, "crashy", FAULTY, isolation="process", dims=(4,))
    srv = make_server(tmp_path)
    (before,) = workers("crashy")
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.infer("crashy", {"INPUT0": faulty_input(6)})
        np.testing.assert_array_equal(c.infer("crashy", {"INPUT0": faulty_input(0)})["OUTPUT0"], faulty_input(0) + 1)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "worker process for slot 0 died (exit code 3); restarted" in err.value.details()
    (after,) = workers("crashy")
    assert after.pid != before.pid and not before.is_alive()

    os.kill(after.pid, signal.SIGKILL)  # dies between batches: replaced before the next one
    after.join(10)
    with srv.client() as c:
        np.testing.assert_array_equal(c.infer("crashy", {"INPUT0": faulty_input(0)})["OUTPUT0"], faulty_input(0) + 1)
    (replaced,) = workers("crashy")
    srv.stop()
    assert not replaced.is_alive() and not workers("crashy")


def test_bad_python_models_are_unavailable_with_a_reason(make_server, tmp_path):
    write_python_model(tmp_path, "bogus_isolation", DOUBLE, isolation="fork")
    write_python_model(tmp_path, "no_model_class", "class Predictor:\n    pass\n")
    source = "class Model:\n    def setup(self, config):\n        raise OSError('no weights')\n"
    write_python_model(tmp_path, "setup_fails", source, isolation="process")
    write_python_model(tmp_path, "ok", DOUBLE)
    srv = make_server(tmp_path)
    reasons = {name: entry.reason for name, entry in srv.registry.models.items()}
    assert reasons["ok"] == ""
    assert "isolation" in reasons["bogus_isolation"] and "fork" in reasons["bogus_isolation"]
    assert "no class 'Model'" in reasons["no_model_class"]
    assert "OSError: no weights" in reasons["setup_fails"]
    assert not workers("setup_fails")


def test_minilm_torch_equals_the_onnx_model(server):
    lines = (SHARED_DATA / "stsb" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:101]
    texts = np.array([[line.split("\t")[1].encode()] for line in lines], dtype=object)
    with server.client() as c:
        torch_emb = c.infer("minilm_torch", {"TEXT": texts})["EMBEDDING"]
        onnx_emb = c.infer("minilm", {"TEXT": texts})["EMBEDDING"]
    assert torch_emb.shape == onnx_emb.shape == (100, 384)
    assert np.abs(torch_emb - onnx_emb).max() <= 1e-4


def test_the_readme_example_model_scale_serves_and_is_batch_safe(server, engines):
    import asyncio

    from trtserve.tools.check import check_model

    rows = [np.arange(n, dtype=np.float32)[np.newaxis] for n in (3, 7)]
    with server.client() as c:
        for x in rows:
            assert c.infer("scale", {"X": x}, timeout=30)["Y"].tolist() == (3 * x).tolist()
        streamed = dict(c.stream_infer("scale", [{"X": x} for x in rows]))
    assert [streamed[str(i)]["Y"].tolist() for i in range(2)] == [(3 * x).tolist() for x in rows]
    report = asyncio.run(check_model(engines, "scale", samples=16))
    assert report.ok and report.mean_batch_size > 1
