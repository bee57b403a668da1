"""C23: large messages: the defaults take hundreds of MB; beyond the limits, RESOURCE_EXHAUSTED
for that request alone, and the server stays healthy.

``seg``: an ONNX model FP32 INPUT0 [-1,1,256,256] -> OUTPUT0 [-1,3,256,256] (three copies of
the input along the channel axis), max batch 128, fixed 200 ms window.

* With the server's default limits (512 MiB), batch 43 (11 MB in, 34 MB out) through the
  unchanged ``tritonclient`` with its stock settings (in a child Python process) returns OK
  with the exact output.
* A server with ``--max-message-bytes`` of 64 MiB (the case: 512 MiB and a 600 MB request;
  scaled so the test moves 80 MB, not 600) refuses an 80 MB request quickly with
  RESOURCE_EXHAUSTED, and a request whose *response* would be 71 MB fails RESOURCE_EXHAUSTED
  alone while the 3 small requests batched with it succeed.
* After each, a small request returns OK and ServerLive is true. The send and receive limits
  are configurable separately (``--max-message-bytes``, ``--max-receive-bytes``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request
from trtserve.testing.models import _model, config_text, write_model

MIB = 1 << 20
ROW = 256 * 256

TRITONCLIENT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(sys.argv[1])  # stock settings
    x = (np.arange(43 * 256 * 256, dtype=np.float32) % 1000).reshape(43, 1, 256, 256)
    inp = tc.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    y = client.infer("seg", [inp], client_timeout=60).as_numpy("OUTPUT0")
    print(json.dumps({"shape": list(y.shape), "exact": bool(all(np.array_equal(y[:, c:c + 1], x) for c in range(3)))}))
''')


def seg_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Concat", ["INPUT0", "INPUT0", "INPUT0"], ["OUTPUT0"], axis=1)],
        "seg",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", 1, 256, 256])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", 3, 256, 256])],
    )
    return _model(graph)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("c23")
    write_model(root, "seg", seg_model(), config_text(
        "seg", [("INPUT0", "FP32", (1, 256, 256))], [("OUTPUT0", "FP32", (3, 256, 256))], max_batch_size=128,
        extra='dynamic_batching { max_queue_delay_microseconds: 1500000 }\n'
              'parameters { key: "batching" value: { string_value: "fixed" } }'))
    return root


def assert_healthy(c):
    x = np.full((1, 1, 256, 256), 5, np.float32)
    out = c.infer("seg", {"INPUT0": x}, timeout=30)["OUTPUT0"]
    assert out.shape == (1, 3, 256, 256) and np.all(out == 5)
    assert c.stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def test_batch_43_through_stock_tritonclient_with_default_limits(make_server, repo):
    srv = make_server(repo)
    result = subprocess.run([sys.executable, "-c", TRITONCLIENT, srv.url], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"shape": [43, 3, 256, 256], "exact": True}
    with srv.client() as c:
        assert_healthy(c)


def test_over_the_limits_fails_alone_with_resource_exhausted(make_server, repo):
    srv = make_server(repo, max_message_bytes=64 * MIB)
    with srv.client() as c:
        huge = build_request("seg", {"INPUT0": np.zeros((80 * MIB // (4 * ROW), 1, 256, 256), np.float32)})
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(huge, timeout=60)
        refused_s = time.monotonic() - started
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused_s < 5, refused_s
        assert_healthy(c)

        # 90 rows: 24 MB in, 71 MB out (> 64 MiB); batched with 3 small requests.
        go = threading.Barrier(4)

        def send(rows: int, value: float):
            x = np.full((rows, 1, 256, 256), value, np.float32)
            go.wait()
            try:
                y = c.infer("seg", {"INPUT0": x}, timeout=60)["OUTPUT0"]
            except grpc.RpcError as exc:
                return exc.code(), exc.details()
            return grpc.StatusCode.OK, bool(y.shape == (rows, 3, 256, 256) and np.all(y == value))

        stats = srv.registry.get("seg").dispatcher.stats
        before = dict(stats.batch_sizes)
        with ThreadPoolExecutor(4) as pool:
            big = pool.submit(send, 90, 9.0)
            small = [pool.submit(send, 1, float(i + 1)) for i in range(3)]
            code, details = big.result()
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "maximum send size" in details
            assert [f.result() for f in small] == [(grpc.StatusCode.OK, True)] * 3
        assert stats.batch_sizes[93] == before.get(93, 0) + 1  # they did share the batch
        assert_healthy(c)
    print(f"\nC23: 80 MB request refused in {refused_s * 1e3:.0f} ms; 71 MB response refused alone")
