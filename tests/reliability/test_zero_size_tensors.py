"""C02: an empty tensor or a zero batch never reaches an engine and never hurts the server.

Documented policy (docs/reference/grpc.md, "Requests"): every dimension must be >= 1; a zero-size tensor is
refused with INVALID_ARGUMENT at admission. (a) [1,0] FP16 with 0 bytes to an FP16 model
with dims [-1]; (b) [0,8] FP32 to identity_fp32; (c) a [1,0] request sent at the same moment
as 7 normal [1,8] requests (50 ms fixed window, so they share a batch). After each, a normal
request returns OK and ServerLive stays true. The same for BYTES, typed contents and stream
messages. Not scaled.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import error_code, raw_request, stream, write_identity

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("c02")
    window = "max_queue_delay_microseconds: 50000"
    fixed = {"batching": "fixed"}
    write_identity(root, "identity_fp32", "FP32", (-1,), dynamic=window, parameters=fixed)
    write_identity(root, "fp16", "FP16", (-1,), dynamic=window, parameters=fixed)
    write_identity(root, "echo_bytes", "BYTES", (-1,))
    with ServerThread(root) as s:
        yield s


def assert_still_serving(c):
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x}, timeout=10)["OUTPUT0"], x)
    assert c.stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def refused(c, request, *words):
    with pytest.raises(grpc.RpcError) as err:
        c.stub.ModelInfer(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    for word in ("INPUT0", ">= 1", *words):
        assert word in err.value.details()


def typed_empty(model: str, datatype: str, shape: list[int], field: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend([])
    return request


def test_a_empty_fp16_row_is_invalid_argument(srv):
    with srv.client() as c:
        refused(c, raw_request("fp16", "FP16", [1, 0], b""), "[1, 0]")
        assert_still_serving(c)
    assert srv.registry.get("fp16").dispatcher.stats.rows == 0


@pytest.mark.parametrize(
    "request_",
    [
        raw_request("identity_fp32", "FP32", [0, 8], b""),
        typed_empty("identity_fp32", "FP32", [0, 8], "fp32_contents"),
        raw_request("echo_bytes", "BYTES", [0, 1], b""),
        typed_empty("echo_bytes", "BYTES", [1, 0], "bytes_contents"),
        raw_request("identity_fp32", "FP32", [0, 0], b""),
    ],
    ids=["b raw [0,8]", "b typed [0,8]", "bytes [0,1]", "bytes typed [1,0]", "[0,0]"],
)
def test_b_zero_batch_and_empty_tensors_are_invalid_argument(srv, request_):
    with srv.client() as c:
        refused(c, request_)
        assert_still_serving(c)


def test_b_zero_batch_message_names_the_batch_size(srv):
    with srv.client() as c:
        refused(c, raw_request("identity_fp32", "FP32", [0, 8], b""), "zero batch size")


def test_c_empty_request_in_a_batch_of_normal_ones(srv):
    stats = srv.registry.get("identity_fp32").dispatcher.stats
    rows_before = stats.rows
    xs = [np.full((1, 8), i + 1, np.float32) for i in range(7)]
    go = threading.Barrier(8)
    with srv.client() as c, ThreadPoolExecutor(8) as pool:
        def send(request):
            go.wait()
            try:
                return grpc.StatusCode.OK, c.stub.ModelInfer(request, timeout=10)
            except grpc.RpcError as exc:
                return exc.code(), None

        empty = pool.submit(send, raw_request("identity_fp32", "FP32", [1, 0], b""))
        normal = [pool.submit(send, build_request("identity_fp32", {"INPUT0": x})) for x in xs]
        assert empty.result()[0] == grpc.StatusCode.INVALID_ARGUMENT
        for x, f in zip(xs, normal):
            code, response = f.result()
            assert code == grpc.StatusCode.OK
            assert response.raw_output_contents[0] == x.tobytes()
        assert_still_serving(c)
    assert stats.rows - rows_before == 7 + 1  # the 7 normal rows and the follow-up; never the empty one
    assert max(stats.batch_sizes) > 1  # they did share batches


def test_empty_stream_messages_get_their_own_error_and_the_stream_goes_on(srv):
    requests = [
        raw_request("fp16", "FP16", [1, 0], b"", request_id="a"),
        raw_request("identity_fp32", "FP32", [0, 8], b"", request_id="b"),
        build_request("identity_fp32", {"INPUT0": np.ones((1, 3), np.float32)}, request_id="ok"),
    ]
    with srv.client() as c:
        messages, code = stream(c.stub, requests, timeout=30)
        assert_still_serving(c)
    assert code == grpc.StatusCode.OK
    expected = {"a": "INVALID_ARGUMENT", "b": "INVALID_ARGUMENT", "ok": "OK"}
    assert {m.infer_response.id: error_code(m) for m in messages} == expected
