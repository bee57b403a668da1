"""The OpenAI embeddings API on the HTTP door against the official ``openai`` package and
plain ``http.client``: embeddings equal to the gRPC answer for the same texts (base64, which
the client asks for by default, and float), one string and more strings than
``max_batch_size``, ``usage`` from the handler's token counts, ``/v1/models``, every refusal
with its status and OpenAI's error shape, the bearer token.

In-process servers (``ServerThread``, one front end and two sharing the port) on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai
import pytest
from test_http_rest import link_models, request
from tokenizers import Tokenizer

from servers import ServerThread

SENTENCES = ["A man is playing a guitar.", "The weather is lovely today.", "Caf\u00e9 cr\u00e8me",
             "word " * 400]  # the last is truncated at the model's 256 tokens


def grpc_embeddings(srv: ServerThread, texts: list[str]) -> np.ndarray:
    with srv.client() as g:
        return g.infer("minilm", {"TEXT": np.array([[t.encode()] for t in texts], dtype=object)})["EMBEDDING"]


def token_counts(engines: Path, texts: list[str]) -> list[int]:
    """What the model reads of each text: minilm's tokenizer, truncated at 256, no padding."""
    tok = Tokenizer.from_file(str(engines / "minilm" / "1" / "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.no_padding()
    return [len(tok.encode(t).ids) for t in texts]


def openai_error(status: int, headers: dict[str, str], body: bytes) -> dict:
    """The error of an answer, checking OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    assert headers.get("content-type") == "application/json", (status, headers, body)
    doc = json.loads(body)
    assert list(doc) == ["error"] and set(doc["error"]) == {"message", "type", "param", "code"}, doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"], doc
    return doc["error"]


@pytest.fixture(scope="module", params=[1, 2], ids=["1-frontend", "2-frontends"])
def srv(request, engines, tmp_path_factory):
    """minilm (declares the API) and tiny (does not), over gRPC and HTTP."""
    root = link_models(engines, tmp_path_factory.mktemp("repo") / "models", "minilm", "tiny")
    with ServerThread(root, frontends=request.param, http=True) as server:
        yield server


@pytest.fixture
def client(srv):
    with openai.OpenAI(base_url=f"http://{srv.http_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.mark.parametrize("encoding", [None, "float"], ids=["base64-by-default", "float"])
def test_embeddings_equal_the_grpc_answer(srv, client, engines, encoding):
    extra = {} if encoding is None else {"encoding_format": encoding}
    result = client.embeddings.create(model="minilm", input=SENTENCES, **extra)
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert [d.index for d in result.data] == list(range(len(SENTENCES)))
    assert got.shape == (len(SENTENCES), 384)
    assert got.tobytes() == grpc_embeddings(srv, SENTENCES).tobytes()
    assert result.model == "minilm" and result.object == "list"
    counts = token_counts(engines, SENTENCES)
    assert counts[-1] == 256
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(counts)


def test_base64_is_little_endian_float32(srv):
    status, _, body = request(srv.http_url, "POST", "/v1/embeddings",
                              json.dumps({"model": "minilm", "input": SENTENCES[:2], "encoding_format": "base64"}))
    assert status == 200, body
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in json.loads(body)["data"]]
    assert np.stack(rows).tobytes() == grpc_embeddings(srv, SENTENCES[:2]).tobytes()


def test_one_string(srv, client, engines):
    result = client.embeddings.create(model="minilm", input=SENTENCES[0], dimensions=384)
    assert len(result.data) == 1
    assert np.array(result.data[0].embedding, np.float32).tobytes() == grpc_embeddings(srv, SENTENCES[:1]).tobytes()
    assert result.usage.prompt_tokens == token_counts(engines, SENTENCES[:1])[0]


def test_more_strings_than_max_batch_size_come_back_in_order(srv, client):
    texts = [f"sentence number {i} is about {'cats' if i % 2 else 'the sea'}" for i in range(33)]
    result = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert [d.index for d in result.data] == list(range(33))
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    np.testing.assert_allclose(got, grpc_embeddings(srv, texts), atol=1e-6)


def test_models_lists_the_models_that_declare_the_api(client):
    models = client.models.list().data
    assert [(m.id, m.object, m.created, m.owned_by) for m in models] == [("minilm", "model", 0, "trtserve")]


REFUSED = [
    ({"model": "minilm", "input": [101, 2023, 102]}, 400, "input", "token ids are not supported, send text"),
    ({"model": "minilm", "input": [[101, 2023], [102]]}, 400, "input", "token ids are not supported, send text"),
    ({"model": "minilm", "input": "hello", "dimensions": 128}, 400, "dimensions", "384 dimensions, not 128"),
    ({"model": "minilm", "input": "hello", "encoding_format": "int8"}, 400, "encoding_format", "'float' or 'base64'"),
    ({"model": "minilm", "input": []}, 400, "input", "empty list"),
    ({"model": "minilm", "input": ""}, 400, "input", "empty string"),
    ({"model": "minilm", "input": ["ok", ""]}, 400, "input", "input[1] is an empty string"),
    ({"model": "minilm", "input": [{"text": "hi"}]}, 400, "input", "a string or a list of strings"),
    ({"model": "minilm", "input": "hello", "user": 7}, 400, "user", "user must be a string"),
    ({"model": "minilm", "input": "hello", "temperature": 1}, 400, "temperature", "unknown field(s) temperature"),
    ({"input": "hello"}, 400, "model", "'model' must be"),
    ({"model": "nope", "input": "hello"}, 404, None, "unknown model"),
    ({"model": "tiny", "input": "hello"}, 404, None, "the models that do: minilm"),
]


@pytest.mark.parametrize("body, status, param, words", REFUSED, ids=[c[3][:24] for c in REFUSED])
def test_refusals_have_their_status_and_openai_error_shape(srv, body, status, param, words):
    got, headers, answer = request(srv.http_url, "POST", "/v1/embeddings", json.dumps(body))
    error = openai_error(got, headers, answer)
    assert got == status and words in error["message"], error
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["code"] == ("model_not_found" if status == 404 else None)


def test_the_client_raises_with_status_and_message(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="tiny", input="hello")
    assert err.value.status_code == 404 and "minilm" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="minilm", input=[[1, 2, 3]])
    assert "token ids are not supported, send text" in err.value.message
    # a user string is accepted; it only serves the caller's own tracing
    assert len(client.embeddings.create(model="minilm", input="hi", user="me").data) == 1


def test_a_malformed_body_and_a_wrong_method(srv):
    status, headers, body = request(srv.http_url, "POST", "/v1/embeddings", b"{not json")
    assert status == 400 and "not valid JSON" in openai_error(status, headers, body)["message"]
    status, headers, body = request(srv.http_url, "GET", "/v1/embeddings")
    assert status == 405 and openai_error(status, headers, body)["type"] == "invalid_request_error"


@pytest.mark.parametrize("frontends", [1, 2])
def test_draining_refuses_503_in_openai_shape(make_server, engines, tmp_path, frontends):
    srv = make_server(link_models(engines, tmp_path / "models", "minilm"), http=True, frontends=frontends)
    for doors in srv.doors:
        srv.call(doors.state.begin_drain())
    status, headers, body = request(srv.http_url, "POST", "/v1/embeddings",
                                    json.dumps({"model": "minilm", "input": "hello"}))
    assert status == 503 and headers.get("retry-after") == "1"
    error = openai_error(status, headers, body)
    assert "shutting down" in error["message"] and error["type"] == "server_error"


def test_bearer_token(make_server, engines, tmp_path):
    srv = make_server(link_models(engines, tmp_path / "models", "minilm"), http=True, frontends=2,
                      auth_token="s3cret")
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/embeddings")):
        status, headers, body = request(srv.http_url, method, path, json.dumps({"model": "minilm", "input": "x"}))
        assert status == 401 and openai_error(status, headers, body)["code"] == "invalid_api_key"
    with openai.OpenAI(base_url=f"http://{srv.http_url}/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    with openai.OpenAI(base_url=f"http://{srv.http_url}/v1", api_key="s3cret", max_retries=0) as c:
        assert [m.id for m in c.models.list().data] == ["minilm"]
        assert len(c.embeddings.create(model="minilm", input=["a", "b"]).data) == 2


def test_a_deadline_that_cannot_be_met_is_504_in_openai_shape(srv):
    status, headers, body = request(srv.http_url, "POST", "/v1/embeddings", json.dumps(
        {"model": "minilm", "input": SENTENCES}), {"trtserve-timeout-us": "1"})
    error = openai_error(status, headers, body)
    assert status == 504 and error["type"] == "timeout_error", error
