"""C01: a payload whose byte length does not match its declared shape never reaches a batch.

identity_fp32 with dims [5] and a 50 ms batch window (fixed timer, so that concurrent calls
share a batch). Client A sends [1,5] FP32 with 28 bytes (7 floats), then 12 bytes (3 floats);
client B sends a correct [1,5] tensor 100..104 in the same window. A fails INVALID_ARGUMENT at
admission naming the input and both byte counts; B gets exactly its own bytes back; A never
takes a place in a batch (the engine only ever ran B's rows). Also: a shape whose element
count overflows int64 and a negative dimension other than -1; and a BYTES tensor with bytes
left over after its last length-prefixed element (a BYTES identity), refused alone, by name,
unary and in a stream. Not scaled.
"""

from __future__ import annotations

import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import error_code, raw_request, stream, write_identity

from servers import code_of

B_VALUES = np.arange(100, 105, dtype=np.float32)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("c01")
    write_identity(root, "identity_fp32", "FP32", (5,), max_batch_size=8,
                   dynamic="max_queue_delay_microseconds: 50000",
                   parameters={"batching": "fixed"})
    write_identity(root, "echo_bytes", "BYTES", (1,), max_batch_size=8)
    with ServerThread(root) as s:
        yield s


def call(stub, request):
    try:
        return grpc.StatusCode.OK, stub.ModelInfer(request, timeout=10), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details()


@pytest.mark.parametrize("floats", [7, 3], ids=["28 bytes", "12 bytes"])
def test_mismatched_payload_fails_alone_and_never_joins_the_batch(srv, floats):
    stats = srv.registry.get("identity_fp32").dispatcher.stats
    before_rows, before_batches = stats.rows, stats.batches
    bad = raw_request("identity_fp32", "FP32", [1, 5], np.arange(floats, dtype=np.float32).tobytes())
    good = raw_request("identity_fp32", "FP32", [1, 5], B_VALUES.tobytes())
    pairs = 10
    go = threading.Barrier(2)
    with srv.client() as c, ThreadPoolExecutor(2) as pool:
        results = []
        for _ in range(pairs):
            def send(request):
                go.wait()
                return call(c.stub, request)
            a, b = pool.submit(send, bad), pool.submit(send, good)
            results.append((a.result(), b.result()))
        alone = call(c.stub, good)
    for (a_code, _, a_details), (b_code, b_response, _) in results:
        assert a_code == grpc.StatusCode.INVALID_ARGUMENT
        assert "INPUT0" in a_details and "needs 20 bytes" in a_details and f"got {4 * floats}" in a_details
        assert b_code == grpc.StatusCode.OK
        assert b_response.raw_output_contents[0] == B_VALUES.tobytes() == alone[1].raw_output_contents[0]
        assert list(b_response.outputs[0].shape) == [1, 5]
    # Only B's rows (one per pair, plus the lone call) reached the engine.
    assert stats.rows - before_rows == pairs + 1
    assert stats.batches - before_batches == pairs + 1


@pytest.mark.parametrize(
    "shape, words",
    [
        ([2**62, 5], ["INPUT0", "elements"]),  # 5 * 2^62 elements overflows int64
        ([2**63 - 1, 5], ["INPUT0", "elements"]),
        ([1, -5], ["INPUT0", "negative"]),
        ([-2, 5], ["INPUT0", "negative"]),
        ([-1, 5], ["INPUT0", "negative"]),  # -1 is only for configs, never in a request
    ],
)
def test_overflowing_and_negative_shapes_are_invalid_argument(srv, shape, words):
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(raw_request("identity_fp32", "FP32", shape, B_VALUES.tobytes()), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for word in words:
            assert word in err.value.details()
        good = raw_request("identity_fp32", "FP32", [1, 5], B_VALUES.tobytes())
        assert code_of(c.stub.ModelInfer, good) == grpc.StatusCode.OK


def test_raw_and_typed_contents_together_are_refused(srv):
    """Ambiguous data (Triton refuses it too): the raw bytes are not silently preferred."""
    request = raw_request("identity_fp32", "FP32", [1, 5], B_VALUES.tobytes())
    request.inputs[0].contents.fp32_contents.extend([1.0] * 5)
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT0" in err.value.details() and "contents.fp32_contents" in err.value.details()


def length_prefixed(*elements: bytes) -> bytes:
    """KServe v2 raw BYTES: each element as a little-endian uint32 length, then its bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@pytest.mark.parametrize("trailing", [b"\x01", b"xyz", b"\x00\x00\x00\x00", struct.pack("<I", 2) + b"cd"],
                         ids=["1 byte", "3 bytes", "an empty element's length", "a whole extra element"])
def test_bytes_left_over_after_the_last_element_are_invalid_argument(srv, trailing):
    """A [1, 1] BYTES tensor whose raw data goes on past its one element: refused naming the
    input and the count of bytes left over (not cut short to the shape), alone in its stream."""
    bad = raw_request("echo_bytes", "BYTES", [1, 1], length_prefixed(b"ab") + trailing, request_id="bad")
    good = raw_request("echo_bytes", "BYTES", [1, 1], length_prefixed(b"ab"), request_id="good")
    with srv.client() as c:
        code, _, details = call(c.stub, bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert f"input 'INPUT0' (BYTES) has {len(trailing)} bytes left over after its 1 elements" in details, details
        messages, final = stream(c.stub, [bad, good], timeout=30)
    assert final == grpc.StatusCode.OK
    answers = {m.infer_response.id: m for m in messages}
    assert error_code(answers["bad"]) == "INVALID_ARGUMENT" and "left over" in answers["bad"].error_message
    assert error_code(answers["good"]) == "OK"
    assert answers["good"].infer_response.raw_output_contents[0] == length_prefixed(b"ab")
