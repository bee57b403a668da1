"""The transport's own limits reach the transport: HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS on
each gRPC connection (``--grpc-max-concurrent-streams``). Events decide, not times: the gate
model holds a request whose first value is 7 until the test releases it."""

from __future__ import annotations

import grpc
import numpy as np

from integration.helpers import row, wait_for_file, write_gate
from reliability.casekit import wait_for
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import CHANNEL_OPTIONS, Client, build_request


def test_a_call_beyond_the_connections_stream_limit_waits_in_the_client_then_runs(make_server, tmp_path):
    started, release = write_gate(tmp_path / "models")
    write_gate(tmp_path / "models", "free")
    srv = make_server(tmp_path / "models", frontends=1, max_concurrent_streams=2)
    with Client(srv.url) as c:
        try:
            # The connection is up and the server's SETTINGS are in before the calls: a client may
            # open streams beyond the limit before it has read them (and the server then refuses
            # those, REFUSED_STREAM).
            assert c.stub.ServerLive(pb.ServerLiveRequest(), timeout=60).live
            # One connection: the first call is held in the slot, the second queues behind it, and
            # the third, one more than the connection's 2 streams, must not reach the server.
            calls = [c.stub.ModelInfer.future(build_request("gate", row(2, v)), timeout=60) for v in (7.0, 1.0, 2.0)]
            wait_for_file(started)
            assert wait_for(lambda: srv.admitted == 2, 10), srv.admitted
            # Another connection is not held back by this one's streams: its call (to a model of
            # its own, so that no slot holds it), sent after the third, is admitted and answered
            # while the third has still not arrived.
            own_connection = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
            with grpc.insecure_channel(srv.url, options=own_connection) as ch:
                answer = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(build_request("free", row(2, 3.0)), timeout=60)
            assert answer.raw_output_contents  # answered at once: nothing on its connection waits
            assert srv.admitted == 2 and not any(f.done() for f in calls)
        finally:
            release.touch()
        # The waiting call was not refused: it ran once a stream of its connection was free.
        for f, v in zip(calls, (7.0, 1.0, 2.0)):
            out = np.frombuffer(f.result(60).raw_output_contents[0], np.float32)
            np.testing.assert_array_equal(out, np.full(2, v, np.float32))
