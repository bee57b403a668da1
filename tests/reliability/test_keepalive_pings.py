"""C44: client keepalive pings must not end long calls or idle streams.

A client that pings every second (a load balancer's keepalive, scaled down so the test is
short) keeps a call of several seconds open under the server's default
ping policy, which accepts pings every 5 s or more and here is lowered to 500 ms by its flag;
under gRPC's own default (pings no more often than every 5 minutes without data) the same
client's call ends UNAVAILABLE "too many pings". The second case is what makes the first one
mean something: the client really pings faster than the server would otherwise allow.

grpc core refuses such pings without telling the Python server (no callback, no log line below
its debug traces), so ``trtserve serve`` states the policy in force in one start-up line instead,
as text or JSON: a real server started with a strict policy logs it once (with two front ends
too), and a pinging client's call ends as that line says.
"""

from __future__ import annotations

import json
import os
import re

import grpc
import numpy as np
import pytest

from integration.helpers import write_slow
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.frontend.grpc.server import Keepalive
from trtserve.testing import ServerProcess

PINGING_CLIENT = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def request(value: float) -> pb.ModelInferRequest:
    x = np.full((1, 4), value, np.float32)
    return pb.ModelInferRequest(
        model_name="slow", raw_input_contents=[x.tobytes()],
        inputs=[pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 4])])


@pytest.fixture
def slow_repo(tmp_path):
    write_slow(tmp_path, "slow", max_batch_size=1, batch_ms=8000)
    return tmp_path


def test_a_pinging_client_keeps_its_long_call_under_the_ping_policy(make_server, slow_repo):
    srv = make_server(slow_repo, frontends=1, keepalive=Keepalive(min_recv_ping_interval_without_data_ms=500))
    with grpc.insecure_channel(srv.url, options=PINGING_CLIENT) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request(3.0), timeout=60)
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [3.0] * 4


def test_grpc_own_ping_policy_ends_the_same_call(make_server, slow_repo):
    srv = make_server(slow_repo, frontends=1, keepalive=Keepalive(min_recv_ping_interval_without_data_ms=300_000))
    with grpc.insecure_channel(srv.url, options=PINGING_CLIENT) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request(3.0), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ping" in (err.value.details() or "").lower()


def test_the_default_policy_accepts_pings_every_5_s():
    default = Keepalive()
    assert default.min_recv_ping_interval_without_data_ms == 5000 and default.permit_without_calls
    assert ("grpc.http2.min_ping_interval_without_data_ms", 5000) in default.options()


@pytest.mark.parametrize("field, value", [("time_ms", 0), ("timeout_ms", -1), ("max_ping_strikes", -1)])
def test_a_keepalive_setting_out_of_range_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        Keepalive(**{field: value})


@pytest.mark.parametrize("frontends, log_format", [(1, "json"), (2, "text")])
def test_the_start_up_log_states_the_ping_policy_a_pinging_client_meets(slow_repo, frontends, log_format):
    strict = ("--grpc-http2-min-recv-ping-interval-without-data", "300000", "--grpc-http2-max-ping-strikes", "1")
    env = {**os.environ, "TRTSERVE_LOG_FORMAT": log_format}
    with ServerProcess(slow_repo, "--frontends", str(frontends), *strict, env=env) as srv:
        with grpc.insecure_channel(srv.url, options=PINGING_CLIENT) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request(3.0), timeout=60)
        lines = list(srv.output)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "too many pings" in (err.value.details() or "").lower()
    said = [line for line in lines if "gRPC ping policy" in line]
    assert len(said) == 1, said  # once per server, whatever the front-end count
    if log_format == "json":
        record = json.loads(said[0])
        assert record["level"] == "INFO" and record["logger"] == "trtserve"
        assert record["ping_policy"]["min_recv_ping_interval_without_data_ms"] == 300000
        assert record["ping_policy"]["max_ping_strikes"] == 1
        message = record["message"]
    else:
        assert re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO trtserve: gRPC ping policy", said[0]), said[0]
        message = said[0]
    assert "every 300000 ms or more while no data flows (--grpc-http2-min-recv-ping-interval-without-data)" in message
    assert "once more than 1 come sooner (--grpc-http2-max-ping-strikes" in message
    assert "GOAWAY ENHANCE_YOUR_CALM 'too_many_pings'" in message and "'Too many pings'" in message
