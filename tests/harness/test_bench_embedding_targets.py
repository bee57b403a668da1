"""The embeddings comparison's pure parts: request bodies, the targets against a peer, and the
``--peer`` list. Small fixed inputs, exact answers; nothing here times anything."""

from __future__ import annotations

import argparse

import orjson
import pytest

from trtserve.harness.bench import _peers
from trtserve.harness.benchlib.embeddings import EmbeddingPoint, embeddings_targets, request_bodies


def point(server: str, per_request: int, callers: int, texts_per_s: float, p50_ms: float,
          errors: dict[str, int] | None = None) -> EmbeddingPoint:
    return EmbeddingPoint(server=server, model="minilm", texts_per_request=per_request, callers=callers,
                          window_s=3.0, requests=10, texts_per_s=texts_per_s, p50_ms=p50_ms, p99_ms=2 * p50_ms,
                          errors=errors or {})


def test_request_bodies_hold_consecutive_texts_in_openai_shape():
    bodies = [orjson.loads(b) for b in request_bodies("minilm", ["a", "b", "c", "d", "e"], 2)]
    assert bodies == [{"model": "minilm", "input": ["a", "b"]}, {"model": "minilm", "input": ["c", "d"]}]
    # Fewer texts than one request: they repeat to fill it.
    assert orjson.loads(request_bodies("m", ["a", "b"], 3)[0])["input"] == ["a", "b", "a"]
    with pytest.raises(ValueError, match="no corpus"):
        request_bodies("m", [], 1)


def test_targets_need_1_2x_the_peers_texts_per_s_everywhere_and_its_p50_at_one_caller():
    points = [
        point("trtserve", 1, 1, 120.0, 8.0), point("trtserve", 1, 4, 200.0, 20.0),
        point("trtserve", 32, 1, 100.0, 300.0, errors={"503": 1}),
        point("infinity", 1, 1, 100.0, 9.0), point("infinity", 1, 4, 170.0, 15.0),
        point("infinity", 32, 1, 50.0, 400.0),
    ]
    verdicts = {t.name: t.verdict for t in embeddings_targets(points)}
    assert verdicts == {
        "minilm embeddings 1 text(s)/request, 1 caller(s): texts/s >= 1.2 x infinity": "PASS",  # 1.20x
        "minilm embeddings 1 text(s)/request, 1 caller(s): p50 <= infinity's": "PASS",
        "minilm embeddings 1 text(s)/request, 4 caller(s): texts/s >= 1.2 x infinity": "MISS",  # 1.18x
        # 2x the throughput, but an error on trtserve's side: a miss, and so is its p50.
        "minilm embeddings 32 text(s)/request, 1 caller(s): texts/s >= 1.2 x infinity": "MISS",
        "minilm embeddings 32 text(s)/request, 1 caller(s): p50 <= infinity's": "MISS",
    }
    assert embeddings_targets([p for p in points if p.server == "trtserve"]) == []


def test_peer_list_is_comma_separated_known_names():
    assert _peers("triton, infinity,triton") == ["triton", "infinity"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown peer"):
        _peers("triton,tei")
