"""C27: FP16 and BF16 travel as raw little-endian bytes, bit for bit, or are refused clearly.

(a) An ONNX model with a BF16 input and output cannot be served by the ONNX Runtime engine
    (its Python API cannot hand bfloat16 back as numpy): it fails to load with a reason naming
    bfloat16, ModelReady stays false, the server and its other models serve on. The same
    identity as a Python model (platform ``python``, BF16 held as ``ml_dtypes.bfloat16``)
    loads, ModelMetadata says "BF16", and BF16 values as tritonclient encodes them (2 bytes
    per element, little-endian) come back bit-exact.
(b) An FP16 identity returns +-0, subnormals, +-Inf, NaN (several payloads) bit-exact.
(c) FP32 data (4 bytes per element) declared FP16: INVALID_ARGUMENT (byte count).
(d) FP16 declared with the values in ``contents.fp32_contents``: INVALID_ARGUMENT (FP16 has no
    typed contents field).
(e) Datatype "BF16" sent to an FP32 model: INVALID_ARGUMENT naming both types.
Not scaled.
"""

from __future__ import annotations

import textwrap

import grpc
import ml_dtypes
import numpy as np
import pytest
from casekit import raw_request, write_identity

from trtserve._proto.inference import grpc_service_pb2 as pb

BF16_ECHO = """
    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"].copy()}
"""

FP16_SPECIAL = np.array(
    [0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x3C00, 0x7BFF],
    dtype="<u2",
)  # +0, -0, smallest subnormal, largest subnormal, -subnormal, +Inf, -Inf, NaN, signalling NaN, -NaN, 1, max


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("c27")
    write_identity(root, "bf16_onnx", "BF16", (-1,))
    write_identity(root, "fp16", "FP16", (-1,))
    write_identity(root, "fp32", "FP32", (-1,))
    (root / "bf16_py" / "1").mkdir(parents=True)
    (root / "bf16_py" / "1" / "model.py").write_text(textwrap.dedent(BF16_ECHO))
    (root / "bf16_py" / "config.pbtxt").write_text(
        'name: "bf16_py" backend: "python" max_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]\n'
        "dynamic_batching { }\n"
    )
    with ServerThread(root) as s:
        yield s


def refused(c, request, *words):
    with pytest.raises(grpc.RpcError) as err:
        c.stub.ModelInfer(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in ("INPUT0", *words):
        assert word in err.value.details(), err.value.details()


def test_a_bf16_onnx_model_is_not_ready_with_a_reason_and_a_python_bf16_model_round_trips(srv):
    entry = srv.registry.models["bf16_onnx"]
    assert "bfloat16" in entry.reason
    with srv.client() as c:
        assert not c.stub.ModelReady(pb.ModelReadyRequest(name="bf16_onnx")).ready
        index = {m.name: m for m in c.stub.RepositoryIndex(pb.RepositoryIndexRequest()).models}
        assert index["bf16_onnx"].state == "UNAVAILABLE" and "bfloat16" in index["bf16_onnx"].reason
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(raw_request("bf16_onnx", "BF16", [1, 2], b"\0" * 4))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "bfloat16" in err.value.details()

        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="bf16_py"))
        assert meta.inputs[0].datatype == meta.outputs[0].datatype == "BF16"
        values = np.array([0.0, -0.0, 1.0, -2.5, 3.14159, 1e-40, 3.0e38, np.inf, -np.inf, np.nan], np.float32)
        bf16 = values.astype(ml_dtypes.bfloat16).reshape(1, -1)  # what tritonclient sends for BF16
        raw = bf16.tobytes()
        assert len(raw) == 2 * values.size
        response = c.stub.ModelInfer(raw_request("bf16_py", "BF16", [1, values.size], raw), timeout=10)
        assert response.outputs[0].datatype == "BF16" and response.raw_output_contents[0] == raw
        # And the fp32 model still serves.
        x = np.ones((1, 3), np.float32)
        np.testing.assert_array_equal(c.infer("fp32", {"INPUT0": x})["OUTPUT0"], x)


def test_b_fp16_special_values_round_trip_bit_exact(srv):
    raw = FP16_SPECIAL.tobytes()
    with srv.client() as c:
        response = c.stub.ModelInfer(raw_request("fp16", "FP16", [1, FP16_SPECIAL.size], raw), timeout=10)
    assert response.outputs[0].datatype == "FP16"
    assert response.raw_output_contents[0] == raw
    assert np.frombuffer(response.raw_output_contents[0], "<u2").tolist() == FP16_SPECIAL.tolist()


def test_c_fp32_bytes_declared_fp16_are_refused(srv):
    with srv.client() as c:
        refused(c, raw_request("fp16", "FP16", [1, 4], np.ones(4, np.float32).tobytes()), "needs 8 bytes", "got 16")


def test_d_fp16_in_typed_contents_is_refused(srv):
    request = pb.ModelInferRequest(model_name="fp16")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    with srv.client() as c:
        refused(c, request, "FP16", "raw_input_contents")


def test_e_bf16_declared_for_an_fp32_model_is_refused_naming_both_types(srv):
    with srv.client() as c:
        refused(c, raw_request("fp32", "BF16", [1, 2], b"\0" * 4), "BF16", "FP32")
