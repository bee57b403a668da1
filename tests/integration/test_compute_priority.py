"""`trtserve serve --compute-nice N` (default 10): ONNX Runtime's threads run N nice values below the
event loop, so the loop that reads, refuses and answers calls is never starved by compute
(docs/guide/serving.md, "ONNX Runtime settings"). Read from /proc/<pid>/task/*/stat of a real
server process."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from helpers import write_identity

from trtserve.client import Client
from trtserve.runtimes.threads import DEFAULT_COMPUTE_NICE
from trtserve.testing import ServerProcess


def nice_values(pid: int) -> dict[int, int]:
    """Thread id → nice value (field 19 of /proc/<pid>/task/<tid>/stat, proc(5))."""
    values = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        values[int(task.name)] = int(fields[16])
    return values


def test_by_default_the_compute_threads_run_at_the_lower_priority_and_the_event_loop_does_not(tmp_path):
    write_identity(tmp_path, "a")
    write_identity(tmp_path, "b")
    with ServerProcess(tmp_path, "--intra-op-threads", "2") as srv, Client(srv.url) as c:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        for model in ("a", "b"):
            np.testing.assert_array_equal(c.infer(model, {"INPUT0": x})["OUTPUT0"], x)
        values = nice_values(srv.pid)
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the server inherits this process's
    lowered = min(base + DEFAULT_COMPUTE_NICE, 19)
    assert lowered > base
    # The process's main thread (tid == pid) runs the event loop; it keeps the process's priority.
    assert values[srv.pid] == base
    # Per model: the slot's thread and ORT's second intra-op thread.
    assert list(values.values()).count(lowered) >= 4
    assert set(values.values()) == {base, lowered}


def test_zero_leaves_every_thread_at_the_process_priority(tmp_path):
    write_identity(tmp_path, "a")
    with ServerProcess(tmp_path, "--compute-nice", "0", "--intra-op-threads", "2") as srv, Client(srv.url) as c:
        c.infer("a", {"INPUT0": np.ones((1, 3), np.float32)})
        assert set(nice_values(srv.pid).values()) == {os.getpriority(os.PRIO_PROCESS, 0)}
