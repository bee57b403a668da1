"""C07: every streamed request is answered exactly once, with its own id and its own values.

One ModelStreamInfer stream to identity_fp32 (dims [-1], 4 instances, so batches run
concurrently and finish out of order) carries 2000 requests with ids "0".."1999" and random
lengths of 1..4096 floats. trtserve documents stream responses in *completion* order (docs/reference/grpc.md,
"Streams"), each carrying its request id: so every id comes back exactly once, no loss, no
duplicate, each output equals that request's input bit for bit, and the stream ends OK after
the client half-closes. Not scaled.
"""

from __future__ import annotations

import grpc
import numpy as np
from casekit import error_code, stream, write_identity

from trtserve.client import build_request, parse_response

N = 2000


def test_2000_stream_requests_each_answered_once_with_their_own_values(make_server, tmp_path):
    write_identity(tmp_path, "identity_fp32", "FP32", (-1,), max_batch_size=64, instances=4)
    srv = make_server(tmp_path)
    rng = np.random.default_rng(7)
    inputs = {str(i): rng.standard_normal((1, int(rng.integers(1, 4097)))).astype(np.float32) for i in range(N)}
    requests = (build_request("identity_fp32", {"INPUT0": x}, request_id=i) for i, x in inputs.items())
    with srv.client() as c:
        messages, code = stream(c.stub, requests, timeout=120)
    assert code == grpc.StatusCode.OK
    ids = [m.infer_response.id for m in messages]
    assert len(ids) == N and set(ids) == set(inputs)
    for m in messages:
        assert error_code(m) == "OK", m.error_message
        out = parse_response(m.infer_response)["OUTPUT0"]
        assert out.tobytes() == inputs[m.infer_response.id].tobytes()
    stats = srv.registry.get("identity_fp32").dispatcher.stats
    assert stats.rows == N and max(stats.batch_sizes) > 1  # batched, padded and cut back
    out_of_order = sum(1 for a, b in zip(ids, ids[1:]) if int(b) < int(a))
    print(f"\nC07: {N} answers, {stats.batches} batches, {out_of_order} answers after a later-sent one")
