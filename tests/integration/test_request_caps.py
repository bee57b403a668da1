"""Per-request caps (issue 8): forged sizes (shapes of 2^62 elements, BYTES lengths and counts past
the message) are refused INVALID_ARGUMENT naming the input without allocating, and
``max_request_elements`` counts every input of a request.
"""

from __future__ import annotations

import tracemalloc

import grpc
import numpy as np
import pytest

from integration.helpers import row, write_identity
from servers import code_of
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import InvalidRequest
from trtserve.protocol import codec


def raw(model: str, datatype: str, shape: list[int], data: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


FORGED = {
    "shape [2^31, 2^31]": ("identity_fp32", "FP32", [2**31, 2**31], b"\0" * 8),
    "BYTES length past the message": ("echo_bytes", "BYTES", [1, 1], b"\xff\xff\xff\x7f" + b"abc"),
    "BYTES count past the message": ("echo_bytes", "BYTES", [1, 2**28], b"\x01\0\0\0a" * 2),
    "BYTES typed [2^31, 2^31]": ("echo_bytes", "BYTES", [2**31, 2**31], b""),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_sizes_are_refused_without_allocating(server, case):
    model, datatype, shape, data = FORGED[case]
    request = raw(model, datatype, shape, data)
    if not data:
        del request.raw_input_contents[:]
        request.inputs[0].contents.bytes_contents.append(b"x")
    spec = server.registry.get(model).spec
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as err:
            codec.decode_inputs(request, spec, max_elements=512 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "INPUT0" in str(err.value)
    assert peak < 1 << 20, f"{peak} bytes allocated while refusing"
    with server.client() as c:  # and over the wire: INVALID_ARGUMENT, then the server still serves
        assert code_of(c.stub.ModelInfer, request) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(c.infer, "identity_fp32", row(3)) == grpc.StatusCode.OK


def test_max_request_elements_counts_every_input_of_the_request(make_server, tmp_path):
    write_identity(tmp_path)
    srv = make_server(tmp_path, max_request_elements=64)
    with srv.client() as c:
        assert code_of(c.infer, "ident", {"INPUT0": np.ones((2, 32), np.float32)}) == grpc.StatusCode.OK
        with pytest.raises(grpc.RpcError) as err:
            c.infer("ident", {"INPUT0": np.ones((1, 65), np.float32)})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "65 elements" in err.value.details() and "64" in err.value.details()
    from trtserve.repository import load_spec

    (tmp_path / "pair" / "1").mkdir(parents=True)
    (tmp_path / "pair" / "config.pbtxt").write_text(
        'name: "pair" platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ] '
        'output [ { name: "C" data_type: TYPE_FP32 dims: [ -1 ] } ]'
    )
    two = pb.ModelInferRequest(model_name="pair")
    for name in "AB":
        two.inputs.add(name=name, datatype="FP32", shape=[1, 40])
        two.raw_input_contents.append(b"\0" * 160)
    with pytest.raises(InvalidRequest, match="input 'B'.* 80 elements"):
        codec.decode_inputs(two, load_spec(tmp_path / "pair"), max_elements=64)
