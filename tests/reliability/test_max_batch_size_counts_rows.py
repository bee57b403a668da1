"""C21: max_batch_size counts rows, not requests: the engine never sees more than 64 rows.

identity_fp32 with max batch 64 and a 200 ms window (fixed timer), twice: with trtserve's
default (a request with more rows than max_batch_size is split across batches and gathered
back) and with ``split_oversized_requests: "false"`` (Triton's behaviour: refused). The
backend's ``run_inline`` (which every batch passes through) is wrapped to record the rows of
every batch it is given.

* 62 and 4 rows at the same time: OK, exact; no batch above 64 (trtserve may fill the first
  batch to 64 with 2 of the 4 rows and run the other 2 next: rows of one request are
  independent, and the answer is gathered back in order).
* 10 concurrent requests of 32 rows: they run in pairs, 64-row batches.
* A burst of 200 requests of 32 rows from 16 threads (the case: 1,000): never above 64.
* 65 rows: split and gathered (default), or INVALID_ARGUMENT at admission naming the batch size
  and max_batch_size (``split_oversized_requests: "false"``), never reaching the engine.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import write_identity

WINDOW = "max_queue_delay_microseconds: 200000"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("c21")
    write_identity(root, "split", max_batch_size=64, dynamic=WINDOW, parameters={"batching": "fixed"})
    write_identity(root, "nosplit", max_batch_size=64, dynamic=WINDOW,
                   parameters={"batching": "fixed", "split_oversized_requests": "false"})
    with ServerThread(root) as s:
        seen: dict[str, list[int]] = {"split": [], "nosplit": []}
        for name in seen:
            backend = s.registry.get(name).backend
            # Every batch passes through run_inline: on the event loop for a short one, on the
            # slot's thread (through run) for a longer one.
            original = backend.run_inline

            def run_inline(slot, batch, original=original, log=seen[name]):
                assert batch.rows == sum(len(next(iter(p.values()))) for p in batch.parts)
                log.append(batch.rows)
                return original(slot, batch)

            backend.run_inline = run_inline
        s.seen = seen
        yield s


def rows(n: int, first: int) -> np.ndarray:
    """n rows of 3 floats; row i holds first + i."""
    return np.repeat(np.arange(first, first + n, dtype=np.float32)[:, None], 3, axis=1)


def concurrently(srv, model: str, sizes: list[int], threads: int | None = None) -> list[np.ndarray]:
    go = threading.Barrier(min(len(sizes), threads or len(sizes)))
    with srv.client() as c, ThreadPoolExecutor(threads or len(sizes)) as pool:
        def send(i: int, n: int):
            x = rows(n, 1000 * i)
            if i < go.parties:
                go.wait()
            out = c.infer(model, {"INPUT0": x}, timeout=30)["OUTPUT0"]
            np.testing.assert_array_equal(out, x)
            return out
        return list(pool.map(send, range(len(sizes)), sizes))


@pytest.mark.parametrize("model", ["split", "nosplit"])
def test_62_and_4_never_make_a_batch_above_64(srv, model):
    srv.seen[model].clear()
    concurrently(srv, model, [62, 4])
    assert max(srv.seen[model]) <= 64 and sum(srv.seen[model]) == 66, srv.seen[model]


@pytest.mark.parametrize("model", ["split", "nosplit"])
def test_32_row_requests_run_in_pairs(srv, model):
    srv.seen[model].clear()
    concurrently(srv, model, [32] * 10)
    assert srv.seen[model] == [64] * 5


def test_a_burst_of_32_row_requests_never_exceeds_64(srv):
    srv.seen["split"].clear()
    concurrently(srv, "split", [32] * 200, threads=16)
    print(f"\nC21: burst of 200 x 32 rows -> {len(srv.seen['split'])} batches, max {max(srv.seen['split'])}")
    assert max(srv.seen["split"]) <= 64 and sum(srv.seen["split"]) == 200 * 32


def test_65_rows_split_by_default_refused_when_splitting_is_off(srv):
    srv.seen["split"].clear()
    srv.seen["nosplit"].clear()
    concurrently(srv, "split", [65])
    assert sorted(srv.seen["split"]) == [1, 64]
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.infer("nosplit", {"INPUT0": rows(65, 0)}, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch size 65" in err.value.details() and "max_batch_size 64" in err.value.details()
    assert srv.seen["nosplit"] == []
