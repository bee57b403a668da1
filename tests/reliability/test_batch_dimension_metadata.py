"""C22: ModelMetadata reports the -1 batch dimension, and standard clients built from it work.

identity_fp32 (max batch 8, dims [8]) and a non-batched model (max batch 0, dims [2,8]).

* ModelMetadata: [-1, 8] for the batchable model, [2, 8] for the other; datatypes are protocol
  strings (FP32, not TYPE_FP32); ModelConfig.max_batch_size is 8.
* The unchanged ``tritonclient`` (in a child Python process: its protobuf modules cannot share
  a process with trtserve's) reads the metadata and config, builds inputs from the metadata
  shape with batch sizes 1 and 4 (what ``perf_analyzer --shape INPUT0:8`` does; perf_analyzer
  itself is not installed here), and every call returns OK with exact values.
* A batchable request with shape [8] (no batch dimension) fails INVALID_ARGUMENT naming the
  expected [-1, 8] and the received [8] with a note that batching adds a leading dimension;
  it is never silently reshaped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import grpc
import numpy as np
import pytest
from casekit import raw_request, write_identity

from trtserve._proto.inference import grpc_service_pb2 as pb

TRITONCLIENT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(sys.argv[1])
    out = {}
    for model in ("identity_fp32", "nobatch"):
        meta = client.get_model_metadata(model, as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
        spec = meta["inputs"][0]
        shape = [int(d) for d in spec["shape"]]
        results = []
        for batch in ((1, 4) if shape[0] == -1 else (None,)):
            dims = [batch, *shape[1:]] if batch else shape
            x = np.arange(int(np.prod(dims)), dtype=np.float32).reshape(dims)
            inp = tc.InferInput(spec["name"], dims, spec["datatype"])
            inp.set_data_from_numpy(x)
            got = client.infer(model, [inp], client_timeout=10).as_numpy(meta["outputs"][0]["name"])
            results.append([dims, bool(np.array_equal(got, x))])
        out[model] = {"shape": shape, "datatype": spec["datatype"],
                      "max_batch_size": int(config.get("max_batch_size", 0)), "results": results}
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("c22")
    write_identity(root, "identity_fp32", "FP32", (8,), max_batch_size=8)
    write_identity(root, "nobatch", "FP32", (2, 8), max_batch_size=0)
    with ServerThread(root) as s:
        yield s


def test_metadata_has_the_batch_dimension_and_protocol_datatypes(srv):
    with srv.client() as c:
        batched = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="identity_fp32"))
        plain = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="nobatch"))
        config = c.stub.ModelConfig(pb.ModelConfigRequest(name="identity_fp32")).config
    assert [list(t.shape) for t in (*batched.inputs, *batched.outputs)] == [[-1, 8], [-1, 8]]
    assert [list(t.shape) for t in (*plain.inputs, *plain.outputs)] == [[2, 8], [2, 8]]
    assert {t.datatype for t in (*batched.inputs, *batched.outputs, *plain.inputs)} == {"FP32"}
    assert config.max_batch_size == 8


def test_tritonclient_builds_working_requests_from_the_metadata(srv):
    result = subprocess.run([sys.executable, "-c", TRITONCLIENT, srv.url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["identity_fp32"] == {"shape": [-1, 8], "datatype": "FP32", "max_batch_size": 8,
                                    "results": [[[1, 8], True], [[4, 8], True]]}
    assert got["nobatch"] == {"shape": [2, 8], "datatype": "FP32", "max_batch_size": 0,
                              "results": [[[2, 8], True]]}


def test_a_request_without_the_batch_dimension_is_refused_not_reshaped(srv):
    stats = srv.registry.get("identity_fp32").dispatcher.stats
    before = stats.rows
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(raw_request("identity_fp32", "FP32", [8], np.ones(8, np.float32).tobytes()))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details()
    assert "[8]" in details and "[-1, 8]" in details and "batch" in details, details
    assert stats.rows == before
