"""``POST /tokenize`` (Text Embeddings Inference's shape) and ``trtserve.v1.Tokenizer/Tokenize`` on a
real server on 127.0.0.1 (``ServerThread``, minilm and tiny): the ids, pieces and offsets of
minilm's own tokenizer, the whole text (no truncation), with and without special tokens, the same
answer on both doors, and the refusals (a model without a tokenizer, an unknown field).
"""

from __future__ import annotations

import json

import grpc
import pytest
from test_http_rest import link_models, request
from tokenizers import Tokenizer

from integration.helpers import word_pieces
from servers import ServerThread
from trtserve._proto.trtserve.v1 import tokenizer_pb2, tokenizer_pb2_grpc

TEXTS = ["Caf\u00e9 cr\u00e8me, embedding!", "word " * 600]  # the second is longer than the model's window


@pytest.fixture(scope="module")
def srv(engines, tmp_path_factory):
    root = link_models(engines, tmp_path_factory.mktemp("repo") / "models", "minilm", "tiny")
    with ServerThread(root, frontends=1, http=True) as server:
        yield server


@pytest.fixture(scope="module")
def reference(engines) -> Tokenizer:
    return word_pieces(engines)


def tokenize(srv, body) -> tuple[int, object]:
    status, _, answer = request(srv.http_url, "POST", "/tokenize", json.dumps(body))
    return status, json.loads(answer)


def test_http_tokens_are_the_models_own(srv, reference):
    status, doc = tokenize(srv, {"inputs": TEXTS})
    assert status == 200, doc
    for text, tokens in zip(TEXTS, doc):
        enc = reference.encode(text)
        assert [t["id"] for t in tokens] == enc.ids and [t["text"] for t in tokens] == enc.tokens
        assert [t["special"] for t in tokens] == [bool(m) for m in enc.special_tokens_mask]
        assert [(t["start"], t["stop"]) for t in tokens] == [
            (None, None) if m else span for m, span in zip(enc.special_tokens_mask, enc.offsets)]
    assert len(doc[1]) == 602  # whole: 600 words and [CLS], [SEP]
    assert [(t["text"], t["start"], t["stop"]) for t in doc[0][:4]] == [
        ("[CLS]", None, None), ("cafe", 0, 4), ("cr", 5, 7), ("##eme", 7, 10)]  # offsets into the text as sent


def test_one_string_without_special_tokens_and_the_model_named(srv, reference):
    status, doc = tokenize(srv, {"inputs": TEXTS[0], "add_special_tokens": False, "model": "minilm"})
    assert status == 200
    assert [t["id"] for t in doc[0]] == reference.encode(TEXTS[0], add_special_tokens=False).ids


def test_grpc_gives_the_same_tokens_and_counts(srv):
    with grpc.insecure_channel(srv.url) as channel:
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        answer = stub.Tokenize(tokenizer_pb2.TokenizeRequest(model_name="minilm", inputs=TEXTS))
        bare = stub.Tokenize(tokenizer_pb2.TokenizeRequest(model_name="minilm", inputs=TEXTS[:1],
                                                           add_special_tokens=False))
        with pytest.raises(grpc.RpcError) as err:
            stub.Tokenize(tokenizer_pb2.TokenizeRequest(model_name="tiny", inputs=["x"]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "the models with one: minilm" in err.value.details()
    _, doc = tokenize(srv, {"inputs": TEXTS})
    for tokens, text in zip(doc, answer.texts):
        assert text.count == len(tokens) == len(text.tokens)
        assert [(t.id, t.text, t.special) for t in text.tokens] == [(t["id"], t["text"], t["special"]) for t in tokens]
        assert [(t.start, t.stop) if t.HasField("start") else None for t in text.tokens] == [
            None if t["special"] else (t["start"], t["stop"]) for t in tokens]
    assert bare.texts[0].count == len(doc[0]) - 2


@pytest.mark.parametrize("body, status, words", [
    ({"inputs": "x", "model": "tiny"}, 404, "the models with one: minilm"),
    ({"inputs": "x", "model": "nope"}, 404, "nope"),
    ({"inputs": "x", "truncate": True}, 400, "unknown field(s) truncate"),
    ({"inputs": []}, 400, "non-empty list of strings"),
    ({"inputs": "x", "add_special_tokens": "yes"}, 400, "true or false"),
])
def test_refusals(srv, body, status, words):
    got, doc = tokenize(srv, body)
    assert got == status and words in doc["error"], doc
