"""Long texts embedded whole (issue 40): the ``long_text`` request parameter ``"chunk"`` on gRPC and
KServe REST, the ``long_text`` field of ``/v1/embeddings`` and ``trtserve bulk --long-text chunk``.

A real server on 127.0.0.1 (``ServerThread``: gRPC and HTTP doors, the engine core, minilm on ONNX
Runtime). The reference is built through the same server one request at a time: each window of a
~2,900-word document (windows from the handler's documented rule, ``windows``) is sent as the text it
covers, under the default truncation, and the window embeddings are averaged weighted by their
token counts, then L2-normalised. The chunked answer must equal it within 1e-5 on every door; a
text of one window must equal today's (truncated) answer (its window's embedding, unpooled: within
1e-6, what batching beside other rows may change); usage counts every token the model read.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import subprocess
import sys

import grpc
import numpy as np
import openai
import pytest
from test_http_rest import link_models, request
from tokenizers import Tokenizer

from integration.helpers import SHARED_DATA, word_pieces
from servers import ServerThread

CORPUS = SHARED_DATA / "corpus" / "multi30k_en_captions.jsonl.gz"
TOL = 1e-5
SHORT = ["A man is playing a guitar.", "Caf\u00e9 cr\u00e8me"]


def captions(n: int) -> list[str]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """Two documents of about 2,900 and 1,000 words (17 and 6 windows): corpus captions joined."""
    lines = captions(400)
    return [" ".join(lines[:160]), " ".join(lines[160:215])]


@pytest.fixture(scope="module")
def handler_module(engines):
    module_spec = importlib.util.spec_from_file_location("long_text_minilm_handler", engines / "minilm" / "handler.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pieces(engines) -> Tokenizer:
    """minilm's tokenizer with neither truncation, padding nor special tokens: a text's word pieces."""
    return word_pieces(engines)


@pytest.fixture(scope="module")
def srv(engines, tmp_path_factory):
    root = link_models(engines, tmp_path_factory.mktemp("repo") / "models", "minilm", "tiny")
    with ServerThread(root, frontends=1, http=True) as server:
        yield server


def texts_array(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def window_texts(text: str, pieces: Tokenizer, handler_module) -> list[tuple[str, int]]:
    """Each window of ``text`` as the text it covers and the tokens the model reads of it
    ([CLS] and [SEP] included), checking the covered text tokenizes to exactly the window's pieces."""
    enc = pieces.encode(text, add_special_tokens=False)
    out = []
    for start, end in handler_module.windows(enc.word_ids, 254, 190):
        part = text[enc.offsets[start][0]:enc.offsets[end - 1][1]]
        assert pieces.encode(part, add_special_tokens=False).ids == enc.ids[start:end]
        out.append((part, end - start + 2))
    return out


def window_by_window(srv: ServerThread, text: str, pieces: Tokenizer, handler_module) -> tuple[np.ndarray, int]:
    """The pooled embedding of ``text`` computed from its windows sent one request at a time, and
    the tokens the model read."""
    parts = window_texts(text, pieces, handler_module)
    assert len(parts) > 1
    with srv.client() as g:
        rows = [g.infer("minilm", {"TEXT": texts_array([part])})["EMBEDDING"][0].astype(np.float64)
                for part, _ in parts]
    weights = np.array([n for _, n in parts], dtype=np.float64)
    pooled = (np.stack(rows) * weights[:, None]).sum(axis=0)
    return pooled / np.linalg.norm(pooled), int(weights.sum())


def test_windows_cover_every_piece_overlap_and_keep_words_whole(docs, pieces, handler_module):
    enc = pieces.encode(docs[0], add_special_tokens=False)
    spans = handler_module.windows(enc.word_ids, 254, 190)
    assert spans[0][0] == 0 and spans[-1][1] == len(enc.ids) > 1500
    for (s0, e0), (s1, e1) in itertools.pairwise(spans):
        assert s0 < s1 < e0 < e1 and e0 - s0 <= 254  # each overlaps the one before
        for cut in (s1, e0):  # neither the next start nor this end falls inside a word
            assert enc.word_ids[cut] != enc.word_ids[cut - 1]
    assert handler_module.windows([0, 1, 2], 254, 190) == [(0, 3)]
    # one word longer than a window: cut inside it, still covered, still progressing
    assert handler_module.windows([0] * 10, 4, 3) == [(0, 4), (3, 7), (6, 10)]


def test_pooled_vector_equals_window_by_window_on_every_door(srv, docs, pieces, handler_module):
    reference, _ = window_by_window(srv, docs[0], pieces, handler_module)
    with srv.client() as g:
        got = g.infer("minilm", {"TEXT": texts_array(docs[:1])}, long_text="chunk")["EMBEDDING"][0]
        truncated = g.infer("minilm", {"TEXT": texts_array(docs[:1])})["EMBEDDING"][0]
    assert float(np.abs(got - reference).max()) <= TOL
    assert float(np.abs(truncated - reference).max()) > 100 * TOL  # the whole text, not its first window
    body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": docs[:1]}],
            "parameters": {"long_text": "chunk"}}
    status, _, answer = request(srv.http_url, "POST", "/v2/models/minilm/infer", json.dumps(body))
    assert status == 200, answer
    rest_row = np.array(json.loads(answer)["outputs"][0]["data"], dtype=np.float32)
    assert float(np.abs(rest_row - reference).max()) <= TOL


def test_each_text_of_a_request_pools_its_own_windows(srv, docs, pieces, handler_module):
    texts = [docs[0], SHORT[0], docs[1]]
    with srv.client() as g:
        together = g.infer("minilm", {"TEXT": texts_array(texts)}, long_text="chunk")["EMBEDDING"]
        short = g.infer("minilm", {"TEXT": texts_array(SHORT[:1])})["EMBEDDING"][0]
    assert float(np.abs(together[0] - window_by_window(srv, docs[0], pieces, handler_module)[0]).max()) <= TOL
    assert float(np.abs(together[2] - window_by_window(srv, docs[1], pieces, handler_module)[0]).max()) <= TOL
    np.testing.assert_allclose(together[1], short, atol=1e-6)  # batched beside padded windows: engine tolerance


def test_a_text_of_one_window_equals_the_truncated_answer(srv):
    with srv.client() as g:
        chunked = g.infer("minilm", {"TEXT": texts_array(SHORT)}, long_text="chunk")["EMBEDDING"]
        today = g.infer("minilm", {"TEXT": texts_array(SHORT)})["EMBEDDING"]
    np.testing.assert_allclose(chunked, today, rtol=0, atol=1e-6)  # the same rows, batched as the engine may


def test_openai_long_text_and_its_usage(srv, docs, pieces, handler_module):
    reference, read = window_by_window(srv, docs[0], pieces, handler_module)
    with openai.OpenAI(base_url=f"http://{srv.http_url}/v1", api_key="unused", max_retries=0) as client:
        result = client.embeddings.create(model="minilm", input=[docs[0], SHORT[0]], encoding_format="float",
                                          extra_body={"long_text": "chunk"})
        truncated = client.embeddings.create(model="minilm", input=[docs[0]], encoding_format="float")
    got = np.array(result.data[0].embedding, dtype=np.float32)
    assert float(np.abs(got - reference).max()) <= TOL
    short_tokens = len(pieces.encode(SHORT[0]).ids)
    assert result.usage.prompt_tokens == result.usage.total_tokens == read + short_tokens
    assert truncated.usage.prompt_tokens == 256


@pytest.mark.parametrize("door", ["grpc", "openai"])
def test_refusals_name_what_is_wrong(srv, door):
    cases = [  # (model, texts, long_text, status words)
        ("minilm", ["hello"], "whole", "long_text"),
        ("minilm", ["hello", "word " * 300_000], "chunk", "row 1 has 1500000 characters, more than the 262144"),
    ]
    if door == "grpc":
        cases.append(("tiny", None, "chunk", "cannot embed a long text whole"))
    for model, texts, long_text, words in cases:
        if door == "grpc":
            request_ = (texts_array(texts) if texts else {"INPUT": np.zeros((1, 64), np.float32)})
            inputs = request_ if isinstance(request_, dict) else {"TEXT": request_}
            with srv.client() as g, pytest.raises(grpc.RpcError) as err:
                g.infer(model, inputs, long_text=long_text)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.value.details()
        else:
            status, _, answer = request(srv.http_url, "POST", "/v1/embeddings",
                                        json.dumps({"model": model, "input": texts, "long_text": long_text}))
            assert status == 400 and words in json.loads(answer)["error"]["message"], answer


def test_bulk_long_text_chunk(srv, docs, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate([*docs, SHORT[0]])))
    out = tmp_path / "emb.parquet"
    proc = subprocess.run([sys.executable, "-m", "trtserve.cli", "bulk", "--input", str(source), "--model", "minilm",
                           "--output", str(out), "--endpoint", srv.url, "--long-text", "chunk", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(out)
    rows = dict(zip(table.column("id").to_pylist(),
                    table.column("EMBEDDING").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)))
    with srv.client() as g:
        direct = g.infer("minilm", {"TEXT": texts_array([*docs, SHORT[0]])}, long_text="chunk")["EMBEDDING"]
    worst = max(float(np.abs(rows[i] - direct[i]).max()) for i in range(3))
    assert worst <= TOL
