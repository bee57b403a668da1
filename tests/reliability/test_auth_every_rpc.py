"""C31: bearer-token auth covers every RPC: inference, metadata, statistics, the control plane,
streams, and the Triton RPCs trtserve leaves unimplemented.

A ``trtserve serve --auth-token-file`` child process with the probe model writing a marker (the
request's first value) to a log file for every row it runs. Every method of
``inference.GRPCInferenceService``, ``trtserve.v1.ModelControl`` and ``trtserve.v1.Tokenizer`` (enumerated from the
protos, so a new RPC is covered without editing this test), plus health Check and Watch and
reflection, is called with each bad credential: no metadata, a wrong token, the token minus its
last character, the token plus one character, ``bearer`` in lower case, the token without a
scheme, the right value under another metadata key, and an empty bearer. Expected:

* UNAUTHENTICATED for every inference, metadata, statistics and control RPC and for the
  unimplemented Triton RPCs; no marker of those calls runs; SetPolicy changes nothing;
* with the token every call works (UNIMPLEMENTED for the unimplemented Triton RPCs,
  UNAVAILABLE for model load/unload in the default model control mode, NOT_FOUND for Tokenize of
  the probe model, which has no tokenizer), and its marker runs;
* health and reflection stay open without ``--auth-health`` and take the same check with it.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from casekit import read_log, row, write_probe
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.trtserve.v1 import control_pb2, tokenizer_pb2
from trtserve.client import build_request
from trtserve.testing import ServerProcess

TOKEN = "c31-Secret-token"
BAD = {
    "no metadata": (),
    "wrong token": (("authorization", "Bearer not-the-token"),),
    "token minus its last character": (("authorization", f"Bearer {TOKEN[:-1]}"),),
    "token plus one character": (("authorization", f"Bearer {TOKEN}x"),),
    "lower-case bearer": (("authorization", f"bearer {TOKEN}"),),
    "token without a scheme": (("authorization", TOKEN),),
    "another metadata key": (("x-authorization", f"Bearer {TOKEN}"),),
    "empty bearer": (("authorization", "Bearer "),),
}
GOOD = (("authorization", f"Bearer {TOKEN}"),)
SERVICES = [
    pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    control_pb2.DESCRIPTOR.services_by_name["ModelControl"],
    tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"],
]
# The Triton RPCs trtserve does not implement: UNIMPLEMENTED with the token.
UNIMPLEMENTED = {
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
}
# Implemented, and refused in the server's model control mode (none): UNAVAILABLE with the token.
REFUSED_IN_MODE_NONE = {"RepositoryModelLoad", "RepositoryModelUnload"}
NO_TOKENIZER = {"Tokenize"}  # implemented; the probe model has no tokenizer: NOT_FOUND with the token
CHANGED_DELAY_US = 54_321  # what the SetPolicy calls ask for


def request_for(method, marker: float):
    """A valid request of ``method`` for the probe model (inference carries ``marker``)."""
    name = method.name
    if name in ("ModelInfer", "ModelStreamInfer"):
        return build_request("probe", row(marker), request_id=str(marker))
    if name in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
        return getattr(pb, method.input_type.name)(name="probe")
    if name == "GetPolicy":
        return control_pb2.GetPolicyRequest(model_name="probe")
    if name == "Tokenize":
        return tokenizer_pb2.TokenizeRequest(model_name="probe", inputs=["x"])
    if name == "SetPolicy":
        request = control_pb2.SetPolicyRequest(model_name="probe")
        request.policy.max_queue_delay_us = CHANGED_DELAY_US
        request.update_mask.paths.append("max_queue_delay_us")
        return request
    module = pb if method.containing_service.name == "GRPCInferenceService" else control_pb2
    return getattr(module, method.input_type.name)()


def code(channel: grpc.Channel, path: str, request, metadata, *, client_streaming: bool, server_streaming: bool):
    """The status a call of ``path`` ends with (a stream: after reading its first message).
    Responses stay bytes: only the status matters here."""
    ser, des = type(request).SerializeToString, None
    try:
        if client_streaming and server_streaming:
            call = channel.stream_stream(path, ser, des)(iter([request]), metadata=metadata, timeout=30)
            for _ in call:
                pass
        elif server_streaming:  # health Watch never ends by itself: its first message is enough
            call = channel.unary_stream(path, ser, des)(request, metadata=metadata, timeout=30)
            next(iter(call))
            call.cancel()
        else:
            channel.unary_unary(path, ser, des)(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def every_rpc():
    """(label, path, method descriptor) of every inference and control RPC."""
    for service in SERVICES:
        for method in service.methods:
            yield method.name, f"/{service.full_name}/{method.name}", method


def call_rpc(channel, path, method, marker, metadata):
    return code(channel, path, request_for(method, marker), metadata, client_streaming=method.client_streaming,
                server_streaming=method.server_streaming)


def open_rpcs():
    """(label, path, request, streaming kind) of health and reflection."""
    return [
        ("health Check", "/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest(), (False, False)),
        ("health Watch", "/grpc.health.v1.Health/Watch", health_pb2.HealthCheckRequest(), (False, True)),
        ("reflection", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
         reflection_pb2.ServerReflectionRequest(list_services=""), (True, True)),
    ]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("c31")
    log = root / "markers.log"
    write_probe(root / "models", "probe", max_batch_size=4, fast_warmup="true", log_file=log)
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    return root / "models", log, token_file


def markers(log: Path) -> list[float]:
    return [i for _, _, ids in read_log(log) for i in ids] if log.exists() else []


@pytest.mark.parametrize("auth_health", [False, True], ids=["health open", "--auth-health"])
def test_every_rpc_refuses_each_bad_credential_and_works_with_the_token(repo, auth_health):
    """C31: every RPC, each bad credential; then the token."""
    models, log, token_file = repo
    log.unlink(missing_ok=True)
    flags = ["--auth-token-file", str(token_file), *(["--auth-health"] if auth_health else [])]
    with ServerProcess(models, *flags) as srv, grpc.insecure_channel(srv.url) as channel:
        policy_before = channel.unary_unary(
            "/trtserve.v1.ModelControl/GetPolicy", control_pb2.GetPolicyRequest.SerializeToString,
            control_pb2.BatchingPolicy.FromString,
        )(control_pb2.GetPolicyRequest(model_name="probe"), metadata=GOOD, timeout=30)
        assert policy_before.max_queue_delay_us != CHANGED_DELAY_US
        refused, opened = {}, {}
        for k, (credential, metadata) in enumerate(BAD.items()):
            for label, path, method in every_rpc():
                refused[label, credential] = call_rpc(channel, path, method, 1000.0 + k, metadata)
            for label, path, request, (cs, ss) in open_rpcs():
                opened[label, credential] = code(channel, path, request, metadata,
                                                 client_streaming=cs, server_streaming=ss)
        assert len(refused) == len(BAD) * sum(len(s.methods) for s in SERVICES) == 8 * 23
        assert {key: c for key, c in refused.items() if c != grpc.StatusCode.UNAUTHENTICATED} == {}
        expected_open = grpc.StatusCode.UNAUTHENTICATED if auth_health else grpc.StatusCode.OK
        assert {key: c for key, c in opened.items() if c != expected_open} == {}
        # Nothing of the refused calls ran, and SetPolicy changed nothing.
        policy_after = channel.unary_unary(
            "/trtserve.v1.ModelControl/GetPolicy", control_pb2.GetPolicyRequest.SerializeToString,
            control_pb2.BatchingPolicy.FromString,
        )(control_pb2.GetPolicyRequest(model_name="probe"), metadata=GOOD, timeout=30)
        assert policy_after == policy_before
        assert markers(log) == []

        # With the token: every call works, UNIMPLEMENTED for what trtserve does not implement.
        granted = {label: call_rpc(channel, path, method, 7.0, GOOD) for label, path, method in every_rpc()}
        expected = {label: grpc.StatusCode.UNIMPLEMENTED if label in UNIMPLEMENTED
                    else grpc.StatusCode.UNAVAILABLE if label in REFUSED_IN_MODE_NONE
                    else grpc.StatusCode.NOT_FOUND if label in NO_TOKENIZER else grpc.StatusCode.OK
                    for label, _, _ in every_rpc()}
        assert granted == expected
        for label, path, request, (cs, ss) in open_rpcs():
            got = code(channel, path, request, GOOD, client_streaming=cs, server_streaming=ss)
            assert got == grpc.StatusCode.OK, label
        policy_set = channel.unary_unary(
            "/trtserve.v1.ModelControl/GetPolicy", control_pb2.GetPolicyRequest.SerializeToString,
            control_pb2.BatchingPolicy.FromString,
        )(control_pb2.GetPolicyRequest(model_name="probe"), metadata=GOOD, timeout=30)
        assert policy_set.max_queue_delay_us == CHANGED_DELAY_US  # the authorised SetPolicy took effect
    assert markers(log) == [7.0, 7.0]  # ModelInfer and ModelStreamInfer with the token, nothing else
