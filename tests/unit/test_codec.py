"""The tensor codec (protocol/codec.py): KServe v2 ``ModelInferRequest`` tensors to numpy and
numpy outputs back to ``ModelInferResponse``, on hand-built messages and specs.

The raw forms are written here byte by byte (little-endian numbers, BYTES as a 4-byte
little-endian length then the data), not with trtserve's client, so the tests pin the wire
format itself. Every refusal is an ``InvalidRequest`` whose sentence names the tensor.
"""

from __future__ import annotations

import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.config import BatchingPolicy
from trtserve.datatypes import DATATYPES
from trtserve.errors import BackendError, InvalidRequest, Unsupported
from trtserve.protocol import codec
from trtserve.spec import ModelSpec, TensorSpec


def spec(*inputs: tuple[str, str, tuple[int, ...]], outputs=(("OUTPUT0", "FP32", (-1,)),), max_batch_size: int = 8,
         split_oversized: bool = True, optional: tuple[str, ...] = ()) -> ModelSpec:
    return ModelSpec(
        name="m", version="3", platform="onnxruntime_onnx",
        inputs=tuple(TensorSpec(n, DATATYPES[dt], dims, n in optional) for n, dt, dims in inputs),
        outputs=tuple(TensorSpec(n, DATATYPES[dt], dims) for n, dt, dims in outputs),
        policy=BatchingPolicy(max_batch_size=max_batch_size, split_oversized=split_oversized),
        instances=1, model_dir=Path("m"), version_dir=Path("m/3"),
    )


def raw_request(*tensors: tuple[str, str, list[int], bytes]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, data in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
    return request


def refusal(request: pb.ModelInferRequest, model: ModelSpec, **kw) -> str:
    with pytest.raises(InvalidRequest) as err:
        codec.decode_inputs(request, model, **kw)
    return str(err.value)


def length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


# -- raw_input_contents ---------------------------------------------------------------------------

RAW = {
    # datatype: (values as the model gets them, their raw little-endian bytes written by hand)
    "FP32": (np.array([[1.5, -2.0, 3.25]], np.float32), struct.pack("<3f", 1.5, -2.0, 3.25)),
    "INT64": (np.array([[-(2**40), 0, 7]], np.int64), struct.pack("<3q", -(2**40), 0, 7)),
    "BOOL": (np.array([[True, False, True]]), bytes([1, 0, 1])),
    "FP16": (np.array([[1.0, -0.0, np.inf]], np.float16), struct.pack("<3e", 1.0, -0.0, float("inf"))),
    # 1.0, -2.0 and 0.5 in bfloat16 are the high halves of their float32 bit patterns
    "BF16": (np.array([[1.0, -2.0, 0.5]], ml_dtypes.bfloat16), struct.pack("<3H", 0x3F80, 0xC000, 0x3F00)),
}


@pytest.mark.parametrize("datatype", sorted(RAW))
def test_raw_numbers_are_read_little_endian_bit_for_bit(datatype):
    expected, data = RAW[datatype]
    tensors, rows = codec.decode_inputs(raw_request(("X", datatype, [1, 3], data)), spec(("X", datatype, (-1,))))
    got = tensors["X"]
    assert rows == 1 and got.shape == (1, 3) and got.dtype == DATATYPES[datatype].numpy
    assert got.tolist() == expected.tolist()
    assert got.tobytes() == expected.tobytes()  # bit-exact: -0.0 and Inf included


def test_raw_bytes_elements_are_length_prefixed_and_may_be_empty():
    data = length_prefixed(b"hello", b"", b"\x00\xff")
    tensors, rows = codec.decode_inputs(raw_request(("T", "BYTES", [3, 1], data)), spec(("T", "BYTES", (1,))))
    assert rows == 3 and tensors["T"].dtype == object
    assert tensors["T"].tolist() == [[b"hello"], [b""], [b"\x00\xff"]]


def test_rows_come_from_the_batch_dimension_and_a_model_without_one_counts_one():
    x = np.arange(12, dtype=np.float32)
    tensors, rows = codec.decode_inputs(raw_request(("X", "FP32", [4, 3], x.tobytes())), spec(("X", "FP32", (3,))))
    assert rows == 4 and tensors["X"].tolist() == x.reshape(4, 3).tolist()
    unbatched = spec(("X", "FP32", (4, 3)), max_batch_size=0)
    tensors, rows = codec.decode_inputs(raw_request(("X", "FP32", [4, 3], x.tobytes())), unbatched)
    assert rows == 1 and tensors["X"].shape == (4, 3)


@pytest.mark.parametrize(("datatype", "shape", "data", "words"), [
    ("FP32", [1, 5], b"\0" * 28, ["'X'", "FP32", "20 bytes", "got 28"]),  # 7 floats for 5
    ("FP32", [1, 5], b"\0" * 12, ["'X'", "20 bytes", "got 12"]),
    ("INT64", [2, 3], b"\0" * 40, ["'X'", "INT64", "48 bytes", "got 40"]),
    ("FP16", [1, 4], b"\0" * 16, ["'X'", "FP16", "8 bytes", "got 16"]),  # FP32 data declared FP16
])
def test_a_byte_length_that_does_not_match_the_shape_is_refused_naming_the_tensor(datatype, shape, data, words):
    message = refusal(raw_request(("X", datatype, shape, data)), spec(("X", datatype, (-1,))))
    assert all(w in message for w in words), message


@pytest.mark.parametrize(("shape", "data", "words"), [
    pytest.param([1, 1], struct.pack("<I", 9) + b"abc",
                 ["input 'T' (BYTES) element 0 declares 9 bytes but only 3 remain"], id="length-past-the-end"),
    pytest.param([1, 1], length_prefixed(b"ab") + b"\x01", ["input 'T' (BYTES) has 1 bytes left over"], id="left-over"),
    pytest.param([2, 1], length_prefixed(b"abcdefgh"), ["input 'T' (BYTES) holds 1 elements; its shape needs 2"],
                 id="too-few-elements"),
    pytest.param([3, 1], length_prefixed(b"ab"), ["input 'T' (BYTES) declares 3 elements", "hold at most 1"],
                 id="more-elements-than-bytes"),
])
def test_broken_bytes_elements_are_refused_naming_the_tensor(shape, data, words):
    message = refusal(raw_request(("T", "BYTES", shape, data)), spec(("T", "BYTES", (1,))))
    assert all(w in message for w in words), message


def test_raw_contents_must_come_one_per_input_and_never_beside_typed_contents():
    model = spec(("A", "FP32", (-1,)), ("B", "FP32", (-1,)))
    one_for_two = raw_request(("A", "FP32", [1, 1], b"\0" * 4))
    one_for_two.inputs.add(name="B", datatype="FP32", shape=[1, 1])
    assert "raw_input_contents has 1 entries for 2 inputs" in refusal(one_for_two, model)
    both = raw_request(("A", "FP32", [1, 1], b"\0" * 4), ("B", "FP32", [1, 1], b"\0" * 4))
    both.inputs[1].contents.fp32_contents.append(1.0)
    assert "input 'B' carries contents.fp32_contents as well as raw_input_contents" in refusal(both, model)


# -- typed contents -------------------------------------------------------------------------------

TYPED = {
    # datatype: (field, values sent, what the model gets)
    "FP32": ("fp32_contents", [0.5, -1.25, 8.0], np.array([[0.5, -1.25, 8.0]], np.float32)),
    "INT64": ("int64_contents", [2**40, -3, 0], np.array([[2**40, -3, 0]], np.int64)),
    "BOOL": ("bool_contents", [True, True, False], np.array([[True, True, False]])),
    "INT8": ("int_contents", [-128, 0, 127], np.array([[-128, 0, 127]], np.int8)),
    "BYTES": ("bytes_contents", [b"a", b"", b"xyz"], np.array([[b"a", b"", b"xyz"]], dtype=object)),
}


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_typed_contents_are_read_from_the_datatypes_own_field(datatype):
    field, values, expected = TYPED[datatype]
    request = pb.ModelInferRequest(model_name="m")
    getattr(request.inputs.add(name="X", datatype=datatype, shape=[1, 3]).contents, field).extend(values)
    tensors, rows = codec.decode_inputs(request, spec(("X", datatype, (3,))))
    assert rows == 1 and tensors["X"].dtype == expected.dtype
    assert tensors["X"].tolist() == expected.tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_has_no_typed_field_and_must_travel_raw(datatype):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="H", datatype=datatype, shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    message = refusal(request, spec(("H", datatype, (2,))))
    assert f"input 'H' is {datatype}, which has no typed contents field" in message and "raw_input_contents" in message


@pytest.mark.parametrize(("datatype", "field", "values", "words"), [
    ("FP32", "int_contents", [1, 2], ["input 'X' (FP32) carries contents.int_contents", "contents.fp32_contents"]),
    ("INT64", "int64_contents", [1, 2, 3], ["input 'X' (INT64, shape [1, 2]) needs 2 values", "got 3"]),
    ("INT8", "int_contents", [1, 300], ["input 'X' (INT8) has a value outside [-128, 127]"]),
])
def test_typed_contents_in_the_wrong_field_count_or_range_are_refused(datatype, field, values, words):
    request = pb.ModelInferRequest(model_name="m")
    getattr(request.inputs.add(name="X", datatype=datatype, shape=[1, 2]).contents, field).extend(values)
    message = refusal(request, spec(("X", datatype, (2,))))
    assert all(w in message for w in words), message


# -- shapes, names, datatypes, limits -------------------------------------------------------------


@pytest.mark.parametrize(("shape", "words"), [
    ([1, 4], ["input 'X' has shape [1, 4]; the model expects [-1, 3]"]),
    ([3], ["input 'X' has shape [3]", "put the batch size first"]),  # the batch dimension left out
    ([1, 1, 3], ["input 'X' has shape [1, 1, 3]; the model expects [-1, 3]"]),
    ([0, 3], ["input 'X'", "a zero batch size carries no data"]),
    ([1, -3], ["input 'X' has a negative dimension"]),
    ([9, 3], ["input 'X' has batch size 9, more than the model's max_batch_size 8"]),
])
def test_a_shape_the_model_does_not_take_is_refused_naming_the_tensor_and_both_shapes(shape, words):
    no_split = spec(("X", "FP32", (3,)), split_oversized=False)
    count = max(0, int(np.prod(shape)))
    message = refusal(raw_request(("X", "FP32", shape, b"\0" * 4 * count)), no_split)
    assert all(w in message for w in words), message


def test_a_variable_dimension_sent_as_minus_one_is_refused():
    # -1 in the config marks a variable size; a request must send the size it has.
    message = refusal(raw_request(("X", "FP32", [1, -1], b"")), spec(("X", "FP32", (-1,))))
    assert "input 'X' has a negative dimension in shape [1, -1]" in message, message


def test_an_oversized_batch_is_accepted_where_the_dispatcher_splits_it():
    x = np.arange(27, dtype=np.float32)
    tensors, rows = codec.decode_inputs(raw_request(("X", "FP32", [9, 3], x.tobytes())), spec(("X", "FP32", (3,))))
    assert rows == 9 and tensors["X"].shape == (9, 3)


def test_the_element_limit_counts_every_input_and_names_the_one_past_it():
    model = spec(("A", "FP32", (-1,)), ("B", "FP32", (-1,)))
    request = raw_request(("A", "FP32", [1, 40], b"\0" * 160), ("B", "FP32", [1, 40], b"\0" * 160))
    tensors, _ = codec.decode_inputs(request, model, max_elements=80)  # exactly at the limit
    assert set(tensors) == {"A", "B"}
    message = refusal(request, model, max_elements=79)
    assert "input 'B' has shape [1, 40]: the request declares 80 elements" in message and "limit of 79" in message


def test_a_forged_shape_is_refused_before_its_size_is_allocated():
    message = refusal(raw_request(("X", "FP32", [2**31, 2**31], b"\0" * 8)), spec(("X", "FP32", (-1,))))
    assert f"input 'X' has shape [{2**31}, {2**31}], more than {codec.MAX_ELEMENTS} elements" in message


def test_names_datatypes_and_batch_sizes_must_agree_with_the_model():
    model = spec(("A", "FP32", (2,)), ("B", "INT64", (1,)), optional=("B",))
    two = np.zeros(2, np.float32).tobytes()
    assert "unexpected input 'C' for model 'm'; its inputs are 'A', 'B'" in refusal(
        raw_request(("C", "FP32", [1, 2], two)), model)
    assert "input 'A' is given more than once" in refusal(
        raw_request(("A", "FP32", [1, 2], two), ("A", "FP32", [1, 2], two)), model)
    assert "input 'A' has datatype FP64; the model expects FP32" in refusal(
        raw_request(("A", "FP64", [1, 2], two * 2)), model)
    assert "input 'A' has unknown datatype 'FLOAT'; expected FP32" in refusal(
        raw_request(("A", "FLOAT", [1, 2], two)), model)
    assert "input 'B' has batch size 1 but other inputs have 2" in refusal(
        raw_request(("A", "FP32", [2, 2], two * 2), ("B", "INT64", [1, 1], b"\0" * 8)), model)
    assert "missing input 'A' for model 'm' (datatype FP32, shape [-1, 2])" in refusal(
        raw_request(("B", "INT64", [1, 1], b"\0" * 8)), model)
    tensors, rows = codec.decode_inputs(raw_request(("A", "FP32", [1, 2], two)), model)  # B is optional
    assert set(tensors) == {"A"} and rows == 1


def test_tensor_parameters_trtserve_does_not_read_are_refused():
    request = raw_request(("X", "FP32", [1, 1], b"\0" * 4))
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(Unsupported, match="input 'X' asks to read its data from a shared-memory region"):
        codec.decode_inputs(request, spec(("X", "FP32", (-1,))))
    del request.inputs[0].parameters["shared_memory_region"]
    request.inputs[0].parameters["colour"].string_param = "red"
    assert "unknown parameter 'colour' on input 'X'" in refusal(request, spec(("X", "FP32", (-1,))))


# -- requested outputs ----------------------------------------------------------------------------

TWO_OUTPUTS = (("OUT_A", "FP32", (-1,)), ("OUT_B", "INT64", (-1,)))


def test_without_requested_outputs_every_output_comes_in_config_order():
    model = spec(("X", "FP32", (-1,)), outputs=TWO_OUTPUTS)
    assert [t.name for t in codec.requested_outputs(pb.ModelInferRequest(), model)] == ["OUT_A", "OUT_B"]


def test_requested_outputs_come_in_the_order_asked_and_binary_data_is_accepted():
    model = spec(("X", "FP32", (-1,)), outputs=TWO_OUTPUTS)
    request = pb.ModelInferRequest()
    request.outputs.add(name="OUT_B").parameters["binary_data"].bool_param = True
    request.outputs.add(name="OUT_A")
    assert [t.name for t in codec.requested_outputs(request, model)] == ["OUT_B", "OUT_A"]
    only = pb.ModelInferRequest()
    only.outputs.add(name="OUT_B")
    assert [t.name for t in codec.requested_outputs(only, model)] == ["OUT_B"]


def test_unknown_repeated_or_classification_outputs_are_refused():
    model = spec(("X", "FP32", (-1,)), outputs=TWO_OUTPUTS)
    unknown = pb.ModelInferRequest()
    unknown.outputs.add(name="NOPE")
    with pytest.raises(InvalidRequest, match="unknown output 'NOPE' requested from model 'm'; "
                                             "its outputs are 'OUT_A', 'OUT_B'"):
        codec.requested_outputs(unknown, model)
    twice = pb.ModelInferRequest()
    twice.outputs.add(name="OUT_A")
    twice.outputs.add(name="OUT_A")
    with pytest.raises(InvalidRequest, match="output 'OUT_A' is requested more than once"):
        codec.requested_outputs(twice, model)
    classify = pb.ModelInferRequest()
    classify.outputs.add(name="OUT_A").parameters["classification"].int64_param = 3
    with pytest.raises(Unsupported, match="output 'OUT_A' asks for classification"):
        codec.requested_outputs(classify, model)


# -- encode_response ------------------------------------------------------------------------------


def test_encode_response_round_trips_every_output_through_the_raw_form():
    model = spec(("X", "FP32", (-1,)),
                 outputs=(("F", "FP32", (-1,)), ("H", "BF16", (-1,)), ("S", "BYTES", (1,)), ("I", "INT64", (-1,))))
    outputs = {
        "F": np.array([[1.5, -0.0, np.nan]], np.float32),
        "H": np.array([[1.0, -2.0]], ml_dtypes.bfloat16),
        "S": np.array([[b"ab"], ["caf\u00e9"]], dtype=object),  # str elements go out UTF-8
        "I": np.array([[1, -2]], np.int64),
    }
    chosen = [model.output(n) for n in ("S", "F", "I", "H")]
    response = codec.encode_response(model, "req-7", outputs, chosen, parameters={"sequence": 4})
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "req-7")
    assert response.parameters["sequence"].int64_param == 4
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("S", "BYTES", [2, 1]), ("F", "FP32", [1, 3]), ("I", "INT64", [1, 2]), ("H", "BF16", [1, 2])]
    assert response.raw_output_contents[0] == length_prefixed(b"ab", "caf\u00e9".encode())
    assert response.raw_output_contents[2] == struct.pack("<2q", 1, -2)
    back = {o.name: codec.decode_raw(o.name, data, DATATYPES[o.datatype], list(o.shape))
            for o, data in zip(response.outputs, response.raw_output_contents)}
    assert back["F"].tobytes() == outputs["F"].tobytes()  # NaN and -0.0 bit for bit
    assert back["H"].tobytes() == outputs["H"].tobytes()
    assert back["I"].tolist() == [[1, -2]]
    assert back["S"].tolist() == [[b"ab"], ["caf\u00e9".encode()]]


def test_encode_tensor_writes_little_endian_whatever_the_arrays_byte_order():
    big = np.array([1, -2, 2**40], np.dtype(">i8"))
    assert codec.encode_tensor(big, DATATYPES["INT64"]) == struct.pack("<3q", 1, -2, 2**40)
    half = np.array([[1.0, -0.5]], np.dtype(">f2"))
    assert codec.encode_tensor(half, DATATYPES["FP16"]) == struct.pack("<2e", 1.0, -0.5)


def test_encode_response_blames_the_model_for_a_missing_or_mistyped_output():
    model = spec(("X", "FP32", (-1,)), outputs=TWO_OUTPUTS)
    with pytest.raises(BackendError, match="the model produced no output 'OUT_B'"):
        codec.encode_response(model, "", {"OUT_A": np.zeros((1, 1), np.float32)}, list(model.outputs))
    with pytest.raises(BackendError, match="output 'OUT_A' has dtype float64; the model config says FP32"):
        codec.encode_response(model, "", {"OUT_A": np.zeros((1, 1))}, [model.outputs[0]])
