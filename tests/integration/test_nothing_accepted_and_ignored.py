"""Nothing accepted and ignored (issue 17, C34's rule): every config.pbtxt field, request
parameter and tensor parameter trtserve parses is honoured or refused with a sentence naming
it; the Triton RPCs it does not implement say so, and what it offers instead."""

from __future__ import annotations

import logging
import subprocess
import sys

import grpc
import numpy as np
import pytest
from google.protobuf import text_format

from servers import code_of
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.client import build_request
from trtserve.frontend.grpc.service import NOT_IMPLEMENTED
from trtserve.repository import HONOURED_CONTAINERS, HONOURED_FIELDS, ConfigError, load_spec

BASE = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _leaf_paths(descriptor, prefix: str = "", depth: int = 0):
    """(dotted path, field descriptors from the root) of every field of ModelConfig, messages
    expanded (three levels deep, enough for every honoured path)."""
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        yield path, field
        if field.message_type is not None and not field.message_type.GetOptions().map_entry and depth < 3:
            yield from _leaf_paths(field.message_type, path + ".", depth + 1)


def _set(message, path: str) -> None:
    """Give the field at ``path`` a value that is not its default."""
    *parents, last = path.split(".")
    for name in parents:
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            message = getattr(message, name)[0] if len(getattr(message, name)) else getattr(message, name).add()
        else:
            message = getattr(message, name)
    field = message.DESCRIPTOR.fields_by_name[last]
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            container = getattr(message, last)
            key_field = field.message_type.fields_by_name["key"]
            key = "k" if key_field.type == key_field.TYPE_STRING else 1
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                container[key].SetInParent()
            else:
                container[key] = "v" if value_field.type == value_field.TYPE_STRING else 1
        elif field.is_repeated:
            getattr(message, last).add()
        else:
            getattr(message, last).SetInParent()
        return
    samples = {field.TYPE_BOOL: True, field.TYPE_STRING: "x", field.TYPE_FLOAT: 0.5, field.TYPE_DOUBLE: 0.5}
    value: object = samples.get(field.type, 1)
    if field.enum_type is not None:
        value = field.enum_type.values[-1].number
    if field.is_repeated:
        getattr(message, last).append(value)
    else:
        setattr(message, last, value)


@pytest.mark.parametrize("path", sorted({p for p, _ in _leaf_paths(mc.ModelConfig.DESCRIPTOR)}))
def test_every_config_field_is_honoured_or_refused_by_name(tmp_path, path):
    config = text_format.Parse(BASE, mc.ModelConfig())
    _set(config, path)
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")  # load_spec reads the config, not the file
    (model / "config.pbtxt").write_text(text_format.MessageToString(config))
    honoured = path in HONOURED_FIELDS | HONOURED_CONTAINERS or any(path.startswith(h + ".") for h in HONOURED_FIELDS)
    try:
        load_spec(model)
    except ConfigError as exc:
        # A value an honoured field refuses (a name that is not the directory's, platform
        # "x") is fine; being "not supported" is not, for an honoured field.
        assert honoured != ("does not support" in str(exc)), (path, str(exc))
        if not honoured:  # the field, or the unsupported message holding it, is named
            parts = path.split(".")
            assert any(".".join(parts[:n]) in str(exc) for n in range(1, len(parts) + 1)), str(exc)
        return
    assert honoured, f"{path} was accepted but trtserve does not act on it"


def test_an_onnx_model_with_a_parameter_nobody_reads_is_refused(tmp_path):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    typo = 'parameters { key: "ort_intra_op_spining" value: { string_value: "false" } }\n'
    (model / "config.pbtxt").write_text(BASE + typo)
    with pytest.raises(ConfigError, match="ort_intra_op_spining"):
        load_spec(model)


@pytest.fixture(scope="module")
def srv(engines):
    from servers import ServerThread

    with ServerThread(engines) as s:
        yield s


def _tiny(**parameters) -> pb.ModelInferRequest:
    request = build_request("tiny", {"INPUT": np.ones((1, 64), np.float32)})
    for key, (kind, value) in parameters.items():
        setattr(request.parameters[key], kind, value)
    return request


@pytest.mark.parametrize("key, kind, value, code, says", [
    ("sequence_id", "int64_param", 7, grpc.StatusCode.UNIMPLEMENTED, "sequence batcher"),
    ("binary_data_output", "bool_param", True, grpc.StatusCode.INVALID_ARGUMENT,
     "unknown request parameter 'binary_data_output'"),
    ("custom", "string_param", "x", grpc.StatusCode.INVALID_ARGUMENT, "unknown request parameter 'custom'"),
    ("triton_enable_empty_final_response", "string_param", "yes", grpc.StatusCode.INVALID_ARGUMENT, "must be a bool"),
])
def test_request_parameters_trtserve_does_not_read_are_refused(srv, key, kind, value, code, says):
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(_tiny(**{key: (kind, value)}), timeout=30)
    assert err.value.code() == code and says in err.value.details()


@pytest.mark.parametrize("where", ["input", "output"])
@pytest.mark.parametrize("key", ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"])
def test_shared_memory_parameters_are_refused_and_nothing_runs(srv, where, key):
    """C34: a request naming a shared-memory region is refused UNIMPLEMENTED before it runs,
    instead of running on the inline bytes (input) or answering inline to a client that
    reads its output from the region."""
    request = _tiny()
    if where == "input":
        tensor = request.inputs[0]
    else:
        tensor = request.outputs.add(name="OUTPUT")
    param = tensor.parameters[key]
    if key == "shared_memory_region":
        param.string_param = "region0"
    else:
        param.int64_param = 64
    rows = srv.registry.get("tiny").dispatcher.stats.rows
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert key in err.value.details() and "shared-memory" in err.value.details()
    assert srv.registry.get("tiny").dispatcher.stats.rows == rows  # it never ran


def test_output_parameters_binary_data_is_honoured_others_refused(srv):
    ok = _tiny()
    ok.outputs.add(name="OUTPUT").parameters["binary_data"].bool_param = True
    bad = _tiny()
    bad.outputs.add(name="OUTPUT").parameters["class_count"].int64_param = 3
    with srv.client() as c:
        response = c.stub.ModelInfer(ok, timeout=30)
        assert len(response.raw_output_contents) == 1  # gRPC outputs are raw binary anyway
        assert code_of(c.stub.ModelInfer, bad, timeout=30) == grpc.StatusCode.INVALID_ARGUMENT


def test_an_empty_final_response_request_marks_each_stream_response_final(srv):
    """Each request of a model that is not decoupled gets one response: with
    ``triton_enable_empty_final_response`` it carries ``triton_final_response: true``."""
    requests = [_tiny(triton_enable_empty_final_response=("bool_param", True)) for _ in range(3)]
    for i, r in enumerate(requests):
        r.id = str(i)
    with srv.client() as c:
        answers = list(c.stub.ModelStreamInfer(iter(requests), timeout=30))
    assert sorted(a.infer_response.id for a in answers) == ["0", "1", "2"]
    assert all(a.infer_response.parameters["triton_final_response"].bool_param for a in answers)


@pytest.mark.parametrize("rpc", sorted(NOT_IMPLEMENTED))
def test_rpcs_trtserve_does_not_implement_say_so_without_a_traceback(srv, rpc, caplog):
    method = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[rpc]
    request_class = getattr(pb, method.input_type.name)
    response_class = getattr(pb, method.output_type.name)
    with grpc.insecure_channel(srv.url) as channel, caplog.at_level(logging.ERROR):
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}", request_class.SerializeToString,
                                   response_class.FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(request_class(), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.value.details().startswith(f"{rpc} is not implemented: ")
    assert "Method not implemented" not in err.value.details()
    assert not [r for r in caplog.records if "NotImplementedError" in r.getMessage() or r.exc_info]


@pytest.mark.parametrize("layout", ["missing", "empty", "file"])
def test_serve_refuses_a_repository_that_does_not_exist_or_holds_no_model(tmp_path, layout):
    root = tmp_path / "repo"
    if layout == "empty":
        root.mkdir()
        (root / "notes").mkdir()  # a directory that is no model
    elif layout == "file":
        root.write_text("")
    done = subprocess.run([sys.executable, "-m", "trtserve", "serve", "--model-repository", str(root), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(root) in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_a_model_directory_without_config_is_listed_unavailable_with_the_reason(make_server, tmp_path, engines):
    import shutil

    shutil.copytree(engines / "tiny", tmp_path / "tiny")
    (tmp_path / "lost" / "1").mkdir(parents=True)
    (tmp_path / "lost" / "1" / "model.onnx").write_bytes((engines / "tiny" / "1" / "model.onnx").read_bytes())
    srv = make_server(tmp_path)
    with srv.client() as c:
        index = {m.name: m for m in c.stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30).models}
        assert index["tiny"].state == "READY"
        assert index["lost"].state == "UNAVAILABLE" and "config.pbtxt" in index["lost"].reason
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(build_request("lost", {"INPUT": np.ones((1, 64), np.float32)}), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "config.pbtxt" in err.value.details()
