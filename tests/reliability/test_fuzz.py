"""Fuzzing the request path with hypothesis (issue 10, part 2), unary and streaming, against a
live server.

Random ``ModelInferRequest`` messages: model names and versions (real and not), inputs with
real and random names, every datatype and some that do not exist, shapes with 0, negative and
huge dims, raw contents of the right length, a wrong length, or none, BYTES with valid and
broken length prefixes, typed contents in the right and wrong fields, duplicate inputs,
requested outputs (unknown names, classification), and parameters of every type under the
keys the server reads (``timeout``, ``priority``), reserved ``triton_`` keys and others.

Properties: every answer is OK or a documented status (INVALID_ARGUMENT, NOT_FOUND,
RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, UNIMPLEMENTED for a Triton feature trtserve does not
implement, such as classification), never UNKNOWN or INTERNAL; an OK answer has one output
per requested output, with the right datatype and a byte length that matches its shape; on a
stream, every message is answered exactly once, under its own id, and the stream ends OK; after
every example the server is live and a well-formed request returns exact values.

Budget: ``TRTSERVE_FUZZ_EXAMPLES`` examples per test (default 150 unary and a third of that
for streams of up to 8 messages, about 20 s: the short run in ``make test``); ``make fuzz``
runs 5000 (``FUZZ_EXAMPLES=...``). The generator writes only what a client can send (every
shape dim an int64).
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
from harness import error_code, write_identity, write_probe
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request, parse_response
from trtserve.datatypes import DATATYPES

EXAMPLES = int(os.environ.get("TRTSERVE_FUZZ_EXAMPLES", "150"))
ENGINES = Path(__file__).resolve().parents[2] / "engines"
ALLOWED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNIMPLEMENTED"}

# model -> (input name, datatype, dims without batch, batched)
MODELS = {
    "identity_fp32": ("INPUT0", "FP32", (-1,), True),
    "fixed_fp32": ("INPUT0", "FP32", (4,), True),
    "echo_bytes": ("INPUT0", "BYTES", (-1,), True),
    "fp16": ("INPUT0", "FP16", (-1,), True),
    "int8": ("INPUT0", "INT8", (-1,), True),
    "uint64": ("INPUT0", "UINT64", (-1,), True),
    "bool": ("INPUT0", "BOOL", (-1,), True),
    "nobatch": ("INPUT0", "FP32", (2, 3), False),
    "probe": ("INPUT0", "FP32", (-1,), True),
    "minilm": ("TEXT", "BYTES", (1,), True),
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("fuzz")
    for name, (_, datatype, dims, batched) in MODELS.items():
        if name in ("probe", "minilm"):
            continue
        write_identity(root, name, datatype, dims, max_batch_size=8 if batched else 0)
    write_probe(root, "probe", max_batch_size=8)
    if (ENGINES / "minilm" / "1" / "model.onnx").exists():
        (root / "minilm").symlink_to(ENGINES / "minilm", target_is_directory=True)
    with ServerThread(root) as s:
        with s.client() as c:
            yield s, c


# -- strategies --------------------------------------------------------------------------------

TYPED_FIELDS = ["bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                "fp32_contents", "fp64_contents", "bytes_contents"]
text = st.text(max_size=12)
dims = st.one_of(
    st.integers(0, 6), st.integers(0, 6), st.integers(0, 6),
    st.sampled_from([-1, -2, -(2**63), 2**31, 2**40, 2**62, 2**63 - 1]),  # int64's ends included
)


def bytes_elements(draw, count: int) -> bytes:
    """BYTES raw data for ``count`` elements: valid, or with a broken length prefix."""
    values = draw(st.lists(st.binary(max_size=20), min_size=count, max_size=count))
    parts = [struct.pack("<I", len(b)) + b for b in values]
    data = b"".join(parts)
    breakage = draw(st.sampled_from(["none", "none", "long prefix", "truncate", "extra", "huge prefix"]))
    if breakage == "long prefix" and data:
        data = struct.pack("<I", len(data) + 5) + data[4:]
    elif breakage == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif breakage == "extra":
        data += draw(st.binary(min_size=1, max_size=6))
    elif breakage == "huge prefix":
        data = struct.pack("<I", 0xFFFFFFFF) + data
    return data


def typed_values(draw, field: str, count: int) -> list:
    count = min(count, 64)
    element = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(2**31), 2**31 - 1),
        "int64_contents": st.integers(-(2**63), 2**63 - 1),
        "uint_contents": st.integers(0, 2**32 - 1),
        "uint64_contents": st.integers(0, 2**64 - 1),
        "fp32_contents": st.floats(width=32, allow_nan=True),
        "fp64_contents": st.floats(allow_nan=True),
        "bytes_contents": st.binary(max_size=16),
    }[field]
    return draw(st.lists(element, min_size=count, max_size=count))


@st.composite
def tensors(draw, model: str):
    """One input tensor and its raw bytes (None: typed contents were set instead)."""
    real_name, real_type, real_dims, batched = MODELS.get(model, ("INPUT0", "FP32", (-1,), True))
    name = draw(st.one_of(st.just(real_name), st.just(real_name), text))
    datatype = draw(st.one_of(st.just(real_type), st.just(real_type), st.sampled_from(sorted(DATATYPES)), text))
    if draw(st.booleans()):  # a plausible shape
        batch = [draw(st.integers(1, 4))] if batched else []
        shape = batch + [draw(st.integers(1, 5)) if d == -1 else d for d in real_dims]
    else:
        shape = draw(st.lists(dims, max_size=4))
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    for key, value in draw(st.dictionaries(text, st.integers(-(2**63), 2**63 - 1), max_size=2)).items():
        tensor.parameters[key].int64_param = value
    small = all(0 <= d <= 4096 for d in shape) and math.prod(shape) <= 4096
    count = math.prod(shape) if small else draw(st.integers(0, 8))
    dt = DATATYPES.get(datatype)
    how = draw(st.sampled_from(["raw", "raw", "raw", "typed", "typed wrong field", "raw random"]))
    if how == "raw" and dt is not None and dt.name == "BYTES":
        return tensor, bytes_elements(draw, count)
    if how == "raw" and dt is not None:
        size = count * dt.itemsize + draw(st.sampled_from([0, 0, 0, -1, 1, 4, -4]))
        return tensor, bytes(draw(st.binary(min_size=max(size, 0), max_size=max(size, 0))))
    if how == "raw random" or dt is None:
        return tensor, draw(st.binary(max_size=64))
    field = dt.contents_field if how == "typed" and dt.contents_field else draw(st.sampled_from(TYPED_FIELDS))
    getattr(tensor.contents, field).extend(typed_values(draw, field, count))
    return tensor, None


def parameter(draw, message_parameters) -> None:
    key = draw(st.sampled_from(["timeout", "priority", "timeout", "priority", "triton_unknown",
                                "triton_enable_empty_final_response", "binary_data_output", "x"]))
    kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
    value = {
        "bool_param": st.booleans(),
        "int64_param": st.one_of(st.integers(-5, 3_000_000), st.integers(-(2**63), 2**63 - 1)),
        "string_param": text,
        "double_param": st.floats(allow_nan=True),
        "uint64_param": st.one_of(st.integers(0, 5), st.integers(0, 2**64 - 1)),
    }[kind]
    setattr(message_parameters[key], kind, draw(value))


def well_formed_tensor(draw, model: str):
    """A correct input for ``model`` (random values, shape and encoding) and its raw bytes."""
    name, datatype, real_dims, batched = MODELS[model]
    dt = DATATYPES[datatype]
    batch = [draw(st.integers(1, 9))] if batched else []
    shape = batch + [draw(st.integers(1, 6)) if d == -1 else d for d in real_dims]
    count = math.prod(shape)
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if dt.name == "BYTES":
        texts = st.text(max_size=24).map(str.encode) if model == "minilm" else st.binary(max_size=24)
        values = draw(st.lists(texts, min_size=count, max_size=count))
        if draw(st.booleans()) or dt.contents_field is None:
            return tensor, b"".join(struct.pack("<I", len(v)) + v for v in values)
        tensor.contents.bytes_contents.extend(values)
        return tensor, None
    if dt.contents_field is not None and draw(st.integers(0, 3)) == 0:
        field = dt.contents_field
        lo, hi = {"BOOL": (0, 1), "INT8": (-128, 127), "UINT64": (0, 2**64 - 1)}.get(datatype, (None, None))
        if datatype == "FP32":
            values = draw(st.lists(st.floats(width=32), min_size=count, max_size=count))
        elif datatype == "BOOL":
            values = draw(st.lists(st.booleans(), min_size=count, max_size=count))
        else:
            values = draw(st.lists(st.integers(lo, hi), min_size=count, max_size=count))
        getattr(tensor.contents, field).extend(values)
        return tensor, None
    raw = draw(st.binary(min_size=count * dt.itemsize, max_size=count * dt.itemsize))
    if datatype == "BOOL":
        raw = bytes(b & 1 for b in raw)
    return tensor, raw


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def shifted(dim: int, delta: int) -> int:
    """``dim`` moved by ``delta``, kept inside int64 (a shape is ``repeated int64``): a client
    can send any int64, and nothing else, so a step past either end goes the other way."""
    moved = dim + delta
    return moved if INT64_MIN <= moved <= INT64_MAX else dim - delta


MUTATIONS = ["datatype", "dim", "zero dim", "negative dim", "huge dim", "drop batch dim", "bytes +1", "bytes -1",
             "broken prefix", "duplicate input", "extra input", "missing raw", "typed wrong field", "version",
             "unknown output", "classification", "bad parameter", "no inputs"]


@st.composite
def requests(draw):
    """Half the time a well-formed request with 0-2 mutations; otherwise anything."""
    if draw(st.booleans()):
        return draw(mutated())
    model = draw(st.one_of(st.sampled_from(sorted(MODELS)), st.sampled_from(sorted(MODELS)), text))
    request = pb.ModelInferRequest(
        model_name=model,
        model_version=draw(st.sampled_from(["", "", "", "", "1", "2", "latest"])),
        id=draw(text),
    )
    raws, typed = [], False
    for _ in range(draw(st.integers(0, 3))):
        tensor, raw = draw(tensors(model))
        request.inputs.append(tensor)
        if raw is None:
            typed = True
        else:
            raws.append(raw)
    if draw(st.booleans()) and request.inputs:  # a duplicate input
        request.inputs.append(request.inputs[0])
        raws.append(raws[0] if raws else b"")
    if raws and not (typed and draw(st.booleans())):
        request.raw_input_contents.extend(raws[: len(raws) - draw(st.sampled_from([0, 0, 0, 1]))])
    for _ in range(draw(st.integers(0, 2))):
        parameter(draw, request.parameters)
    for _ in range(draw(st.integers(0, 2))):
        out = request.outputs.add(name=draw(st.sampled_from(["OUTPUT0", "EMBEDDING", "NOPE", ""])))
        if draw(st.integers(0, 4)) == 0:
            out.parameters["classification"].int64_param = draw(st.integers(-1, 5))
        if draw(st.booleans()):
            out.parameters["binary_data"].bool_param = draw(st.booleans())
    return request


@st.composite
def mutated(draw):
    model = draw(st.sampled_from(sorted(MODELS)))
    request = pb.ModelInferRequest(model_name=model, model_version=draw(st.sampled_from(["", "1"])), id=draw(text))
    tensor, raw = well_formed_tensor(draw, model)
    request.inputs.append(tensor)
    raws = [raw] if raw is not None else []
    if draw(st.booleans()):
        request.parameters["timeout"].int64_param = draw(st.integers(0, 5_000_000))
    if draw(st.booleans()):
        request.parameters["priority"].uint64_param = draw(st.integers(0, 3))
    if draw(st.booleans()):
        request.outputs.add(name=MODELS[model][0].replace("INPUT0", "OUTPUT0").replace("TEXT", "EMBEDDING"))
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)):
        t = request.inputs[0] if request.inputs else None
        if mutation == "datatype" and t is not None:
            t.datatype = draw(st.sampled_from(sorted(DATATYPES) + ["TYPE_FP32", "fp32", ""]))
        elif mutation in ("dim", "zero dim", "negative dim", "huge dim") and t is not None and t.shape:
            axis = draw(st.integers(0, len(t.shape) - 1))
            t.shape[axis] = {"dim": shifted(t.shape[axis], draw(st.sampled_from([-1, 1, 2]))), "zero dim": 0,
                             "negative dim": draw(st.sampled_from([-1, -2, INT64_MIN])),
                             "huge dim": draw(st.sampled_from([2**31, 2**62, INT64_MAX]))}[mutation]
        elif mutation == "drop batch dim" and t is not None and t.shape:
            del t.shape[0]
        elif mutation in ("bytes +1", "bytes -1") and raws:
            raws[0] = raws[0] + b"\0" if mutation == "bytes +1" else raws[0][:-1]
        elif mutation == "broken prefix" and raws and len(raws[0]) >= 4:
            raws[0] = struct.pack("<I", draw(st.integers(0, 2**32 - 1))) + raws[0][4:]
        elif mutation == "duplicate input" and t is not None:
            request.inputs.append(t)
            if raws:
                raws.append(raws[0])
        elif mutation == "extra input":
            request.inputs.add(name=draw(text), datatype="FP32", shape=[1, 1])
            if raws:
                raws.append(b"\0" * 4)
        elif mutation == "missing raw" and raws:
            raws.pop()
        elif mutation == "typed wrong field" and t is not None:
            field = draw(st.sampled_from(TYPED_FIELDS))
            getattr(t.contents, field).extend(typed_values(draw, field, draw(st.integers(0, 6))))
        elif mutation == "version":
            request.model_version = draw(st.sampled_from(["2", "0", "-1", "latest", "1.0"]))
        elif mutation == "unknown output":
            request.outputs.add(name=draw(text))
        elif mutation == "classification":
            out = request.outputs[0] if request.outputs else request.outputs.add(name="OUTPUT0")
            out.parameters["classification"].int64_param = draw(st.integers(-1, 5))
        elif mutation == "bad parameter":
            parameter(draw, request.parameters)
        elif mutation == "no inputs":
            del request.inputs[:]
            raws = []
    request.raw_input_contents.extend(raws)
    return request


# -- properties --------------------------------------------------------------------------------


def check_ok_response(request: pb.ModelInferRequest, response: pb.ModelInferResponse) -> None:
    assert len(response.outputs) == len(response.raw_output_contents) >= 1
    if request.outputs:
        assert [o.name for o in response.outputs] == [o.name for o in request.outputs]
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        parse_response(pb.ModelInferResponse(outputs=[tensor], raw_output_contents=[raw]))  # raises on a bad length
        assert all(d >= 1 for d in tensor.shape)


def check_server(server, client) -> None:
    """Live, and a well-formed request right after returns exact values."""
    assert client.stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = client.infer("identity_fp32", {"INPUT0": x}, timeout=10)["OUTPUT0"]
    assert out.tobytes() == x.tobytes()
    words = np.array([[b"fuzz"], [b"\xf0\x9f\x98\x80 ok"]], dtype=object)
    assert client.infer("echo_bytes", {"INPUT0": words}, timeout=10)["OUTPUT0"].tolist() == words.tolist()


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
STREAM_FUZZ = settings(FUZZ, max_examples=max(EXAMPLES // 3, 10))


@FUZZ
@given(request=requests())
def test_unary_fuzz_answers_only_documented_statuses(srv, request):
    server, client = srv
    try:
        response = client.stub.ModelInfer(request, timeout=20)
        code = "OK"
    except grpc.RpcError as exc:
        code, response = exc.code().name, None
        assert exc.details(), "an error needs a message"
    event(f"{code} {request.model_name if request.model_name in MODELS else '(unknown model)'}")
    assert code in ALLOWED, (code, request)
    if response is not None:
        check_ok_response(request, response)
    check_server(server, client)


@STREAM_FUZZ
@given(batch=st.lists(requests(), min_size=1, max_size=8))
def test_stream_fuzz_answers_every_message_once_and_the_stream_ends_ok(srv, batch):
    server, client = srv
    for i, request in enumerate(batch):
        request.id = f"m{i}"
    messages = list(client.stub.ModelStreamInfer(iter(batch), timeout=30))
    ids = [m.infer_response.id for m in messages]
    assert sorted(ids) == sorted(f"m{i}" for i in range(len(batch)))
    for m in messages:
        code = error_code(m)
        event(f"stream {code}")
        assert code in ALLOWED, (code, m.error_message)
        if code == "OK":
            check_ok_response(batch[int(m.infer_response.id[1:])], m.infer_response)
    check_server(server, client)


def test_the_fuzzer_reaches_every_status_it_allows(srv):
    """A fixed sample of the same generator, to show it is not stuck on one kind of answer."""
    server, client = srv
    seen = set()
    for request in [
        build_request("identity_fp32", {"INPUT0": np.ones((1, 2), np.float32)}),
        build_request("nope", {"INPUT0": np.ones((1, 2), np.float32)}),
        build_request("identity_fp32", {"INPUT0": np.ones((1, 2), np.float64)}),
        build_request("probe", {"INPUT0": np.ones((1, 2), np.float32)}, timeout_us=1),
    ]:
        try:
            client.stub.ModelInfer(request, timeout=10)
            seen.add("OK")
        except grpc.RpcError as exc:
            seen.add(exc.code().name)
    assert seen == {"OK", "NOT_FOUND", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED"}


def test_the_generator_writes_only_shapes_a_client_can_send():
    """A "dim" step after a "negative dim" or "huge dim" one stays inside int64 (it wrote
    -2**63 - 1 into a shape, and protobuf refused it inside the generator)."""
    for dim in (INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX):
        for delta in (-1, 1, 2):
            tensor = pb.ModelInferRequest.InferInputTensor(shape=[shifted(dim, delta)])
            assert pb.ModelInferRequest.InferInputTensor.FromString(tensor.SerializeToString()).shape[0] != dim
