"""The KServe v2 REST infer body (protocol/rest.py) as the gRPC request it stands for, and the
gRPC response back as a REST body: JSON data and Triton's binary tensor extension.

The HTTP door does not validate tensors itself: ``parse_infer`` builds the ``ModelInferRequest``
that the gRPC codec then validates. So the tests pin that a JSON or binary body becomes exactly
the gRPC raw form (written here byte by byte: little-endian numbers, BOOL one byte, BYTES a
4-byte little-endian length then the data) and decodes with ``codec.decode_inputs`` to the same
arrays; that every malformed body is an ``InvalidRequest`` naming what is wrong, never another
exception; and that ``infer_body`` answers with JSON data or binary outputs following the JSON
in output order, which a client reading the body as the protocol says gets back value for value.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.config import BatchingPolicy
from trtserve.datatypes import DATATYPES
from trtserve.errors import InvalidRequest, Unsupported
from trtserve.protocol import codec
from trtserve.protocol.parameters import request_parameters
from trtserve.protocol.rest import RestInfer, infer_body, parse_infer
from trtserve.repository import load_specs
from trtserve.spec import ModelSpec, TensorSpec

CONFIG = """
    name: "m"
    max_batch_size: 4
    input [
      { name: "F" data_type: TYPE_FP32 dims: [ 2, 3 ] optional: true },
      { name: "I" data_type: TYPE_INT64 dims: [ 3 ] optional: true },
      { name: "B" data_type: TYPE_BOOL dims: [ 3 ] optional: true },
      { name: "H" data_type: TYPE_FP16 dims: [ 3 ] optional: true },
      { name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true },
      { name: "U" data_type: TYPE_UINT8 dims: [ 2 ] optional: true }
    ]
    output [
      { name: "OF" data_type: TYPE_FP32 dims: [ 2, 3 ] },
      { name: "OI" data_type: TYPE_INT64 dims: [ 3 ] },
      { name: "OB" data_type: TYPE_BOOL dims: [ 3 ] },
      { name: "OH" data_type: TYPE_FP16 dims: [ 3 ] },
      { name: "OS" data_type: TYPE_STRING dims: [ -1 ] }
    ]
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> ModelSpec:
    model = tmp_path_factory.mktemp("repo") / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    (model / "config.pbtxt").write_text(CONFIG)
    (only,) = load_specs(Path(model))
    return only


def length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def grpc_request(*tensors: tuple[str, str, list[int], bytes], request_id: str = "") -> pb.ModelInferRequest:
    """The gRPC raw form a gRPC client would send for the same tensors."""
    request = pb.ModelInferRequest(model_name="m", model_version="", id=request_id)
    for name, datatype, shape, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def binary_body(doc: dict, *tensors: bytes) -> tuple[bytes, int]:
    """A binary-extension body: the JSON, then the raw tensors; and the JSON's length."""
    head = json.dumps(doc).encode()
    return head + b"".join(tensors), len(head)


def parse(doc: dict) -> RestInfer:
    return parse_infer(json.dumps(doc).encode(), None, "m", "")


def refusal(body: bytes | dict, header_length: int | None = None) -> str:
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    with pytest.raises(InvalidRequest) as err:
        parse_infer(body, header_length, "m", "")
    return str(err.value)


def one_input(**fields) -> dict:
    """A body with one input: name F, shape [1, 2, 3], FP32, six numbers, with ``fields`` replacing those."""
    tensor = {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}
    tensor.update(fields)
    return {"inputs": [{k: v for k, v in tensor.items() if v is not ...}]}


# -- JSON inputs become the gRPC raw form ---------------------------------------------------------

JSON_INPUTS = {
    # case: (input, datatype, shape, JSON data, the raw bytes written by hand, the array the model gets)
    "FP32 nested": ("F", "FP32", [1, 2, 3], [[[1.5, -2.0, 3.25], [0, 1, 2]]],
                    struct.pack("<6f", 1.5, -2.0, 3.25, 0, 1, 2),
                    np.array([[[1.5, -2.0, 3.25], [0, 1, 2]]], np.float32)),
    "FP32 flat": ("F", "FP32", [1, 2, 3], [1.5, -2.0, 3.25, 0, 1, 2],
                  struct.pack("<6f", 1.5, -2.0, 3.25, 0, 1, 2),
                  np.array([[[1.5, -2.0, 3.25], [0, 1, 2]]], np.float32)),
    "INT64 at its bounds": ("I", "INT64", [2, 3], [[-(2**63), 0, 2**63 - 1], [1, -1, 2**40]],
                            struct.pack("<6q", -(2**63), 0, 2**63 - 1, 1, -1, 2**40),
                            np.array([[-(2**63), 0, 2**63 - 1], [1, -1, 2**40]], np.int64)),
    "BOOL": ("B", "BOOL", [1, 3], [[True, False, True]], bytes([1, 0, 1]), np.array([[True, False, True]])),
    "FP16": ("H", "FP16", [1, 3], [1.0, -0.5, 65504], struct.pack("<3e", 1.0, -0.5, 65504),
             np.array([[1.0, -0.5, 65504]], np.float16)),
    "BYTES strings": ("S", "BYTES", [1, 3], ["hello", "", "é✓"], length_prefixed(b"hello", b"", "é✓".encode()),
                      np.array([[b"hello", b"", "é✓".encode()]], dtype=object)),
    "UINT8": ("U", "UINT8", [1, 2], [0, 255], bytes([0, 255]), np.array([[0, 255]], np.uint8)),
}


@pytest.mark.parametrize("case", list(JSON_INPUTS))
def test_json_data_becomes_the_grpc_raw_bytes_and_decodes_to_the_same_array(spec, case):
    name, datatype, shape, data, raw, expected = JSON_INPUTS[case]
    rest = parse({"id": "r1", "inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]})
    grpc = grpc_request((name, datatype, shape, raw), request_id="r1")
    assert rest.request == grpc  # the whole message: the codec sees what a gRPC client would send
    tensors, rows = codec.decode_inputs(rest.request, spec)
    (grpc_tensors, grpc_rows) = codec.decode_inputs(grpc, spec)
    got = tensors[name]
    assert rows == grpc_rows == shape[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tolist() == expected.tolist() == grpc_tensors[name].tolist()


def test_the_model_and_version_from_the_route_are_the_requests(spec):
    rest = parse_infer(json.dumps(one_input()).encode(), None, "m", "1")
    assert (rest.request.model_name, rest.request.model_version, rest.request.id) == ("m", "1", "")


def test_several_json_inputs_keep_their_order_and_decode_together(spec):
    rest = parse({"inputs": [
        {"name": "I", "shape": [2, 3], "datatype": "INT64", "data": [[1, 2, 3], [4, 5, 6]]},
        {"name": "S", "shape": [2, 1], "datatype": "BYTES", "data": [["a"], ["bc"]]},
    ]})
    assert [t.name for t in rest.request.inputs] == ["I", "S"]
    tensors, rows = codec.decode_inputs(rest.request, spec)
    assert rows == 2
    assert tensors["I"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert tensors["S"].tolist() == [[b"a"], [b"bc"]]


def test_json_data_whose_count_differs_from_the_shape_is_refused_naming_both():
    message = refusal(one_input(data=[1, 2, 3, 4, 5]))
    assert "input 'F'" in message and "[1, 2, 3]" in message and "6 elements" in message and "has 5" in message


def test_what_the_codec_refuses_from_grpc_it_refuses_from_rest(spec):
    # the REST door leaves model-level checks to the codec: an unknown datatype, an unknown input,
    # a wrong datatype, a zero dimension all come back with the codec's sentence
    cases = [
        (one_input(datatype="FP128"), "unknown datatype 'FP128'"),
        (one_input(name="NOPE"), "unexpected input 'NOPE'"),
        (one_input(datatype="FP64"), "has datatype FP64; the model expects FP32"),
        (one_input(shape=[0, 2, 3], data=[]), "a zero batch size"),
    ]
    for body, expected in cases:
        with pytest.raises(InvalidRequest, match=expected):
            codec.decode_inputs(parse(body).request, spec)


# -- binary inputs --------------------------------------------------------------------------------


def test_binary_inputs_are_sliced_from_after_the_json_in_the_order_of_inputs(spec):
    floats = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    strings = length_prefixed(b"x", b"\x00\xff")  # raw BYTES need not be UTF-8
    body, n = binary_body({"inputs": [
        {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "parameters": {"binary_data_size": len(floats)}},
        {"name": "S", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": len(strings)}},
    ]}, floats, strings)
    rest = parse_infer(body, n, "m", "")
    assert rest.request == grpc_request(("F", "FP32", [1, 2, 3], floats), ("S", "BYTES", [1, 2], strings))
    assert not rest.request.inputs[0].parameters  # binary_data_size is the transport's, not the codec's
    tensors, _ = codec.decode_inputs(rest.request, spec)
    assert tensors["F"].tolist() == [[[1, 2, 3], [4, 5, 6]]]
    assert tensors["S"].tolist() == [[b"x", b"\x00\xff"]]


def test_binary_and_json_inputs_may_be_mixed_in_one_request(spec):
    # Triton and tritonclient.http choose binary per input (set_data_from_numpy(binary_data=...)):
    # the binary section holds only the binary inputs' bytes, in their order
    ints = struct.pack("<3q", 7, 8, 9)
    bools = bytes([0, 1, 1])
    body, n = binary_body({"inputs": [
        {"name": "I", "shape": [1, 3], "datatype": "INT64", "parameters": {"binary_data_size": 24}},
        {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
        {"name": "B", "shape": [1, 3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}},
    ]}, ints, bools)
    rest = parse_infer(body, n, "m", "")
    assert rest.request == grpc_request(("I", "INT64", [1, 3], ints),
                                        ("F", "FP32", [1, 2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
                                        ("B", "BOOL", [1, 3], bools))
    tensors, _ = codec.decode_inputs(rest.request, spec)
    assert tensors["I"].tolist() == [[7, 8, 9]] and tensors["B"].tolist() == [[False, True, True]]


def test_a_binary_size_past_the_end_of_the_body_is_refused_naming_the_input():
    body, n = binary_body({"inputs": [
        {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
    ]}, b"\x00" * 20)
    message = refusal(body, n)
    assert "input 'F'" in message and "binary_data_size 24 runs past the end" in message and "20 bytes" in message


def test_bytes_left_over_after_the_last_binary_input_are_refused():
    body, n = binary_body({"inputs": [
        {"name": "U", "shape": [1, 2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}},
    ]}, b"\x01\x02\x03\x04\x05")
    message = refusal(body, n)
    assert "3 bytes follow the last binary input" in message and "add up to 2 of the 5" in message


def test_a_binary_tail_without_any_binary_input_is_refused():
    body, n = binary_body(one_input(), b"junk")
    assert "4 bytes follow the last binary input" in refusal(body, n)


@pytest.mark.parametrize("past", [1, -1], ids=["past-the-end", "negative"])
def test_the_header_length_must_lie_inside_the_body(past):
    body, _ = binary_body(one_input())
    length = len(body) + 1 if past > 0 else -1
    message = refusal(body, length)
    assert f"Inference-Header-Content-Length is {length}" in message and f"the body has {len(body)} bytes" in message


def test_a_header_length_of_zero_is_refused_as_the_raw_binary_form_not_supported():
    body, _ = binary_body(one_input())
    message = refusal(body, 0)
    assert "Inference-Header-Content-Length 0" in message and "not supported" in message


def test_a_header_length_that_cuts_the_json_short_is_malformed_json():
    body, n = binary_body(one_input())
    assert "not valid JSON" in refusal(body, n - 1)


@pytest.mark.parametrize("size", ["24", True, -1, 1.5, [24]])
def test_binary_data_size_must_be_a_non_negative_integer(size):
    body, n = binary_body(one_input(data=..., parameters={"binary_data_size": size}), b"\x00" * 24)
    message = refusal(body, n)
    assert "input 'F': binary_data_size must be an integer >= 0" in message


def test_an_input_with_both_data_and_binary_data_size_is_refused():
    body, n = binary_body(one_input(parameters={"binary_data_size": 24}), b"\x00" * 24)
    assert "input 'F' has both 'data' and binary_data_size" in refusal(body, n)


def test_an_input_with_neither_data_nor_binary_data_size_is_refused():
    assert "input 'F' has neither 'data' nor a binary_data_size" in refusal(one_input(data=...))


def test_binary_bytes_are_checked_by_the_codec_as_grpc_raw_contents_are(spec):
    # a size that matches the body but not the shape, and a BYTES element running past its tensor
    body, n = binary_body({"inputs": [
        {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 20}},
    ]}, b"\x00" * 20)
    with pytest.raises(InvalidRequest, match=r"input 'F' \(FP32, shape \[1, 2, 3\]\) needs 24 bytes .* got 20"):
        codec.decode_inputs(parse_infer(body, n, "m", "").request, spec)
    broken = struct.pack("<I", 9) + b"abc"
    body, n = binary_body({"inputs": [
        {"name": "S", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(broken)}},
    ]}, broken)
    with pytest.raises(InvalidRequest, match=r"input 'S' \(BYTES\) element 0 declares 9 bytes"):
        codec.decode_inputs(parse_infer(body, n, "m", "").request, spec)


# -- malformed bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"{", b'{"inputs": [}', b"\xff\xfe", b'{"inputs": "\\ud800"}'])
def test_a_body_that_is_not_json_is_refused(body):
    assert refusal(body).startswith("the request body is not valid JSON: ")




def test_an_empty_body_is_refused_as_such():
    assert refusal(b"").startswith("the request body is empty")


@pytest.mark.parametrize("body, kind", [(b"[]", "list"), (b'"x"', "str"), (b"3", "int"), (b"null", "NoneType")])
def test_a_body_that_is_not_a_json_object_is_refused(body, kind):
    assert refusal(body) == f"the request body must be a JSON object, got {kind}"


@pytest.mark.parametrize("inputs", [..., [], {}, None, "F"])
def test_inputs_must_be_a_non_empty_list(inputs):
    doc = {} if inputs is ... else {"inputs": inputs}
    assert "needs 'inputs': a non-empty list" in refusal(doc)


def test_an_input_that_is_not_an_object_is_refused():
    assert "input 1 must be a JSON object" in refusal({"inputs": [one_input()["inputs"][0], ["F"]]})


@pytest.mark.parametrize("fields, expected", [
    ({"name": ...}, "input 0 has no string 'name'"),
    ({"name": 7}, "input 0 has no string 'name'"),
    ({"datatype": ...}, "input 'F' has no string 'datatype'"),
    ({"datatype": 32}, "input 'F' has no string 'datatype'"),
    ({"shape": ...}, "input 'F': 'shape' must be a list of integers, got None"),
    ({"shape": "1,2,3"}, "input 'F': 'shape' must be a list of integers"),
    ({"shape": [1, "2", 3]}, "input 'F': 'shape' must be a list of integers"),
    ({"shape": [1, 2.0, 3]}, "input 'F': 'shape' must be a list of integers"),
    ({"shape": [True, 2, 3]}, "input 'F': 'shape' must be a list of integers"),
    ({"shape": [2**63, 2, 3]}, "input 'F': 'shape' [9223372036854775808, 2, 3] has a dimension outside int64"),
    ({"parameters": [1]}, "the input 'F' 'parameters' must be a JSON object, got list"),
])
def test_input_fields_of_the_wrong_type_are_refused_naming_the_field(fields, expected):
    assert expected in refusal(one_input(**fields))


@pytest.mark.parametrize("name, datatype, shape, data, expected", [
    ("F", "FP32", [1, 2, 3], [1, 2, 3, 4, 5, "6"], "FP32 data must be numbers"),
    ("F", "FP32", [1, 2, 3], [1, 2, 3, 4, 5, True], "FP32 data must be numbers"),
    ("F", "FP32", [1, 2, 3], [1, [2, 3], 4, 5, 6], "FP32 data must be numbers"),  # ragged nesting
    ("F", "FP32", [1, 2, 3], {"a": 1}, "FP32 data must be numbers"),
    ("F", "FP32", [1, 2, 3], [1, 2, 3, 4, 5, None], "FP32 data must be numbers"),
    ("I", "INT64", [1, 3], [1, 2.5, 3], "INT64 data must be integers"),
    ("I", "INT64", [1, 3], [1, 2, 2**64], "INT64 data must be integers"),  # JSON reads it as a float
    ("B", "BOOL", [1, 3], [1, 0, 1], "BOOL data must be true or false"),
    ("S", "BYTES", [1, 2], ["a", 5], "BYTES data must be strings, got int"),
    ("S", "BYTES", [1, 2], ["a", None], "BYTES data must be strings, got NoneType"),
])
def test_data_of_the_wrong_type_is_refused_naming_the_input(name, datatype, shape, data, expected):
    message = refusal({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]})
    assert f"input '{name}'" in message and expected in message


@pytest.mark.parametrize("datatype, value", [
    ("INT64", 2**63), ("UINT8", 256), ("UINT8", -1), ("INT8", -129), ("INT8", 128),
    ("UINT64", -1), ("INT32", 2**31), ("UINT32", 2**32),
])
def test_integers_out_of_range_of_their_datatype_are_refused(datatype, value):
    message = refusal({"inputs": [{"name": "X", "shape": [1], "datatype": datatype, "data": [value]}]})
    assert message == f"input 'X': {value} is out of range for {datatype}"


@pytest.mark.parametrize("datatype, low, high, fmt", [
    ("INT8", -128, 127, "<2b"), ("UINT8", 0, 255, "<2B"), ("INT32", -(2**31), 2**31 - 1, "<2i"),
    ("UINT64", 0, 2**64 - 1, "<2Q"), ("INT64", -(2**63), 2**63 - 1, "<2q"),
])
def test_integers_at_the_bounds_of_their_datatype_are_sent_exactly(datatype, low, high, fmt):
    rest = parse({"inputs": [{"name": "X", "shape": [2], "datatype": datatype, "data": [low, high]}]})
    assert rest.request.raw_input_contents[0] == struct.pack(fmt, low, high)


def test_the_request_id_must_be_a_string():
    assert refusal({"id": 5, **one_input()}) == "'id' must be a string, got int"


@pytest.mark.parametrize("where", ["request", "output"])
@pytest.mark.parametrize("value", ["true", 1, None, 0.0])
def test_binary_data_flags_must_be_booleans(where, value):
    doc = one_input()
    if where == "request":
        doc["parameters"] = {"binary_data_output": value}
        expected = "parameter binary_data_output must be true or false"
    else:
        doc["outputs"] = [{"name": "OF", "parameters": {"binary_data": value}}]
        expected = "parameter output 'OF' binary_data must be true or false"
    assert refusal(doc) == f"{expected}, got {value!r}"


@pytest.mark.parametrize("value, kind", [(None, "NoneType"), ([1], "list"), ({"a": 1}, "dict")])
@pytest.mark.parametrize("where", ["request", "input 'F'", "output 'OF'"])
def test_parameter_values_other_than_boolean_number_or_string_are_refused(where, value, kind):
    doc = one_input()
    if where == "request":
        doc["parameters"] = {"p": value}
    elif where == "input 'F'":
        doc["inputs"][0]["parameters"] = {"p": value}
    else:
        doc["outputs"] = [{"name": "OF", "parameters": {"p": value}}]
    assert refusal(doc) == f"{where} parameter 'p' must be a boolean, number or string, got {kind}"


def test_an_integer_parameter_outside_int64_is_refused():
    # JSON integers reach 2**64 - 1; an InferParameter's int64_param does not
    message = refusal({"parameters": {"priority": 2**64 - 1}, **one_input()})
    assert message == f"request parameter 'priority' is {2**64 - 1}, outside int64"


@pytest.mark.parametrize("doc, expected", [
    ({"parameters": [1]}, "the request 'parameters' must be a JSON object, got list"),
    ({"outputs": {"name": "OF"}}, "'outputs' must be a list"),
    ({"outputs": [{"parameters": {}}]}, "each requested output must be an object with a string 'name'"),
    ({"outputs": ["OF"]}, "each requested output must be an object with a string 'name'"),
    ({"outputs": [{"name": "OF", "parameters": "binary"}]}, "the output 'OF' 'parameters' must be a JSON object"),
])
def test_request_fields_of_the_wrong_type_are_refused(doc, expected):
    assert expected in refusal({**one_input(), **doc})


# -- parameters and binary outputs ----------------------------------------------------------------


def test_priority_and_timeout_cross_as_int64_parameters_the_codec_reads():
    rest = parse({"parameters": {"priority": 2, "timeout": 1500, "triton_enable_empty_final_response": True},
                  **one_input()})
    kinds = {k: p.WhichOneof("parameter_choice") for k, p in rest.request.parameters.items()}
    assert kinds == {"priority": "int64_param", "timeout": "int64_param",
                     "triton_enable_empty_final_response": "bool_param"}
    assert request_parameters(rest.request) == (2, 0.0015, True, "truncate")


def test_json_parameter_kinds_map_to_bool_int64_double_and_string():
    rest = parse({"parameters": {"b": False, "i": -3, "d": 1.5, "s": "x"}, **one_input()})
    params = rest.request.parameters
    assert [(k, params[k].WhichOneof("parameter_choice")) for k in ("b", "i", "d", "s")] == [
        ("b", "bool_param"), ("i", "int64_param"), ("d", "double_param"), ("s", "string_param")]
    assert (params["b"].bool_param, params["i"].int64_param, params["d"].double_param, params["s"].string_param) == (
        False, -3, 1.5, "x")


def test_a_parameter_of_the_wrong_kind_is_refused_by_the_codec_as_from_grpc():
    rest = parse({"parameters": {"timeout": 1.5}, **one_input()})  # a JSON float: double_param
    with pytest.raises(InvalidRequest, match="'timeout' must be int64 microseconds, got double_param"):
        request_parameters(rest.request)
    rest = parse({"parameters": {"priority": "high"}, **one_input()})
    with pytest.raises(InvalidRequest, match="'priority' must be an integer"):
        request_parameters(rest.request)


def test_binary_data_flags_are_the_transports_and_do_not_reach_the_codec(spec):
    # tritonclient.http sends binary_data_output: true and per-output binary_data: the codec,
    # which refuses every parameter it does not read, must see neither
    rest = parse({"parameters": {"binary_data_output": True},
                  "outputs": [{"name": "OI", "parameters": {"binary_data": False}}, {"name": "OF"}], **one_input()})
    assert not rest.request.parameters and not rest.request.outputs[0].parameters
    assert request_parameters(rest.request) == (0, None, False, "truncate")
    assert [t.name for t in codec.requested_outputs(rest.request, spec)] == ["OI", "OF"]


def test_output_parameters_other_than_binary_data_reach_the_codec(spec):
    rest = parse({"outputs": [{"name": "OF", "parameters": {"classification": 2}}], **one_input()})
    with pytest.raises(Unsupported, match="classification"):
        codec.requested_outputs(rest.request, spec)


@pytest.mark.parametrize("request_flag, outputs, expected", [
    (..., [], {"OF": False, "OI": False}),
    (False, [], {"OF": False, "OI": False}),
    (True, [], {"OF": True, "OI": True}),
    (True, [{"name": "OF", "parameters": {"binary_data": False}}], {"OF": False, "OI": True}),
    (..., [{"name": "OF", "parameters": {"binary_data": True}}, {"name": "OI"}], {"OF": True, "OI": False}),
    (False, [{"name": "OI", "parameters": {"binary_data": True}}], {"OF": False, "OI": True}),
])
def test_per_output_binary_data_overrides_binary_data_output(request_flag, outputs, expected):
    doc = {**one_input(), "outputs": outputs}
    if request_flag is not ...:
        doc["parameters"] = {"binary_data_output": request_flag}
    rest = parse(doc)
    assert {name: rest.binary(name) for name in expected} == expected
    assert [o.name for o in rest.request.outputs] == [o["name"] for o in outputs]


# -- infer_body -----------------------------------------------------------------------------------

OUTPUTS = {
    "OF": np.array([[[0.5, -1.25, 3.0], [1e-3, 2.0, -0.0]]], np.float32),
    "OI": np.array([[-(2**63), 7, 2**63 - 1]], np.int64),
    "OB": np.array([[True, False, True]]),
    "OH": np.array([[0.1, -2.5, 65504]], np.float16),
    "OS": np.array([[b"hi", "é".encode(), b""]], dtype=object),
}


def respond(spec: ModelSpec, doc: dict, outputs=OUTPUTS, parameters=None) -> tuple[RestInfer, bytes, int | None]:
    """Parse ``doc``, answer it with ``outputs`` through the codec, and return the REST body."""
    rest = parse({**one_input(), **doc})
    chosen = codec.requested_outputs(rest.request, spec)
    response = codec.encode_response(spec, rest.request.id, outputs, chosen, parameters)
    body, length = infer_body(response, rest)
    return rest, body, length


def client_read(body: bytes, length: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """What a client does with the body, from the protocol alone: the JSON, then each binary output
    sliced from the tail by the running sum of binary_data_size, decoded from its raw form."""
    doc = json.loads(body if length is None else body[:length])
    tail = b"" if length is None else body[length:]
    arrays, offset = {}, 0
    for out in doc["outputs"]:
        shape = out["shape"]
        if "data" in out:
            values = out["data"]
            dtype = {"FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_, "FP16": np.float16}.get(out["datatype"])
            if dtype is None:  # BYTES as strings
                arrays[out["name"]] = np.array([v.encode() for v in values], dtype=object).reshape(shape)
            else:
                arrays[out["name"]] = np.array(values, dtype=dtype).reshape(shape)
            continue
        size = out["parameters"]["binary_data_size"]
        raw, offset = tail[offset:offset + size], offset + size
        if out["datatype"] == "BYTES":
            items, pos = [], 0
            while pos < len(raw):
                (n,) = struct.unpack_from("<I", raw, pos)
                items.append(raw[pos + 4:pos + 4 + n])
                pos += 4 + n
            arrays[out["name"]] = np.array(items, dtype=object).reshape(shape)
        else:
            dtype = {"FP32": "<f4", "INT64": "<i8", "BOOL": "|b1", "FP16": "<f2"}[out["datatype"]]
            arrays[out["name"]] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    assert offset == len(tail), "bytes after the last binary output"
    return doc, arrays


def test_json_outputs_carry_their_values_as_json_and_no_header_length(spec):
    rest, body, length = respond(spec, {"id": "q7"})
    assert length is None
    doc = json.loads(body)  # the whole body is the JSON
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("m", "1", "q7")
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert [o["name"] for o in doc["outputs"]] == ["OF", "OI", "OB", "OH", "OS"]  # config order: none were named
    assert by_name["OF"] == {"name": "OF", "datatype": "FP32", "shape": [1, 2, 3],
                             "data": [0.5, -1.25, 3.0, pytest.approx(1e-3), 2.0, -0.0]}
    assert by_name["OI"]["data"] == [-(2**63), 7, 2**63 - 1]  # exact: no float on the way
    assert by_name["OB"]["data"] == [True, False, True]
    assert by_name["OS"]["data"] == ["hi", "é", ""]
    assert all(isinstance(v, float) for v in by_name["OH"]["data"])  # FP16 as numbers, not raw bytes
    assert np.array(by_name["OH"]["data"], np.float16).tobytes() == OUTPUTS["OH"].tobytes()


def test_bytes_output_that_is_not_utf8_goes_out_as_json_with_replacement_characters(spec):
    outputs = {**OUTPUTS, "OS": np.array([[b"\xff", b"ok"]], dtype=object)}
    _, body, _ = respond(spec, {"outputs": [{"name": "OS"}]}, outputs)
    assert json.loads(body)["outputs"][0]["data"] == ["\ufffd", "ok"]


def test_bf16_output_goes_out_as_json_numbers_that_convert_back_bit_for_bit():
    bf16 = ModelSpec(name="b", version="1", platform="onnxruntime_onnx", inputs=(),
                     outputs=(TensorSpec("Y", DATATYPES["BF16"], (3,)),), policy=BatchingPolicy(max_batch_size=0),
                     instances=1, model_dir=Path("b"), version_dir=Path("b/1"))
    values = np.array([1.0, -2.5, 0.0078125], ml_dtypes.bfloat16)
    response = codec.encode_response(bf16, "", {"Y": values}, bf16.outputs)
    body, length = infer_body(response, parse(one_input()))
    (out,) = json.loads(body)["outputs"]
    assert length is None and out["data"] == [1.0, -2.5, 0.0078125]
    assert np.array(out["data"], ml_dtypes.bfloat16).tobytes() == values.tobytes()


def test_binary_outputs_follow_the_json_in_output_order_with_their_sizes(spec):
    rest, body, length = respond(spec, {"outputs": [
        {"name": "OS", "parameters": {"binary_data": True}},
        {"name": "OI"},
        {"name": "OF", "parameters": {"binary_data": True}},
    ]})
    assert length is not None
    doc = json.loads(body[:length])  # the header length is exactly the JSON's
    assert [o["name"] for o in doc["outputs"]] == ["OS", "OI", "OF"]
    strings = length_prefixed(b"hi", "é".encode(), b"")
    floats = OUTPUTS["OF"].astype("<f4").tobytes()
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": len(strings)} and "data" not in doc["outputs"][0]
    assert doc["outputs"][2]["parameters"] == {"binary_data_size": 24}
    assert doc["outputs"][1]["data"] == [-(2**63), 7, 2**63 - 1] and "parameters" not in doc["outputs"][1]
    assert body[length:] == strings + floats  # OS then OF; the JSON output OI has no bytes here


def test_binary_data_output_sends_every_output_binary(spec):
    _, body, length = respond(spec, {"parameters": {"binary_data_output": True}})
    doc = json.loads(body[:length])
    assert all("data" not in o and o["parameters"]["binary_data_size"] > 0 for o in doc["outputs"])
    assert len(body) - length == sum(o["parameters"]["binary_data_size"] for o in doc["outputs"])
    assert body[length:length + 24] == OUTPUTS["OF"].astype("<f4").tobytes()  # the first output first


def test_response_parameters_appear_in_the_json(spec):
    _, body, _ = respond(spec, {"outputs": [{"name": "OB"}]}, parameters={"queue_us": 12})
    assert json.loads(body)["parameters"] == {"queue_us": 12}


@pytest.mark.parametrize("binary", [False, True])
def test_outputs_round_trip_to_the_same_values_json_or_binary(spec, binary):
    rest, body, length = respond(spec, {"parameters": {"binary_data_output": binary}})
    assert (length is not None) == binary
    _, arrays = client_read(body, length)
    assert sorted(arrays) == sorted(OUTPUTS)
    for name, expected in OUTPUTS.items():
        got = arrays[name]
        assert got.shape == expected.shape, name
        if expected.dtype == object:
            assert got.tolist() == expected.tolist(), name
        else:
            assert got.astype(expected.dtype).tobytes() == expected.tobytes(), name  # bit for bit, FP16 included


def test_a_rest_request_answered_through_the_codec_comes_back_to_the_client(spec):
    # the whole path as the HTTP door runs it: body → gRPC request → arrays → model → response → body
    floats = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    body, n = binary_body({"id": "e2e", "inputs": [
        {"name": "F", "shape": [1, 2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
        {"name": "S", "shape": [1, 2], "datatype": "BYTES", "data": ["ab", "c"]},
    ], "outputs": [{"name": "OS"}, {"name": "OF", "parameters": {"binary_data": True}}]}, floats)
    rest = parse_infer(body, n, "m", "")
    tensors, _ = codec.decode_inputs(rest.request, spec)
    outputs = {"OF": tensors["F"] * 2, "OS": np.array([[s + b"!" for s in tensors["S"][0]]], dtype=object)}
    response = codec.encode_response(spec, rest.request.id, outputs, codec.requested_outputs(rest.request, spec))
    answer, length = infer_body(response, rest)
    doc, arrays = client_read(answer, length)
    assert doc["id"] == "e2e" and [o["name"] for o in doc["outputs"]] == ["OS", "OF"]
    assert doc["outputs"][0]["data"] == ["ab!", "c!"]
    assert arrays["OF"].tolist() == [[[2, 4, 6], [8, 10, 12]]]


@pytest.mark.parametrize("where, doc, field", [
    ("the request", {**one_input(), "input": [1]}, "input"),  # a typo of "inputs"
    ("input 'F'", one_input(contents=[1]), "contents"),
    ("output 'O'", {**one_input(), "outputs": [{"name": "O", "binary": True}]}, "binary"),
])
def test_a_field_the_protocol_does_not_define_is_refused_naming_it(where, doc, field):
    message = refusal(doc)
    assert message.startswith(f"{where} has the field '{field}'"), message
    assert "does not define" in message
