"""``dimensions`` in ``/v1/embeddings`` (issue 40): honoured only for a model whose config declares
the shortened lengths it was trained for (``matryoshka_dimensions``), by cutting each embedding
to its first ``dimensions`` numbers and L2-normalising it again; refused with a sentence for
minilm, which declares none, and for a length the model does not list; a malformed parameter
refuses the model at load.

``minilm_mrl`` is minilm's directory (its handler and version linked) under a config that
declares ``64,128,256``: the mechanism under test, not a claim that minilm was trained for it.
A real server on 127.0.0.1 (``ServerThread``), the official ``openai`` client.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import openai
import pytest
from test_http_rest import link_models, request

from servers import ServerThread
from trtserve.repository import ConfigError, load_spec

TEXTS = ["A man is playing a guitar.", "The weather is lovely today."]


def mrl_model(engines: Path, root: Path, name: str, dimensions: str | None, *, declare: bool = True) -> Path:
    """minilm's handler and version 1 under a config named ``name`` with ``matryoshka_dimensions``."""
    model = root / name
    model.mkdir(parents=True)
    for part in ("1", "handler.py"):
        (model / part).symlink_to(engines / "minilm" / part)
    config = (engines / "minilm" / "config.pbtxt").read_text().replace('name: "minilm"', f'name: "{name}"')
    if not declare:
        config = re.sub(r'parameters \{ key: "openai_embeddings"[^\n]*\n', "", config)
    if dimensions is not None:
        config += f'parameters {{ key: "matryoshka_dimensions" value: {{ string_value: "{dimensions}" }} }}\n'
    (model / "config.pbtxt").write_text(config)
    return model


@pytest.fixture(scope="module")
def srv(engines, tmp_path_factory):
    root = link_models(engines, tmp_path_factory.mktemp("repo") / "models", "minilm")
    mrl_model(engines, root, "minilm_mrl", "256, 64,128")
    with ServerThread(root, frontends=1, http=True) as server:
        yield server


@pytest.fixture
def client(srv):
    with openai.OpenAI(base_url=f"http://{srv.http_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def embeddings(client, model: str, **extra) -> np.ndarray:
    result = client.embeddings.create(model=model, input=TEXTS, encoding_format="float", **extra)
    return np.array([d.embedding for d in result.data], dtype=np.float32)


@pytest.mark.parametrize("dimensions", [64, 128, 256])
def test_a_declared_length_is_the_full_embedding_cut_and_renormalised(client, dimensions):
    full = embeddings(client, "minilm_mrl")
    short = embeddings(client, "minilm_mrl", dimensions=dimensions)
    assert short.shape == (len(TEXTS), dimensions)
    expected = full[:, :dimensions] / np.linalg.norm(full[:, :dimensions], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-6)


def test_base64_carries_the_shortened_embedding(srv, client):
    status, _, body = request(srv.http_url, "POST", "/v1/embeddings", json.dumps(
        {"model": "minilm_mrl", "input": TEXTS, "dimensions": 64, "encoding_format": "base64"}))
    assert status == 200
    rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in json.loads(body)["data"]])
    np.testing.assert_array_equal(rows, embeddings(client, "minilm_mrl", dimensions=64))


def test_the_full_length_is_the_embedding_as_it_is(client):
    np.testing.assert_array_equal(embeddings(client, "minilm_mrl", dimensions=384), embeddings(client, "minilm_mrl"))


@pytest.mark.parametrize("model, dimensions, words", [
    ("minilm", 128, "was not trained to give shortened ones (its config has no 'matryoshka_dimensions' parameter)"),
    ("minilm_mrl", 100, "gives embeddings of 64, 128, 256, 384 dimensions, not 100"),
])
def test_other_lengths_are_refused_with_a_sentence(srv, model, dimensions, words):
    status, _, body = request(srv.http_url, "POST", "/v1/embeddings",
                              json.dumps({"model": model, "input": "hello", "dimensions": dimensions}))
    error = json.loads(body)["error"]
    assert status == 400 and words in error["message"] and error["param"] == "dimensions", error


@pytest.mark.parametrize("value, declare, words", [
    ("64,abc", True, "must list the shortened embedding lengths"),
    ("384", True, "whole numbers from 1 to 383"),
    ("64", False, "read only by the OpenAI embeddings API"),
])
def test_a_malformed_or_unread_parameter_refuses_the_model_at_load(engines, tmp_path, value, declare, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_spec(mrl_model(engines, tmp_path, "bad", value, declare=declare))
