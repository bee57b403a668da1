"""trtserve's own Python client: numpy in, numpy out.

    .venv/bin/python clients/python/example.py [HOST:PORT]     (default 127.0.0.1:8001)

Start a server first (`make serve`). Exits non-zero if an answer is not what it should be.
"""

from __future__ import annotations

import grpc
import numpy as np

from trtserve.client import Client, InferError


def main(url: str) -> None:
    with Client(url) as client:
        assert client.is_ready("tiny"), "model tiny is not ready"

        # Unary: one request of 4 rows; `timeout` (seconds) is the gRPC deadline.
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        out = client.infer("tiny", {"INPUT": x}, timeout=5.0)["OUTPUT"]
        assert out.shape == (4, 16) and out.dtype == np.float32, (out.shape, out.dtype)
        print(f"tiny: INPUT {x.shape} -> OUTPUT {out.shape} {out.dtype}")

        # Bulk: 100 requests over one ModelStreamInfer call, answered in completion order
        # with their ids; at most `max_inflight` are unanswered at any time.
        rows = {f"row-{i}": np.full((1, 1 + i % 5), i, np.float32) for i in range(100)}
        answered = {}
        requests = ((k, {"INPUT0": v}) for k, v in rows.items())
        for request_id, result in client.stream_infer("identity_fp32", requests, max_inflight=32):
            assert not isinstance(result, InferError), result
            answered[request_id] = result["OUTPUT0"]
        assert answered.keys() == rows.keys()
        assert all(np.array_equal(answered[k], v) for k, v in rows.items())
        print(f"identity_fp32 stream: {len(answered)} of {len(rows)} ids answered, values equal")

        # Errors come back as grpc.RpcError with the server's status code.
        try:
            client.infer("tiny", {"INPUT": np.ones((1, 63), np.float32)})
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            print(f"bad shape: {err.code().name}: {err.details()}")
        else:
            raise AssertionError("a [1, 63] input was accepted")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="127.0.0.1:8001", help="server HOST:PORT (default: 127.0.0.1:8001)")
    main(parser.parse_args().url)
