"""The HTTP door (KServe v2 REST with Triton's binary tensor extension) against the unchanged
``tritonclient.http`` and plain ``http.client``: health, metadata, config, statistics and the
repository index; inference in JSON and binary, each answer equal byte for byte to the gRPC
door's for the same input; every error class with its HTTP status and ``{"error": ...}`` body; a
``Content-Length`` that differs from the body; draining, a model unloaded and loaded again or
failed (503); the bearer token on every route.

In-process servers (``ServerThread``, one front end and two sharing the port) on 127.0.0.1.
``tritonclient.http`` imports none of tritonclient's protobuf modules, so it can share this
process with trtserve's (``tritonclient.grpc`` cannot: ``tests/compat``).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import sys
import textwrap
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from integration.helpers import wait_for_file, write_gate
from servers import ServerThread
from trtserve.client import Client, Credentials
from trtserve.ipc.queries import ServerReady

LIMIT = 4096  # the module server's --max-receive-bytes: the HTTP door's body limit
MODELS = ("tiny", "identity_fp32", "echo_bytes", "minilm")


def link_models(engines: Path, root: Path, *names: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).symlink_to(engines / name, target_is_directory=True)
    return root


def request(url: str, method: str, path: str, body: bytes | str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: (status, headers with lower-case names, body)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def error_of(status: int, headers: dict[str, str], body: bytes) -> str:
    """The sentence of an error answer, checking its form: JSON ``{"error": "<sentence>"}``."""
    assert headers.get("content-type") == "application/json", (status, headers, body)
    doc = json.loads(body)
    assert list(doc) == ["error"] and isinstance(doc["error"], str) and doc["error"], doc
    return doc["error"]


def tiny_input(rows: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def tiny_json(x: np.ndarray, **extra) -> str:
    return json.dumps({"inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}], **extra})


def infer_input(name: str, x: np.ndarray, datatype: str, binary: bool) -> th.InferInput:
    tensor = th.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


class Held:
    """A gate request (first value 7) sent over HTTP on a thread of its own."""

    def __init__(self, url: str, started: Path) -> None:
        self.result: tuple[int, dict[str, str], bytes] | None = None
        self.error: BaseException | None = None
        self.x = np.array([[7.0, 1.5, -2.0]], np.float32)
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32",
                                       "data": self.x.reshape(-1).tolist()}]})
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()
        wait_for_file(started)  # admitted: the model is running it

    def _run(self, url: str, body: str) -> None:
        try:
            self.result = request(url, "POST", "/v2/models/gate/infer", body)
        except BaseException as exc:  # reported by answer()
            self.error = exc

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        self._thread.join(120)
        assert self.error is None and self.result is not None, self.error
        return self.result


def sync_records(srv: ServerThread) -> None:
    """Until every answer so far is counted by the engine core (each front end ships its
    records over its own connection; a query there goes behind them)."""
    for engine in srv.engines:
        srv.call(engine.query(ServerReady()))


@pytest.fixture(scope="module", params=[1, 2], ids=["1-frontend", "2-frontends"])
def srv(request, engines, tmp_path_factory):
    """tiny, identity_fp32, echo_bytes and minilm, over gRPC and HTTP, a 4 KiB body limit."""
    root = link_models(engines, tmp_path_factory.mktemp("repo") / "models", *MODELS)
    with ServerThread(root, frontends=request.param, http=True, max_receive_bytes=LIMIT) as server:
        yield server


@pytest.fixture
def client(srv):
    c = th.InferenceServerClient(srv.http_url)
    yield c
    c.close()


def test_tritonclient_http_shares_the_process_without_its_protobuf_modules():
    assert "tritonclient.grpc" not in sys.modules


# -- health, metadata, config, index -------------------------------------------------------


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "trtserve" and server["version"]
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(server["extensions"])
    meta = client.get_model_metadata("tiny")
    assert meta["name"] == "tiny" and meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 64]}]  # -1: the batch axis
    assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 16]}]
    assert client.get_model_metadata("tiny", model_version="1") == meta
    ident = client.get_model_metadata("identity_fp32")
    assert ident["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
    assert client.get_model_metadata("echo_bytes")["outputs"][0]["datatype"] == "BYTES"
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", model_version="1")
    assert not client.is_model_ready("tiny", model_version="7")
    assert not client.is_model_ready("no_such_model")


def test_model_config_and_repository_index(client):
    config = client.get_model_config("tiny")
    assert config["name"] == "tiny" and config["max_batch_size"] == 64
    assert config["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [("INPUT", "TYPE_FP32")]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [("OUTPUT", "TYPE_FP32")]
    assert config["input"][0]["dims"] == [64]  # numbers, as Triton gives them
    assert "dynamic_batching" in config
    index = client.get_model_repository_index()
    assert sorted((m["name"], m["version"], m["state"]) for m in index) == [(m, "1", "READY") for m in sorted(MODELS)]


# -- inference -----------------------------------------------------------------------------


@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json-out", "binary-out"])
def test_tiny_answers_equal_the_grpc_answer_byte_for_byte(srv, client, binary_in, binary_out):
    x = tiny_input(3, seed=int(binary_in) * 2 + int(binary_out))
    with srv.client() as g:
        expected = g.infer("tiny", {"INPUT": x})["OUTPUT"]
    result = client.infer("tiny", [infer_input("INPUT", x, "FP32", binary_in)],
                          outputs=[th.InferRequestedOutput("OUTPUT", binary_data=binary_out)], request_id="r-1")
    response = result.get_response()
    assert response["model_name"] == "tiny" and response["model_version"] == "1" and response["id"] == "r-1"
    (output,) = response["outputs"]
    assert output["name"] == "OUTPUT" and output["datatype"] == "FP32" and output["shape"] == [3, 16]
    assert ("data" in output) != binary_out
    got = result.as_numpy("OUTPUT")
    assert got.dtype == np.float32 and got.shape == (3, 16)
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_a_compressed_request_body_is_inflated(srv, client, compression):
    x = tiny_input(2, seed=11)
    with srv.client() as g:
        expected = g.infer("tiny", {"INPUT": x})["OUTPUT"]
    result = client.infer("tiny", [infer_input("INPUT", x, "FP32", True)], request_compression_algorithm=compression)
    assert result.as_numpy("OUTPUT").tobytes() == expected.tobytes()


def test_an_unknown_content_encoding_is_refused_415(srv):
    status, headers, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", tiny_json(tiny_input(1)),
                                    {"Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding 'br'" in error_of(status, headers, body)


def test_a_wrong_method_names_the_allowed_one(srv):
    status, headers, body = request(srv.http_url, "GET", "/v2/models/tiny/infer")
    assert status == 405 and headers.get("allow") == "POST"


def test_statistics_give_every_count_as_a_number_zeros_included(client):
    (stats,) = client.get_inference_statistics("identity_fp32")["model_stats"]
    for field in ("success", "fail", "queue", "compute_infer"):
        entry = stats["inference_stats"][field]
        assert set(entry) >= {"count", "ns"} and all(isinstance(entry[k], int) for k in ("count", "ns")), entry
    assert stats["version"] == "1" and isinstance(stats["inference_count"], int)
    assert isinstance(stats["execution_count"], int)


def test_default_outputs_are_binary_and_match_grpc(srv, client):
    x = tiny_input(2, seed=9)
    with srv.client() as g:
        expected = g.infer("tiny", {"INPUT": x})["OUTPUT"]
    result = client.infer("tiny", [infer_input("INPUT", x, "FP32", True)])  # outputs=None: all, binary
    assert result.get_response()["outputs"][0]["parameters"] == {"binary_data_size": expected.nbytes}
    assert result.as_numpy("OUTPUT").tobytes() == expected.tobytes()


def test_binary_tensor_extension_by_hand(srv):
    """The wire form itself: the JSON's length in Inference-Header-Content-Length, raw
    little-endian tensors after it, and the same form back."""
    x = tiny_input(2, seed=3)
    with srv.client() as g:
        expected = g.infer("tiny", {"INPUT": x})["OUTPUT"]
    head = json.dumps({"inputs": [{"name": "INPUT", "shape": [2, 64], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}]}).encode()
    status, headers, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", head + x.astype("<f4").tobytes(),
                                    {"Inference-Header-Content-Length": str(len(head)),
                                     "Content-Type": "application/octet-stream"})
    assert status == 200, body
    assert headers["content-type"] == "application/octet-stream"
    length = int(headers["inference-header-content-length"])
    doc = json.loads(body[:length])
    assert doc["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [2, 16],
                               "parameters": {"binary_data_size": expected.nbytes}}]
    assert body[length:] == expected.astype("<f4").tobytes()
    # Plain JSON both ways: no length header, numbers back.
    status, headers, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", tiny_json(x))
    assert status == 200 and headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    (output,) = json.loads(body)["outputs"]
    assert np.array(output["data"], np.float32).reshape(2, 16).tobytes() == expected.tobytes()


def test_bytes_through_echo_bytes(srv, client):
    text = np.array([["hello", "wörld", ""], ["a" * 300, "x\ty\n", "\u4e2d\u6587"]], dtype=object)
    for binary in (False, True):
        result = client.infer("echo_bytes", [infer_input("INPUT0", text, "BYTES", binary)],
                              outputs=[th.InferRequestedOutput("OUTPUT0", binary_data=binary)])
        out = result.as_numpy("OUTPUT0")
        assert out.shape == (2, 3)
        values = [v.decode() if isinstance(v, bytes) else v for v in out.reshape(-1)]
        assert values == text.reshape(-1).tolist()
    # The ONNX string model takes UTF-8 only: the same refusal, in the same words, by either door.
    raw = np.array([[b"ok", b"\xff\xfe"]], dtype=object)
    with pytest.raises(InferenceServerException) as err:
        client.infer("echo_bytes", [infer_input("INPUT0", raw, "BYTES", True)])
    with srv.client() as g, pytest.raises(grpc.RpcError) as grpc_err:
        g.infer("echo_bytes", {"INPUT0": raw})
    assert grpc_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.status() == "400" and err.value.message() == grpc_err.value.details()


def test_minilm_text_to_embedding_equals_grpc(srv, client):
    sentences = [b"A man is playing a guitar.", b"The weather is lovely today.", "Caf\u00e9 cr\u00e8me".encode()]
    texts = np.array([[s] for s in sentences], dtype=object)
    with srv.client() as g:
        expected = g.infer("minilm", {"TEXT": texts})["EMBEDDING"]
    for binary in (True, False):
        result = client.infer("minilm", [infer_input("TEXT", texts, "BYTES", binary)],
                              outputs=[th.InferRequestedOutput("EMBEDDING", binary_data=binary)])
        got = result.as_numpy("EMBEDDING")
        assert got.shape == (3, 384) and got.dtype == np.float32
        assert got.tobytes() == expected.tobytes()
    np.testing.assert_allclose(np.linalg.norm(expected, axis=1), 1.0, atol=1e-5)


def test_concurrent_async_infer_over_several_connections(srv):
    inputs = [tiny_input(1 + i % 4, seed=100 + i) for i in range(16)]
    with srv.client() as g:
        expected = [g.infer("tiny", {"INPUT": x})["OUTPUT"] for x in inputs]
    c = th.InferenceServerClient(srv.http_url, concurrency=4)
    try:
        pending = [c.async_infer("tiny", [infer_input("INPUT", x, "FP32", True)]) for x in inputs]
        got = [p.get_result(timeout=60).as_numpy("OUTPUT") for p in pending]
    finally:
        c.close()
    assert [o.tobytes() for o in got] == [e.tobytes() for e in expected]


def test_statistics_count_the_http_requests(srv, client):
    def stats() -> dict:
        sync_records(srv)
        (entry,) = client.get_inference_statistics("identity_fp32")["model_stats"]
        assert entry["name"] == "identity_fp32" and entry["version"] == "1"
        return entry

    def count(entry: dict, key: str) -> int:
        return entry["inference_stats"].get(key, {}).get("count", 0)

    before = stats()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(4):
        assert client.infer("identity_fp32", [infer_input("INPUT0", x, "FP32", True)]).as_numpy("OUTPUT0").tolist() \
            == x.tolist()
    with pytest.raises(InferenceServerException):  # a wrong datatype: a failure of this model
        client.infer("identity_fp32", [infer_input("INPUT0", x.astype(np.float64), "FP64", True)])
    after = stats()
    assert count(after, "success") - count(before, "success") == 4
    assert count(after, "fail") - count(before, "fail") == 1
    assert after.get("inference_count", 0) - before.get("inference_count", 0) == 8  # rows
    every = client.get_inference_statistics()["model_stats"]
    assert sorted(e["name"] for e in every) == sorted(MODELS)


# -- errors --------------------------------------------------------------------------------

GOOD = tiny_json(tiny_input(1))
BINARY_HEAD = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 64], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 256}}]})
ERRORS = {
    # name: (method, path, body, headers, status, words the sentence contains)
    "malformed-json": ("POST", "/v2/models/tiny/infer", b'{"inputs": [', {}, 400, ["not valid JSON"]),
    "not-an-object": ("POST", "/v2/models/tiny/infer", b"[1, 2]", {}, 400, ["JSON object"]),
    "wrong-datatype": ("POST", "/v2/models/tiny/infer", json.dumps(
        {"inputs": [{"name": "INPUT", "shape": [1, 64], "datatype": "INT32", "data": list(range(64))}]}), {}, 400,
                       ["'INPUT'", "INT32", "FP32"]),
    "wrong-shape": ("POST", "/v2/models/tiny/infer", GOOD.replace("[1, 64]", "[1, 32]"), {}, 400, ["'INPUT'"]),
    "shape-not-a-list": ("POST", "/v2/models/tiny/infer", GOOD.replace("[1, 64]", '"1x64"'), {}, 400,
                         ["'INPUT'", "'shape' must be a list of integers", "'1x64'"]),
    "data-not-numbers": ("POST", "/v2/models/tiny/infer", json.dumps(
        {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1.0, "two"]}]}), {}, 400,
                         ["'INPUT'", "FP32 data must be numbers"]),
    "binary-past-the-body": ("POST", "/v2/models/tiny/infer", BINARY_HEAD.encode() + bytes(100),
                             {"Inference-Header-Content-Length": str(len(BINARY_HEAD))}, 400,
                             ["'INPUT'", "binary_data_size 256", "past the end"]),
    "header-length-not-a-number": ("POST", "/v2/models/tiny/infer", GOOD, {"Inference-Header-Content-Length": "ten"},
                                   400, ["Inference-Header-Content-Length", "whole number of bytes", "got 'ten'"]),
    "header-length-not-an-integer": ("POST", "/v2/models/tiny/infer", GOOD,
                                     {"Inference-Header-Content-Length": "12.5"}, 400,
                                     ["Inference-Header-Content-Length", "whole number of bytes", "got '12.5'"]),
    "header-length-negative": ("POST", "/v2/models/tiny/infer", GOOD, {"Inference-Header-Content-Length": "-1"},
                               400, ["Inference-Header-Content-Length", "whole number of bytes", "got '-1'"]),
    "header-length-empty": ("POST", "/v2/models/tiny/infer", GOOD, {"Inference-Header-Content-Length": ""},
                            400, ["Inference-Header-Content-Length", "got ''"]),
    "header-length-zero": ("POST", "/v2/models/tiny/infer", GOOD, {"Inference-Header-Content-Length": "0"}, 400,
                           ["Inference-Header-Content-Length 0", "raw binary request", "not supported"]),
    "header-length-past-the-body": ("POST", "/v2/models/tiny/infer", GOOD,
                                    {"Inference-Header-Content-Length": "999999"}, 400,
                                    ["Inference-Header-Content-Length is 999999", f"the body has {len(GOOD)} bytes"]),
    "unknown-model-infer": ("POST", "/v2/models/no_such_model/infer", GOOD, {}, 404, ["no_such_model"]),
    "unknown-model-metadata": ("GET", "/v2/models/no_such_model", None, {}, 404, ["no_such_model"]),
    "unknown-model-config": ("GET", "/v2/models/no_such_model/config", None, {}, 404, ["no_such_model"]),
    "unknown-version-infer": ("POST", "/v2/models/tiny/versions/7/infer", GOOD, {}, 404, ["tiny", "'7'"]),
    "unknown-version-metadata": ("GET", "/v2/models/tiny/versions/7", None, {}, 404, ["tiny", "'7'"]),
    "unknown-route": ("GET", "/v3/models/tiny", None, {}, 404, ["/v3/models/tiny"]),
    "unknown-route-under-v2": ("POST", "/v2/models/tiny/predict", GOOD, {}, 404, ["/v2/models/tiny/predict"]),
    "wrong-method-infer": ("GET", "/v2/models/tiny/infer", None, {}, 405, ["POST"]),
    "wrong-method-health": ("POST", "/v2/health/live", b"", {}, 405, ["GET"]),
    "body-over-the-limit": ("POST", "/v2/models/tiny/infer", b"x" * (LIMIT + 1), {}, 413, [str(LIMIT)]),
    "timeout-parameter-1us": ("POST", "/v2/models/tiny/infer", tiny_json(tiny_input(1), parameters={"timeout": 1}),
                              {}, 504, ["deadline"]),
    "timeout-header-1us": ("POST", "/v2/models/tiny/infer", GOOD, {"trtserve-timeout-us": "1"}, 504, ["deadline"]),
    "timeout-header-not-a-number": ("POST", "/v2/models/tiny/infer", GOOD, {"trtserve-timeout-us": "soon"}, 400,
                                    ["trtserve-timeout-us", "got 'soon'"]),
    "shared-memory-not-implemented": ("GET", "/v2/systemsharedmemory/status", None, {}, 501, ["not implemented"]),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_have_their_status_and_a_json_sentence(srv, case):
    method, path, body, headers, status, words = ERRORS[case]
    got, answer_headers, answer = request(srv.http_url, method, path, body, headers)
    assert got == status, answer
    sentence = error_of(got, answer_headers, answer)
    for word in words:
        assert word in sentence, (word, sentence)
    # The door still answers (the error did not break the front end).
    assert request(srv.http_url, "POST", "/v2/models/tiny/infer", GOOD)[0] == 200


def test_a_chunked_body_over_the_limit_is_refused_413(srv):
    host, port = srv.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:  # no Content-Length: the door counts what arrives
        conn.request("POST", "/v2/models/tiny/infer", body=iter([b"x" * 3000, b"y" * 3000]), encode_chunked=True)
        response = conn.getresponse()
        status, headers, body = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()
    assert status == 413
    assert str(LIMIT) in error_of(status, headers, body)


def test_a_body_of_exactly_the_limit_is_read(srv):
    doc = {**json.loads(GOOD), "id": ""}
    doc["id"] = "p" * (LIMIT - len(json.dumps(doc)))
    padded = json.dumps(doc)
    assert len(padded) == LIMIT
    status, _, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", padded)
    assert status == 200, body
    assert json.loads(body)["id"].startswith("ppp")


def raw_exchange(url: str, head: bytes, body: bytes, *, half_close: bool = False) -> bytes:
    """Send ``head`` and ``body`` on a socket of its own (``half_close``: then shut the writing
    side) and read until the server closes: every byte it answered."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_content_length_that_differs_from_the_body_runs_nothing(srv, client, caplog):
    """Fewer bytes than ``Content-Length`` (the client then closes): no answer, nothing run, no
    error logged for a client that left; more bytes than it: 400 and the connection closed (the
    bytes after the body are not a request), nothing run. The door answers on."""
    body = GOOD.encode()

    def head(length: int) -> bytes:
        return f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n".encode()

    def successes() -> int:
        sync_records(srv)
        return client.get_inference_statistics("tiny")["model_stats"][0]["inference_stats"]["success"]["count"]

    before = successes()
    assert raw_exchange(srv.http_url, head(len(body) + 10), body, half_close=True) == b""
    answer = raw_exchange(srv.http_url, head(len(body) - 10), body)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer.lower(), answer
    assert request(srv.http_url, "POST", "/v2/models/tiny/infer", GOOD)[0] == 200
    assert successes() == before + 1  # only the last one
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_tritonclient_sees_the_status_and_the_sentence(client):
    x = tiny_input(1)
    cases = [
        (lambda: client.infer("no_such_model", [infer_input("INPUT", x, "FP32", True)]), "404", "no_such_model"),
        (lambda: client.infer("tiny", [infer_input("INPUT", x.reshape(-1), "FP32", True)]), "400", "INPUT"),
        (lambda: client.infer("tiny", [infer_input("INPUT", x, "FP32", True)], timeout=1), "504", "deadline"),
        (lambda: client.get_model_metadata("tiny", model_version="7"), "404", "'7'"),
    ]
    for call, status, word in cases:
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == status and word in err.value.message(), (status, err.value)


# -- not ready: draining, a model unloaded or failed ---------------------------------------


@pytest.mark.parametrize("frontends", [1, 2])
def test_draining_refuses_503_and_answers_what_it_admitted(make_server, engines, tmp_path, frontends):
    root = link_models(engines, tmp_path / "models", "tiny")
    started, release = write_gate(root)
    srv = make_server(root, http=True, frontends=frontends)
    c = th.InferenceServerClient(srv.http_url)
    try:
        held = Held(srv.http_url, started)  # admitted, running
        for doors in srv.doors:  # every front end begins to drain (as on SIGTERM)
            srv.call(doors.state.begin_drain())
        status, headers, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", GOOD)
        assert status == 503 and headers.get("retry-after") == "1"
        assert "shutting down" in error_of(status, headers, body)
        status, headers, body = request(srv.http_url, "GET", "/v2/health/ready")
        assert status == 503 and "not ready" in error_of(status, headers, body)
        status, headers, body = request(srv.http_url, "GET", "/v2/models/tiny/ready")
        assert status == 503 and "not ready" in error_of(status, headers, body)
        assert request(srv.http_url, "GET", "/v2/health/live")[0] == 200
        assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready("tiny")
    finally:
        release.touch()
    status, headers, body = held.answer()
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == held.x.reshape(-1).tolist()
    c.close()


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_model_unloaded_or_failed_is_not_ready_503(make_server, engines, tmp_path, frontends):
    from trtserve.engine.lifecycle import ControlMode, LifecycleConfig

    root = link_models(engines, tmp_path / "models", "tiny")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.py").write_text(textwrap.dedent("""
        class Model:
            def setup(self, config):
                raise RuntimeError("this model cannot load")

            def predict(self, inputs):
                return inputs
    """))
    (root / "broken" / "config.pbtxt").write_text(
        'name: "broken" backend: "python" max_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    lifecycle = LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("*",), strict_readiness=False)
    srv = make_server(root, http=True, frontends=frontends, lifecycle=lifecycle)
    c = th.InferenceServerClient(srv.http_url)
    try:
        assert c.is_server_ready() and c.is_model_ready("tiny") and not c.is_model_ready("broken")
        status, headers, body = request(srv.http_url, "GET", "/v2/models/broken/ready")
        assert status == 503 and "broken" in error_of(status, headers, body)
        broken = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
        status, headers, body = request(srv.http_url, "POST", "/v2/models/broken/infer", broken)
        assert status == 503 and "this model cannot load" in error_of(status, headers, body)
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["broken"]["state"] == "UNAVAILABLE" and "this model cannot load" in index["broken"]["reason"]
        # Unloaded through the HTTP door: not ready, requests 503 (retry later); loaded again: served.
        c.unload_model("tiny")
        assert not c.is_model_ready("tiny")
        status, headers, body = request(srv.http_url, "POST", "/v2/models/tiny/infer", GOOD)
        assert status == 503 and headers.get("retry-after") == "1" and "tiny" in error_of(status, headers, body)
        c.load_model("tiny")
        assert c.is_model_ready("tiny")
        assert request(srv.http_url, "POST", "/v2/models/tiny/infer", GOOD)[0] == 200
        # Reloaded with a config override (tritonclient's config=), then from its own config again.
        config = c.get_model_config("tiny")
        c.load_model("tiny", config=json.dumps({**config, "max_batch_size": 8}))
        assert c.get_model_config("tiny")["max_batch_size"] == 8
        c.load_model("tiny")
        assert c.get_model_config("tiny")["max_batch_size"] == config["max_batch_size"] != 8
    finally:
        c.close()


def test_load_and_unload_are_refused_in_mode_none(client):
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as err:
            call("tiny")
        assert err.value.status() == "503" and "model control mode 'none'" in err.value.message(), err.value
    assert client.is_model_ready("tiny")


# -- auth ----------------------------------------------------------------------------------

ROUTES = [  # every route of the door (checked against its table below); unload before load
    ("GET", "/v2/health/live", None),
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2", None),
    ("GET", "/v2/models/tiny", None),
    ("GET", "/v2/models/tiny/versions/1", None),
    ("GET", "/v2/models/tiny/ready", None),
    ("GET", "/v2/models/tiny/versions/1/ready", None),
    ("GET", "/v2/models/tiny/config", None),
    ("GET", "/v2/models/tiny/stats", None),
    ("GET", "/v2/models/stats", None),
    ("POST", "/v2/models/tiny/infer", GOOD),
    ("POST", "/v2/models/tiny/versions/1/infer", GOOD),
    ("POST", "/v2/repository/index", b""),
    ("POST", "/v1/embeddings", json.dumps({"model": "minilm", "input": "hello"})),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", json.dumps({"inputs": "hello", "model": "minilm"})),
    ("POST", "/v2/repository/models/tiny/unload", b""),
    ("POST", "/v2/repository/models/tiny/load", b""),
]


def test_the_auth_cases_cover_every_route():
    from trtserve.frontend.http.app import _ROUTES

    covered = {name for method, path, _ in ROUTES for verb, pattern, name in _ROUTES
               if verb == method and pattern.fullmatch(path)}
    assert covered == {name for _, _, name in _ROUTES}


@pytest.mark.parametrize("auth_health", [False, True], ids=["health-open", "health-protected"])
def test_bearer_token(make_server, engines, tmp_path, auth_health):
    from trtserve.engine.lifecycle import ControlMode, LifecycleConfig

    root = link_models(engines, tmp_path / "models", "tiny", "minilm")
    lifecycle = LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("*",))
    srv = make_server(root, http=True, frontends=2, auth_token="s3cret", auth_health=auth_health,
                      lifecycle=lifecycle)
    good = {"Authorization": "Bearer s3cret"}
    for method, path, body in ROUTES:
        open_route = path.startswith("/v2/health/") and not auth_health
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, headers, answer = request(srv.http_url, method, path, body, bad)
            if open_route:
                assert status == 200, (path, bad, answer)
            elif path.startswith("/v1/"):  # OpenAI's error shape
                assert status == 401 and json.loads(answer)["error"]["code"] == "invalid_api_key", (path, answer)
            else:
                assert status == 401, (path, bad, answer)
                assert "authorization" in error_of(status, headers, answer)
        status, _, answer = request(srv.http_url, method, path, body, good)
        assert status == 200, (path, answer)
    # tritonclient.http sends the token as a header it is given.
    c = th.InferenceServerClient(srv.http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            c.get_server_metadata()
        assert err.value.status() == "401"
        assert c.is_server_live() != auth_health  # is_server_live is a plain 200 check
        assert c.is_server_ready(headers=good) and c.get_server_metadata(headers=good)["name"] == "trtserve"
        x = tiny_input(2)
        with Client(srv.url, credentials=Credentials(token="s3cret")) as g:
            expected = g.infer("tiny", {"INPUT": x})["OUTPUT"]
        out = c.infer("tiny", [infer_input("INPUT", x, "FP32", True)], headers=good).as_numpy("OUTPUT")
        assert out.tobytes() == expected.tobytes()
        with pytest.raises(InferenceServerException) as err:
            c.infer("tiny", [infer_input("INPUT", x, "FP32", True)])
        assert err.value.status() == "401"
    finally:
        c.close()
