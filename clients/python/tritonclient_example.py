"""The unchanged `tritonclient[grpc]` package against trtserve.

    .venv/bin/python clients/python/tritonclient_example.py [HOST:PORT]   (default 127.0.0.1:8001)

Start a server first (`make serve`). Exits non-zero if an answer is not what it should be.
(Do not import trtserve in the same process: both register the `inference.*` protobuf types.)
"""

from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException


def main(url: str) -> None:
    client = tc.InferenceServerClient(url)
    assert client.is_server_live() and client.is_model_ready("tiny"), "model tiny is not ready"

    # Unary infer.
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    inp = tc.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("tiny", [inp], outputs=[tc.InferRequestedOutput("OUTPUT")], client_timeout=5.0)
    out = result.as_numpy("OUTPUT")
    assert out.shape == (4, 16) and out.dtype == np.float32, (out.shape, out.dtype)
    print(f"tiny: INPUT {x.shape} -> OUTPUT {out.shape} {out.dtype}")

    # A bidirectional stream: results arrive on the callback, in completion order, with their ids.
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    sent = {}
    for i in range(100):
        row = np.full((1, 1 + i % 5), i, np.float32)
        tensor = tc.InferInput("INPUT0", list(row.shape), "FP32")
        tensor.set_data_from_numpy(row)
        client.async_stream_infer("identity_fp32", [tensor], request_id=f"row-{i}")
        sent[f"row-{i}"] = row
    answered = {}
    for _ in sent:
        result, error = results.get(timeout=30)
        assert error is None, error
        answered[result.get_response().id] = result.as_numpy("OUTPUT0")
    client.stop_stream()
    assert answered.keys() == sent.keys()
    assert all(np.array_equal(answered[k], v) for k, v in sent.items())
    print(f"identity_fp32 stream: {len(answered)} of {len(sent)} ids answered, values equal")

    # Errors: InferenceServerException with the gRPC status.
    bad = tc.InferInput("INPUT", [1, 63], "FP32")
    bad.set_data_from_numpy(np.ones((1, 63), np.float32))
    try:
        client.infer("tiny", [bad])
    except InferenceServerException as err:
        assert err.status() == "StatusCode.INVALID_ARGUMENT", err.status()
        print(f"bad shape: {err.status()}: {err.message()}")
    else:
        raise AssertionError("a [1, 63] input was accepted")
    client.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="127.0.0.1:8001", help="server HOST:PORT (default: 127.0.0.1:8001)")
    main(parser.parse_args().url)
