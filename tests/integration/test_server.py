"""A real trtserve on 127.0.0.1 with real ONNX Runtime, driven by real gRPC clients."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import InferError, build_request, parse_response
from trtserve.datatypes import DATATYPES
from trtserve.testing.models import config_text, identity, write_model

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = DATATYPES[datatype].numpy
    if datatype == "BYTES":
        values = [bytes(rng.integers(0, 128, rng.integers(0, 12)).astype(np.uint8)) for _ in range(int(np.prod(shape)))]
        flat = np.array(values, dtype=object)
        return flat.reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture(scope="module")
def dtype_server(tmp_path_factory):
    """identity_<type> for every KServe datatype ONNX Runtime can serve, plus a model without a batch dim."""
    from servers import ServerThread

    root = tmp_path_factory.mktemp("repo")
    for dt in [*NUMERIC, "BYTES", "BF16"]:
        name = f"identity_{dt.lower()}"
        config = config_text(name, [("INPUT0", dt, (-1,))], [("OUTPUT0", dt, (-1,))])
        write_model(root, name, identity(dt, (-1,)), config)
    write_model(
        root, "nobatch", identity("FP32", (2, 3), batched=False),
        config_text("nobatch", [("INPUT0", "FP32", (2, 3))], [("OUTPUT0", "FP32", (2, 3))], max_batch_size=0, extra=""),
    )
    with ServerThread(root) as srv:
        yield srv


@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
def test_every_datatype_round_trips_raw(dtype_server, datatype):
    x = sample(datatype, (3, 5))
    with dtype_server.client() as c:
        out = c.infer(f"identity_{datatype.lower()}", {"INPUT0": x})["OUTPUT0"]
    assert out.shape == x.shape
    if datatype == "BYTES":
        assert out.tolist() == x.tolist()
    else:
        assert out.dtype == x.dtype
        assert out.tobytes() == x.tobytes()  # bit-exact, NaN payloads and signed zeros included


@pytest.mark.parametrize("datatype", [d for d in NUMERIC + ["BYTES"] if DATATYPES[d].contents_field])
def test_every_typed_contents_field_is_accepted(dtype_server, datatype):
    x = sample(datatype, (2, 4), seed=1)
    request = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=x.shape)
    getattr(tensor.contents, DATATYPES[datatype].contents_field).extend(x.reshape(-1).tolist())
    with dtype_server.client() as c:
        out = parse_response(c.stub.ModelInfer(request))["OUTPUT0"]
    assert out.tolist() == x.tolist()


def test_fp16_special_values_round_trip_bit_exact(dtype_server):
    bits = np.array([[0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E00, 0x3C00]], dtype=np.uint16)
    x = bits.view(np.float16)
    with dtype_server.client() as c:
        out = c.infer("identity_fp16", {"INPUT0": x})["OUTPUT0"]
    assert out.view(np.uint16).tolist() == bits.tolist()


def test_bf16_onnx_model_is_not_ready_with_a_reason(dtype_server):
    with dtype_server.client() as c:
        assert not c.is_ready("identity_bf16")
        assert c.is_ready("identity_fp32")
        with pytest.raises(grpc.RpcError) as err:
            c.infer("identity_bf16", {"INPUT0": np.ones((1, 2), ml_dtypes.bfloat16)})
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "bfloat16" in err.value.details()


def test_model_without_batch_dimension(dtype_server):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with dtype_server.client() as c:
        np.testing.assert_array_equal(c.infer("nobatch", {"INPUT0": x})["OUTPUT0"], x)
        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="nobatch"))
    assert list(meta.inputs[0].shape) == [2, 3]


def raw_request(model: str, name: str, datatype: str, shape: list[int], data: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


FIVE = np.arange(5, dtype=np.float32).tobytes()
BAD_REQUESTS = {
    "too many bytes": (
        raw_request("identity_fp32", "INPUT0", "FP32", [1, 5], FIVE + b"\0" * 8), ["INPUT0", "20", "28"]
    ),
    "too few bytes": (raw_request("identity_fp32", "INPUT0", "FP32", [1, 5], FIVE[:12]), ["INPUT0", "20", "12"]),
    "wrong datatype": (raw_request("identity_fp32", "INPUT0", "INT32", [1, 5], FIVE), ["INPUT0", "INT32", "FP32"]),
    "unknown datatype": (raw_request("identity_fp32", "INPUT0", "FLOAT", [1, 5], FIVE), ["INPUT0", "FLOAT"]),
    "unknown input": (raw_request("identity_fp32", "INPUT9", "FP32", [1, 5], FIVE), ["INPUT9", "INPUT0"]),
    "missing batch dim": (
        raw_request("tiny", "INPUT", "FP32", [64], bytes(256)), ["INPUT", "[-1, 64]", "[64]", "batch"]
    ),
    "wrong dim": (raw_request("tiny", "INPUT", "FP32", [1, 63], bytes(252)), ["INPUT", "[1, 63]", "[-1, 64]"]),
    "zero batch": (raw_request("tiny", "INPUT", "FP32", [0, 64], b""), ["INPUT", "batch size"]),
    "zero dim": (raw_request("identity_fp32", "INPUT0", "FP32", [1, 0], b""), ["INPUT0", "zero"]),
    "negative dim": (raw_request("identity_fp32", "INPUT0", "FP32", [1, -3], b""), ["INPUT0", "negative"]),
    "overflowing shape": (raw_request("identity_fp32", "INPUT0", "FP32", [2**40, 2**40], b""), ["INPUT0"]),
    "broken BYTES prefix": (
        raw_request("echo_bytes", "INPUT0", "BYTES", [1, 1], b"\x09\0\0\0abc"), ["INPUT0", "9 bytes"]
    ),
    "non-UTF-8 text for ONNX": (
        raw_request("echo_bytes", "INPUT0", "BYTES", [1, 1], b"\x02\0\0\0\xff\xfe"), ["INPUT0", "UTF-8"]
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_is_invalid_argument_naming_the_tensor(server, case):
    request, words = BAD_REQUESTS[case]
    with server.client() as c, pytest.raises(grpc.RpcError) as err:
        c.stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in err.value.details()


def test_duplicate_and_missing_inputs_and_unknown_outputs(server):
    dup = raw_request("identity_fp32", "INPUT0", "FP32", [1, 5], FIVE)
    dup.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 5])
    dup.raw_input_contents.append(FIVE)
    missing = pb.ModelInferRequest(model_name="identity_fp32")
    unknown_out = raw_request("identity_fp32", "INPUT0", "FP32", [1, 5], FIVE)
    unknown_out.outputs.add(name="NOPE")
    typed_fp16 = pb.ModelInferRequest(model_name="identity_fp32")
    t = typed_fp16.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    t.contents.int_contents.extend([1, 2])
    cases = ((dup, "more than once"), (missing, "missing input 'INPUT0'"), (unknown_out, "NOPE"),
             (typed_fp16, "int_contents"))
    for request, word in cases:
        with server.client() as c, pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, word
        assert word in err.value.details()


def test_unknown_model_and_version_are_not_found(server):
    with server.client() as c:
        unknown = (raw_request("nope", "X", "FP32", [1], b"\0" * 4),
                   pb.ModelInferRequest(model_name="tiny", model_version="7"))
        for request in unknown:
            with pytest.raises(grpc.RpcError) as err:
                c.stub.ModelInfer(request)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


def reference_tiny(engines, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(engines / "tiny" / "1" / "model.onnx"))
    return np.concatenate([session.run(None, {"INPUT": x[i : i + 1]})[0] for i in range(len(x))])


def test_32_concurrent_clients_get_exactly_their_own_rows(server, engines):
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(32 * 8)]
    expected = [reference_tiny(engines, x) for x in inputs]
    before = server.registry.get("tiny").dispatcher.stats.batches
    start = threading.Barrier(32)

    def client(k: int) -> list[bool]:
        with server.client() as c:
            start.wait()
            return [
                np.allclose(c.infer("tiny", {"INPUT": inputs[j]})["OUTPUT"], expected[j], atol=1e-5)
                for j in range(k, len(inputs), 32)
            ]

    with ThreadPoolExecutor(32) as pool:
        results = [ok for oks in pool.map(client, range(32)) for ok in oks]
    assert len(results) == len(inputs) and all(results)
    stats = server.registry.get("tiny").dispatcher.stats
    assert stats.batches - before < len(inputs)  # some requests shared a batch


def test_batching_changes_no_answer_with_padding(server):
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal((1, n)).astype(np.float32) for n in rng.integers(1, 300, 64)]
    with server.client() as c:
        alone = [c.infer("identity_fp32", {"INPUT0": r})["OUTPUT0"] for r in rows]
        streamed = dict(c.stream_infer("identity_fp32", ({"INPUT0": r} for r in rows)))
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(alone[i], r)
        assert streamed[str(i)]["OUTPUT0"].shape == r.shape
        np.testing.assert_allclose(streamed[str(i)]["OUTPUT0"], alone[i], atol=1e-5)


def test_tiny_rows_batched_equal_rows_alone(server):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((48, 64)).astype(np.float32)
    with server.client() as c:
        together = c.infer("tiny", {"INPUT": x})["OUTPUT"]
        alone = np.concatenate([c.infer("tiny", {"INPUT": x[i : i + 1]})["OUTPUT"] for i in range(len(x))])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_request_larger_than_max_batch_size_is_split_and_gathered(server, engines):
    x = np.random.default_rng(1).standard_normal((150, 64)).astype(np.float32)
    with server.client() as c:
        out = c.infer("tiny", {"INPUT": x})["OUTPUT"]
    np.testing.assert_allclose(out, reference_tiny(engines, x), atol=1e-5)


def test_stream_of_1000_messages_each_answered_once(server):
    xs = [np.full((1, 1 + i % 7), i, dtype=np.float32) for i in range(1000)]
    with server.client() as c:
        seen = list(c.stream_infer("identity_fp32", ((f"id-{i}", {"INPUT0": x}) for i, x in enumerate(xs))))
    ids = [request_id for request_id, _ in seen]
    assert sorted(ids) == sorted(f"id-{i}" for i in range(1000))
    for request_id, out in seen:
        i = int(request_id[3:])
        np.testing.assert_array_equal(out["OUTPUT0"], xs[i])


def test_a_bad_message_does_not_end_the_stream(server):
    good = {"INPUT0": np.ones((1, 3), np.float32)}
    bad = {"INPUT0": np.ones((1, 3), np.int32)}
    with server.client() as c:
        results = dict(c.stream_infer("identity_fp32", [("a", good), ("b", bad), ("c", good)]))
    assert isinstance(results["b"], InferError)
    assert results["b"].code == "INVALID_ARGUMENT" and "INPUT0" in results["b"].message
    np.testing.assert_array_equal(results["a"]["OUTPUT0"], good["INPUT0"])
    np.testing.assert_array_equal(results["c"]["OUTPUT0"], good["INPUT0"])


def test_stream_errors_carry_the_request_id_for_unknown_models(server):
    with server.client() as c:
        call = c.stub.ModelStreamInfer(iter([build_request("nope", {"X": np.ones(1, np.float32)}, request_id="r1")]))
        messages = list(call)
    assert len(messages) == 1
    assert messages[0].infer_response.id == "r1"
    assert "unknown model 'nope'" in messages[0].error_message


def test_timeout_parameter_that_no_run_can_meet_is_refused_at_admission(server):
    # 1 µs cannot fit a run: answered DEADLINE_EXCEEDED at once, never queued. The call has no
    # gRPC deadline, so the status and its sentence are the server's. (A request dropped from
    # the queue at its deadline: tests/reliability/test_expired_requests_not_run.py.)
    with server.client() as c, pytest.raises(grpc.RpcError) as err:
        c.stub.ModelInfer(build_request("tiny", {"INPUT": np.ones((1, 64), np.float32)}, timeout_us=1))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    details = err.value.details()
    # Refused by the front end (from the engine core's hint) or by the engine core itself.
    assert details.startswith("the request's deadline") and (
        "'tiny' takes at least" in details or "even on an idle server" in details), details


def test_health_and_metadata(server):
    with server.client() as c:
        assert c.stub.ServerLive(pb.ServerLiveRequest()).live
        assert c.is_ready() and c.is_ready("tiny") and not c.is_ready("nope")
        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="tiny"))
        config = c.stub.ModelConfig(pb.ModelConfigRequest(name="tiny")).config
        stats = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="tiny"))
    assert (meta.inputs[0].name, meta.inputs[0].datatype, list(meta.inputs[0].shape)) == ("INPUT", "FP32", [-1, 64])
    assert config.max_batch_size == 64 and config.input[0].dims == [64]
    assert stats.model_stats[0].name == "tiny" and stats.model_stats[0].execution_count >= 1


def test_broken_model_is_unavailable_with_reason_and_others_serve(make_server, tmp_path):
    config = config_text("good", [("INPUT0", "FP32", (-1,))], [("OUTPUT0", "FP32", (-1,))])
    write_model(tmp_path, "good", identity("FP32", (-1,)), config)
    bad = tmp_path / "bad"
    (bad / "1").mkdir(parents=True)
    (bad / "config.pbtxt").write_text(
        'name: "bad" platform: "onnxruntime_onnx" max_batch_size: 4 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]'
    )
    (bad / "1" / "model.onnx").write_bytes(b"not an onnx file")
    srv = make_server(tmp_path)
    with srv.client() as c:
        assert c.is_ready("good") and not c.is_ready("bad") and not c.is_ready()
        with pytest.raises(grpc.RpcError) as err:
            c.infer("bad", {"X": np.ones((1, 2), np.float32)})
        index = c.stub.RepositoryIndex(pb.RepositoryIndexRequest())
        good = c.infer("good", {"INPUT0": np.ones((1, 2), np.float32)})["OUTPUT0"]
        np.testing.assert_array_equal(good, np.ones((1, 2)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    states = {m.name: (m.state, m.reason) for m in index.models}
    assert states["good"] == ("READY", "")
    assert states["bad"][0] == "UNAVAILABLE" and "model.onnx" in states["bad"][1]
