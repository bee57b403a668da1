"""The main job on real text: all-MiniLM-L6-v2 served with its tokenizing handler."""

from __future__ import annotations

import asyncio
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from helpers import SHARED_DATA

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request
from trtserve.harness.demo import REFERENCE_SPEARMAN, embed_stream, read_stsb, spearman_of_cosines
from trtserve.testing.models import config_text, mean_over_sequence, write_model
from trtserve.tools.check import check_model


def text(*values: bytes) -> dict[str, np.ndarray]:
    return {"TEXT": np.array([[v] for v in values], dtype=object)}


@pytest.mark.timeout(900)
def test_stsb_dev_through_the_live_server_reproduces_the_reference(server):
    first, second, gold = read_stsb(SHARED_DATA / "stsb" / "dev.tsv")
    sentences = [(str(i), s) for i, s in enumerate(first + second)]
    with server.client() as c:
        emb = dict(embed_stream(c, sentences, inflight=128))
    vectors = np.stack([emb[str(i)] for i in range(len(sentences))])
    rho = spearman_of_cosines(vectors[: len(first)], vectors[len(first) :], gold)
    assert abs(rho - REFERENCE_SPEARMAN) <= 0.001, rho


def test_batching_changes_no_embedding_on_real_text(server):
    first, _, _ = read_stsb(SHARED_DATA / "stsb" / "dev.tsv")
    sentences = sorted(first[:400], key=len)[::6][:64]  # 64 sentences of mixed lengths
    assert len({len(s.split()) for s in sentences}) > 10
    with server.client() as c:
        alone = [c.infer("minilm", text(s.encode()))["EMBEDDING"][0] for s in sentences]
        together = c.infer("minilm", text(*(s.encode() for s in sentences)))["EMBEDDING"]
        streamed = dict(embed_stream(c, [(str(i), s) for i, s in enumerate(sentences)], inflight=64))
    assert together.shape == (64, 384)
    np.testing.assert_allclose(together, np.stack(alone), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.stack([streamed[str(i)] for i in range(64)]), np.stack(alone), atol=1e-5, rtol=0)


def test_empty_and_overlong_texts_get_embeddings(server):
    with server.client() as c:
        out = c.infer("minilm", text(b"", ("word " * 2000).encode()))["EMBEDDING"]
    assert out.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "inputs, words",
    [
        (text(b"fine", b"\xff\xfe broken"), ["TEXT", "row 1", "UTF-8"]),
        ({"TEXT": np.ones((1, 1), np.float32)}, ["TEXT", "FP32", "BYTES"]),
        ({"OTHER": np.array([[b"x"]], dtype=object)}, ["OTHER", "TEXT"]),
    ],
    ids=["non-utf8", "wrong-datatype", "missing-text"],
)
def test_bad_text_inputs_are_invalid_argument(server, inputs, words):
    with server.client() as c, pytest.raises(grpc.RpcError) as err:
        c.stub.ModelInfer(build_request("minilm", inputs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in err.value.details()


FANOUT_HANDLER = '''
import numpy as np

class Handler:
    """One request -> three engine segments (x, 2x, 3x); the answer is their mean."""

    def __init__(self, model_dir, spec):
        pass

    def preprocess(self, inputs):
        x = inputs["INPUT"]
        return [{"INPUT": x}, {"INPUT": 2 * x}, {"INPUT": 3 * x}]

    def postprocess(self, inputs, outputs):
        return {"OUTPUT": np.mean([o["OUTPUT"] for o in outputs], axis=0)}
'''


def test_handler_fan_out_is_gathered_under_concurrent_load(make_server, tmp_path, engines):
    model_dir = tmp_path / "fanout"
    (model_dir / "1").mkdir(parents=True)
    shutil.copy(engines / "tiny" / "1" / "model.onnx", model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(
        config_text("fanout", [("INPUT", "FP32", (64,))], [("OUTPUT", "FP32", (16,))], max_batch_size=8)
    )
    (model_dir / "handler.py").write_text(FANOUT_HANDLER)
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1 + i % 2, 64)).astype(np.float32) for i in range(64)]
    expected = [np.mean([session.run(None, {"INPUT": k * x})[0] for k in (1, 2, 3)], axis=0) for x in xs]
    srv = make_server(tmp_path)
    barrier = threading.Barrier(16)

    def client(k):
        with srv.client() as c:
            barrier.wait()
            return [np.abs(c.infer("fanout", {"INPUT": xs[j]})["OUTPUT"] - expected[j]).max() for j in range(k, 64, 16)]

    with ThreadPoolExecutor(16) as pool:
        diffs = [d for ds in pool.map(client, range(16)) for d in ds]
    assert len(diffs) == 64 and max(diffs) < 1e-5
    assert srv.registry.get("fanout").dispatcher.stats.mean_batch_size > 1


def test_check_passes_for_minilm(engines):
    report = asyncio.run(check_model(engines, "minilm", samples=24))
    assert report.ok, report
    assert report.mean_batch_size > 1


def test_check_catches_a_batch_unsafe_model(tmp_path):
    write_model(
        tmp_path, "meanpool", mean_over_sequence(),
        config_text("meanpool", [("INPUT0", "FP32", (-1,))], [("OUTPUT0", "FP32", (1,))]),
    )
    report = asyncio.run(check_model(tmp_path, "meanpool", samples=16))
    assert not report.ok
    assert report.max_diff["OUTPUT0"] > 1e-3


def test_minilm_metadata_is_the_client_facing_interface(server):
    with server.client() as c:
        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="minilm"))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("TEXT", "BYTES", [-1, 1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("EMBEDDING", "FP32", [-1, 384])]


def test_statistics_count_a_multi_text_request_once(server):
    """The handler fans one request out into a segment per text; ModelStatistics still counts
    requests (Triton's meaning): one success and one compute_infer for a 3-text request."""
    texts = np.array([[b"A man plays a guitar."], [b"Someone plays music."], [b"A dog runs."]], dtype=object)

    def counts(c) -> tuple[int, int]:
        stats = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="minilm")).model_stats[0].inference_stats
        return stats.success.count, stats.compute_infer.count

    with server.client() as c:
        before = counts(c)
        c.infer("minilm", {"TEXT": texts}, timeout=60)
        after = counts(c)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
