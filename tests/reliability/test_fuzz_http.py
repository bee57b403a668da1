"""Fuzzing the HTTP door (KServe v2 REST, with Triton's binary tensor extension) with
hypothesis, against a live server with HTTP on (``ServerThread(http=True)``: what
``trtserve serve --allow-http true --http-port 0`` opens).

:func:`bodies`: a well-formed ``POST /v2/models/<model>/infer`` body for one of the models —
JSON (``"data"``) or binary (``binary_data_size`` and the raw bytes after the JSON header,
``Inference-Header-Content-Length``) — with up to three mutations, each classified
(:data:`MUTATIONS`): a malformed body (broken JSON, not UTF-8, not an object, a missing or
mistyped field, a wrong datatype or shape, data of the wrong count or type, an unknown input,
output or parameter, a header length past the end or not a number, a binary size too
large or too small, BYTES with a length past the end or bytes left over) must be answered 400
with ``{"error": "<sentence>"}``; a benign change (another request id, a requested output in
JSON or binary, a long timeout, whitespace) 200 with the input echoed. Every request goes on a
connection of its own, and the connection must answer: never a 500, never a dropped
connection; after every example the door still serves a well-formed request.

Budget: ``TRTSERVE_FUZZ_EXAMPLES`` examples (default 150; ``make fuzz`` runs 5000).
"""

from __future__ import annotations

import http.client
import json
import os
import struct

import numpy as np
import pytest
from casekit import write_identity
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("TRTSERVE_FUZZ_EXAMPLES", "150"))

# model -> (datatype, dims without the batch dimension); every one has INPUT0 -> OUTPUT0, max batch 8.
MODELS = {"identity_fp32": ("FP32", (-1,)), "fixed_fp32": ("FP32", (4,)), "int8": ("INT8", (-1,)),
          "echo_bytes": ("BYTES", (-1,))}

MUTATIONS = {
    # malformed: 400
    "broken json": 400, "not utf-8": 400, "not an object": 400, "inputs not a list": 400, "no inputs": 400,
    "missing name": 400, "missing shape": 400, "missing datatype": 400, "datatype": 400, "shape": 400,
    "negative dim": 400, "data count": 400, "data type": 400, "unknown input": 400, "duplicate input": 400,
    "unknown output": 400, "bad parameter": 400, "header length past the end": 400,
    "header length not a number": 400, "binary size +1": 400, "binary size -1": 400,
    "bytes length past the end": 400, "bytes left over": 400,
    # benign: 200
    "request id": 200, "json output": 200, "binary output": 200, "long timeout": 200, "whitespace": 200,
}


# At most one change of the element count or the data size per body: two could cancel out (a
# batch dim one longer and one more value make a well-formed body again).
ONE_SIZE_CHANGE = {"binary size +1", "binary size -1", "bytes left over", "data count", "shape"}


class Body:
    """One generated request: path, body bytes, headers, the status it calls for, and the
    mutations applied (for the report)."""

    def __init__(self, model: str, body: bytes, headers: dict[str, str], status: int, mutations: tuple[str, ...],
                 sent: np.ndarray):
        self.model, self.body, self.headers, self.status, self.mutations, self.sent = (
            model, body, headers, status, mutations, sent)

    def __repr__(self) -> str:
        return f"Body({self.mutations}, status={self.status}, headers={self.headers}, body={self.body[:600]!r})"


def values(draw, datatype: str, count: int) -> np.ndarray:
    if datatype == "FP32":
        element = st.floats(width=32, allow_nan=False, allow_infinity=False)
        return np.array(draw(st.lists(element, min_size=count, max_size=count)), np.float32)
    if datatype == "INT8":
        return np.array(draw(st.lists(st.integers(-128, 127), min_size=count, max_size=count)), np.int8)
    return np.array(draw(st.lists(st.text(max_size=12), min_size=count, max_size=count)), dtype=object)


def raw_of(datatype: str, data: np.ndarray) -> bytes:
    """The binary extension's bytes: little-endian numbers, or length-prefixed UTF-8 for BYTES."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in data)
    return data.astype(data.dtype.newbyteorder("<")).tobytes()


def json_data(data: np.ndarray) -> list:
    return [float(v) for v in data] if data.dtype == np.float32 else [v if isinstance(v, str) else int(v) for v in data]


@st.composite
def bodies(draw):
    model = draw(st.sampled_from(sorted(MODELS)))
    datatype, dims = MODELS[model]
    shape = [draw(st.integers(1, 8))] + [draw(st.integers(1, 5)) if d == -1 else d for d in dims]
    data = values(draw, datatype, int(np.prod(shape)))
    binary = draw(st.booleans())
    tensor: dict = {"name": "INPUT0", "shape": shape, "datatype": datatype}
    raw = b""
    if binary:
        raw = raw_of(datatype, data)
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = json_data(data)
    doc: dict = {"inputs": [tensor]}
    header_length: str | None = None
    text_hook = None  # a change to the JSON text itself
    applied: list[str] = []
    for mutation in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3, unique=True)):
        if mutation in ONE_SIZE_CHANGE and ONE_SIZE_CHANGE & set(applied):
            continue
        inputs = doc.get("inputs") if isinstance(doc, dict) else None
        t = inputs[0] if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict) else None
        if mutation == "broken json" and text_hook is None:
            cut = draw(st.integers(1, 8))
            text_hook = lambda text, cut=cut: text[:-cut]  # noqa: E731
        elif mutation == "not utf-8" and text_hook is None:
            text_hook = lambda text: b"\xff" + text  # noqa: E731
        elif mutation == "not an object" and isinstance(doc, dict):
            doc = draw(st.sampled_from([[doc], 1, "inputs", None]))
        elif mutation == "inputs not a list" and isinstance(doc, dict):
            doc["inputs"] = draw(st.sampled_from([{}, "INPUT0", 3, None]))
        elif mutation == "no inputs" and isinstance(doc, dict):
            doc["inputs"] = []
        elif mutation in ("missing name", "missing shape", "missing datatype") and t is not None:
            t.pop(mutation.split()[1], None)
        elif mutation == "datatype" and t is not None:
            t["datatype"] = draw(st.sampled_from([d for d in ["FP32", "FP16", "INT8", "INT64", "BYTES", "BOOL",
                                                              "fp32", "TYPE_FP32", "", 7] if d != datatype]))
        elif mutation == "shape" and t is not None and isinstance(t.get("shape"), list):
            t["shape"] = draw(st.sampled_from([t["shape"][1:], t["shape"] + [2], [t["shape"][0] + 1, *t["shape"][1:]],
                                               "1", [1.5], None]))
        elif mutation == "negative dim" and t is not None and isinstance(t.get("shape"), list) and t["shape"]:
            t["shape"] = [draw(st.sampled_from([-1, -2, -(2**63)])), *t["shape"][1:]]
        elif mutation == "data count" and t is not None and isinstance(t.get("data"), list) and t["data"]:
            t["data"] = t["data"][:-1] if draw(st.booleans()) else t["data"] + t["data"][:1]
        elif mutation == "data type" and t is not None and isinstance(t.get("data"), list) and t["data"]:
            wrong = {"FP32": "x", "INT8": draw(st.sampled_from([1000, "1", 1.5])),
                     "BYTES": draw(st.sampled_from([1, None]))}
            t["data"] = [wrong[datatype], *t["data"][1:]]
        elif mutation == "unknown input" and isinstance(doc, dict) and isinstance(inputs, list):
            inputs.append({"name": draw(st.text(max_size=8).filter(lambda n: n != "INPUT0")), "shape": [1, 1],
                           "datatype": "FP32", "data": [1.0]})
        elif mutation == "duplicate input" and t is not None and "data" in t:
            inputs.append(dict(t))
        elif mutation == "unknown output" and isinstance(doc, dict):
            doc.setdefault("outputs", []).append({"name": draw(st.text(max_size=8).filter(lambda n: n != "OUTPUT0"))})
        elif mutation == "bad parameter" and isinstance(doc, dict):
            doc.setdefault("parameters", {})[draw(st.sampled_from(["timeout", "priority", "x"]))] = draw(
                st.sampled_from(["soon", -5, [1], {"a": 1}]))
        elif mutation == "header length past the end" and binary and header_length is None:
            header_length = "past"
        elif mutation == "header length not a number" and binary and header_length is None:
            header_length = draw(st.sampled_from(["x", "-1", "1.5", ""]))
        elif mutation in ("binary size +1", "binary size -1") and t is not None and "parameters" in t:
            t["parameters"]["binary_data_size"] += 1 if mutation.endswith("+1") else -1
        elif mutation == "bytes length past the end" and binary and datatype == "BYTES" and len(raw) >= 4:
            raw = struct.pack("<I", draw(st.integers(len(raw) - 3, 2**32 - 1))) + raw[4:]
        elif mutation == "bytes left over" and binary and t is not None and "parameters" in t:
            raw += draw(st.binary(min_size=1, max_size=5))
            t["parameters"]["binary_data_size"] = len(raw)
        elif mutation == "request id" and isinstance(doc, dict):
            doc["id"] = draw(st.text(max_size=12))
        elif mutation in ("json output", "binary output") and isinstance(doc, dict) and "outputs" not in doc:
            doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": mutation == "binary output"}}]
        elif mutation == "long timeout" and isinstance(doc, dict) and "parameters" not in doc:
            doc["parameters"] = {"timeout": draw(st.integers(20_000_000, 60_000_000))}
        elif mutation == "whitespace" and "whitespace" not in applied:
            pass  # the JSON is written indented, between blank lines
        else:
            continue
        applied.append(mutation)
    text = json.dumps(doc).encode()
    if "whitespace" in applied:
        text = b"\n " + json.dumps(doc, indent=1).encode() + b"\n\t"
    if text_hook is not None:
        text = text_hook(text)
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": (str(len(text) + len(raw) + 1) if header_length == "past" else
                                                       header_length if header_length is not None else str(len(text)))}
    status = 400 if any(MUTATIONS[m] == 400 for m in applied) else 200
    return Body(model, text + raw, headers, status, tuple(applied), data)


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("fuzz_http")
    for name, (datatype, dims) in MODELS.items():
        write_identity(root, name, datatype, dims, max_batch_size=8)
    with ServerThread(root, http=True) as srv:
        yield srv.http_url


def post(url: str, model: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """POST on a connection of its own: (status, headers with lower-case names, body). A dropped
    connection raises (http.client.RemoteDisconnected, ConnectionResetError)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def echoed(case: Body, headers: dict[str, str], body: bytes) -> np.ndarray:
    """OUTPUT0 of a 200 answer, from its JSON ``data`` or its binary part."""
    length = int(headers.get("inference-header-content-length", len(body)))
    doc = json.loads(body[:length])
    (out,) = [o for o in doc["outputs"] if o["name"] == "OUTPUT0"]
    if "data" in out:
        return np.array(out["data"], dtype=case.sent.dtype)
    raw = body[length:]
    if out["datatype"] == "BYTES":
        items, pos = [], 0
        while pos < len(raw):
            (n,) = struct.unpack_from("<I", raw, pos)
            items.append(raw[pos + 4:pos + 4 + n].decode())
            pos += 4 + n
        return np.array(items, dtype=object)
    return np.frombuffer(raw, dtype=case.sent.dtype.newbyteorder("<"))


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(case=bodies())
def test_http_fuzz_answers_400_for_every_malformed_body_and_never_500_or_a_dropped_connection(door, case):
    status, headers, body = post(door, case.model, case.body, case.headers)
    event(f"{status} {'+'.join(case.mutations) or 'well formed'}")
    assert status == case.status, (status, body[:400], case)
    if status == 400:
        assert headers.get("content-type") == "application/json", headers
        error = json.loads(body)
        assert list(error) == ["error"] and isinstance(error["error"], str) and error["error"], error
    else:
        np.testing.assert_array_equal(echoed(case, headers, body), case.sent)
    # The door still serves.
    x = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    status, _, body = post(door, "identity_fp32", json.dumps(x).encode(), {"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0, 3.0]
