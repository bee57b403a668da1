"""C28: a Python model's worker process that hangs is killed and replaced by the server, and a
server that exits hard leaves no worker and no shared memory behind.

The model (process isolation, one slot) echoes its input and returns its worker's process id; a
row whose first value is -2 sleeps for an hour, one whose first value is -3 for 0.45 s. The server
owns the worker, so:

* a batch hung past the dispatcher's hang limit (max(20x predicted, 10 s): the real limit here)
  fails with INTERNAL naming the hang; the worker is killed and a new one started, so the model
  serves again without an operator. Deadlines are the ``timeout`` parameter (with far longer
  gRPC deadlines, so that DEADLINE_EXCEEDED is the server's answer): a request in the hung batch
  whose deadline comes first is answered DEADLINE_EXCEEDED while the batch still hangs (counted
  as ``finished_late``), and one queued behind the batch is dropped from the queue at its own
  deadline, never run (``before_run``). ModelReady is false while the slot is hung or its worker restarting (the
  model's setup takes 3 s, so a poll every 0.1 s sees it), then true again;
* when the server ends on a second SIGTERM (``os._exit``) or is SIGKILLed while a worker is in the
  middle of a one-hour batch, the worker exits too, no shared memory segment it or the server
  mapped is left in /dev/shm, and no "leaked shared_memory objects" warning is printed.

(A worker that *exits* during or between batches: tests/integration/test_python_runtime.py.)
Nothing here depends on the machine's speed: the limits are the server's own, waited for with
tens of seconds to spare.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from casekit import EXPIRED_IN_QUEUE, EXPIRED_WHILE_RUNNING, deadline_exceeded, wait_for, with_timeout

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import Client, build_request, parse_response
from trtserve.testing import ServerProcess

HANGY = """
    import os
    import time

    import numpy as np


    class Model:
        def setup(self, config):
            time.sleep(float(config.parameters.get("setup_s", "0")))

        def predict(self, inputs):
            x = inputs["INPUT0"]
            if (x[:, 0] == -2).any():
                time.sleep(3600)
            if (x[:, 0] == -3).any():
                time.sleep(0.45)
            return {"OUTPUT0": x, "PID": np.full((x.shape[0], 1), os.getpid(), np.int64)}
"""


def write_hangy(root: Path, setup_s: float = 0.0) -> Path:
    (root / "hangy" / "1").mkdir(parents=True)
    (root / "hangy" / "1" / "model.py").write_text(textwrap.dedent(HANGY))
    (root / "hangy" / "config.pbtxt").write_text(f"""
        name: "hangy" backend: "python" max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
                 {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        dynamic_batching {{ }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "isolation" value: {{ string_value: "process" }} }}
        parameters {{ key: "setup_s" value: {{ string_value: "{setup_s}" }} }}
    """)
    return root


def x(value: float) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, 4), value, np.float32)}


def call(stub, value: float, timeout: float, deadline: float | None = None) -> tuple[grpc.StatusCode, object, float]:
    """(code, outputs or details, seconds) of one request with a gRPC deadline of ``timeout`` s
    and, where given, a server-side one (``timeout`` parameter) of ``deadline`` s."""
    t0 = time.monotonic()
    request = build_request("hangy", x(value))
    if deadline is not None:
        with_timeout(request, deadline)
    try:
        response = stub.ModelInfer(request, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", time.monotonic() - t0
    return grpc.StatusCode.OK, parse_response(response), time.monotonic() - t0


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def shm_mapped(pid: int) -> set[str]:
    """The /dev/shm files process ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in f
                if len(line.split(None, 5)) == 6 and "/dev/shm/" in line}


def test_c28_a_worker_hung_past_the_hang_limit_is_killed_and_replaced(make_server, tmp_path):
    srv = make_server(write_hangy(tmp_path, setup_s=3.0), metrics_port=0)
    dispatcher = srv.registry.get("hangy").dispatcher
    counted = deadline_exceeded(srv, "hangy")
    readiness: list[tuple[float, bool]] = []
    stop = threading.Event()

    def poll_ready() -> None:
        with srv.client() as c:
            while not stop.is_set():
                readiness.append((time.monotonic(), c.is_ready("hangy")))
                time.sleep(0.1)

    with srv.client() as c, ThreadPoolExecutor(4) as pool:
        code, out, _ = call(c.stub, 1.0, 30)
        assert code == grpc.StatusCode.OK, out
        first = int(out["PID"][0, 0])
        poller = pool.submit(poll_ready)
        # The slot is busy for 0.45 s, so that the next two requests queue and share one batch.
        busy = pool.submit(call, c.stub, -3.0, 30)
        assert wait_for(lambda: dispatcher.idle_slots == 0, 30)
        t0 = time.monotonic()
        # A caller that waits longer than the hang limit sees its hung batch fail, by name.
        hung = pool.submit(call, c.stub, -2.0, 45)
        # One in the same batch with a 3 s deadline: answered while the batch still hangs.
        leaving = pool.submit(call, c.stub, -2.0, 45, 3.0)
        assert busy.result()[0] == grpc.StatusCode.OK
        assert wait_for(lambda: dispatcher.idle_slots == 0 and not dispatcher.queue.entries, 30)
        queued = call(c.stub, 3.0, 30, 2.0)  # behind the hung batch: dropped at its own deadline
        assert queued[0] == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_IN_QUEUE in queued[1], queued
        left = leaving.result()
        assert left[0] == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_WHILE_RUNNING in left[1], left
        assert not hung.done(), "the hung batch ended before its deadline-bound caller was answered"
        code, details, elapsed = hung.result()
        assert code == grpc.StatusCode.INTERNAL, (code, details, elapsed)
        assert "past the hang limit" in details and "killed" in details and "restarted" in details, details
        assert 10.0 <= elapsed < 45, elapsed
        # The model serves again on a new worker, without anyone killing anything by hand.
        assert wait_for(lambda: c.is_ready("hangy"), 30, 0.1), "ModelReady stayed false"
        code, out, _ = call(c.stub, 4.0, 3)
        assert code == grpc.StatusCode.OK, out
        np.testing.assert_array_equal(out["OUTPUT0"], x(4.0)["INPUT0"])
        second = int(out["PID"][0, 0])
        stop.set()
        poller.result()
    assert second != first and gone(first)
    grew = {k: v - counted[k] for k, v in deadline_exceeded(srv, "hangy").items()}
    assert grew == {"before_run": 1, "finished_late": 1}, grew
    not_ready = [t - t0 for t, ready in readiness if not ready and t >= t0]
    assert not_ready, "ModelReady never turned false while the worker hung or restarted"
    print(f"\nC28 hang: INTERNAL after {elapsed:.1f} s; ModelReady false from {min(not_ready):.1f} s "
          f"to {max(not_ready):.1f} s after the hung request was sent")


@pytest.mark.parametrize("ending", ["second SIGTERM", "SIGKILL"])
def test_c28_a_hard_server_exit_leaves_no_worker_and_no_shared_memory(tmp_path, ending):
    srv = ServerProcess(write_hangy(tmp_path)).__enter__()
    try:
        with Client(srv.url) as c, ThreadPoolExecutor(1) as pool:
            code, out, _ = call(c.stub, 1.0, 30)  # numeric tensors both ways: shared memory in use
            assert code == grpc.StatusCode.OK, out
            worker = int(out["PID"][0, 0])
            mapped = shm_mapped(srv.pid) | shm_mapped(worker)
            pool.submit(call, c.stub, -2.0, 60)  # the worker is now in a one-hour batch
            time.sleep(1.0)
            assert c.stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
            if ending == "SIGKILL":
                os.kill(srv.pid, signal.SIGKILL)
            else:
                srv.proc.send_signal(signal.SIGTERM)  # drains: waits for the hung batch
                time.sleep(1.0)
                srv.proc.send_signal(signal.SIGTERM)  # "second signal: exiting now" (os._exit)
            srv.proc.wait(30)
        assert wait_for(lambda: gone(worker), 30, 0.1), f"worker {worker} outlived the server"
        # Every process that writes to the server's output (workers, resource tracker) is gone.
        assert srv.output_closed.wait(30), "a child of the server still holds its output"
    finally:
        srv.stop(10)
    output = "".join(srv.output)
    if ending == "second SIGTERM":
        assert srv.proc.returncode == 1 and "second signal" in output, output[-3000:]
    assert "leaked shared_memory" not in output, output[-3000:]
    left = {path for path in mapped if Path(path).exists()}
    assert not left, f"shared memory left behind: {sorted(left)}"
