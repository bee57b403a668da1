"""The Go open-loop load generator (``clients/go/loadgen``, built by ``make loadgen``) as the
bench's unary open loop: the same schedule, the same records, a fraction of the client CPU.

A grpc-go call costs the client a fraction of the CPU a Python ``grpc.aio`` call does, on the
cores the server runs on, so well beyond a fast model's capacity the Go client still sends on
time and the figures measure the server. The binary sends the pre-serialized request bytes
unchanged; this module writes its input files, reads its records back into a
:class:`~.records.Recorder` and reports its CPU time. File formats (little-endian) are the
binary's, documented in its ``main.go``: messages length-prefixed (uint64), the schedule as
:data:`SCHEDULE` rows, the records as :data:`RECORD` rows.

Clocks: the binary prints its start on ``CLOCK_MONOTONIC`` and records seconds from it; on
Linux ``time.perf_counter()`` (the clock of :mod:`.load`) reads the same clock, so a record's
time plus that start is a ``perf_counter`` time and the window's edges apply to it unchanged.

Doors: by default the binary calls ModelInfer over gRPC; with ``http_path`` (its ``-http``) it
POSTs each message, a KServe v2 JSON body, to that path of the server's HTTP door, sends each
deadline as the ``trtserve-timeout-us`` header (and gives up 1 ms after it), and records the
HTTP status as the gRPC code it stands for (429 RESOURCE_EXHAUSTED, 504 DEADLINE_EXCEEDED, ...),
so both doors' records read the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import numpy as np

from trtserve.harness.benchlib.proctree import tree_cpu_seconds
from trtserve.harness.benchlib.records import Recorder

LOADGEN = Path(__file__).resolve().parents[4] / "clients" / "go" / "build" / "loadgen"
"""Where ``make loadgen`` (``clients/go/build.sh loadgen``) puts the binary."""
LENGTH = np.dtype("<u8")
SCHEDULE = np.dtype([("at_s", "<f8"), ("message", "<i8"), ("deadline_us", "<i8")])
"""One call of the schedule: arrival (s from the start), message index, deadline (µs after
sending; 0 = none): the gRPC deadline, or over HTTP the ``trtserve-timeout-us`` header."""
RECORD = np.dtype([("message", "<i8"), ("scheduled_s", "<f8"), ("sent_s", "<f8"), ("done_s", "<f8"), ("code", "<i8")])
"""One call sent, in schedule order: message index; scheduled, sent and answered (s from the
start, monotonic); gRPC status code (over HTTP, the code the answer's status stands for)."""
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
SAME_CLOCK = "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation


def unavailable_reason(binary: Path = LOADGEN) -> str | None:
    """Why the Go client cannot drive this bench (a sentence), or None when it can."""
    if not SAME_CLOCK:
        clock = time.get_clock_info("perf_counter").implementation
        return f"time.perf_counter() is {clock}, not the binary's CLOCK_MONOTONIC"
    if not os.access(binary, os.X_OK):
        return f"{binary} is not built (`make loadgen` builds it; Go from clients/install_deps.sh go)"
    return None


def write_messages(path: Path, messages: Sequence[bytes]) -> None:
    """Write ``messages`` as the binary reads them: per message its byte length (uint64 LE), then its bytes."""
    with path.open("wb") as f:
        for message in messages:
            f.write(np.array(len(message), LENGTH).tobytes())
            f.write(message)


def schedule_rows(arrivals: np.ndarray, messages: np.ndarray, deadline_us: np.ndarray | int) -> np.ndarray:
    """The :data:`SCHEDULE` rows of calls arriving at ``arrivals`` (s, non-decreasing), each
    sending message ``messages[k]`` with a gRPC deadline of ``deadline_us[k]`` (or ``deadline_us``) µs (0 = none)."""
    rows = np.empty(len(arrivals), SCHEDULE)
    rows["at_s"], rows["message"], rows["deadline_us"] = arrivals, messages, deadline_us
    return rows


def read_records(path: Path) -> np.ndarray:
    """The binary's records (:data:`RECORD` rows). Raises ValueError when the file is not whole rows."""
    data = path.read_bytes()
    if len(data) % RECORD.itemsize:
        raise ValueError(f"{path}: {len(data)} bytes is not a whole number of {RECORD.itemsize}-byte records")
    return np.frombuffer(data, RECORD)


def add_records(recorder: Recorder, records: np.ndarray, start_s: float, deadlines_s: Sequence[float]) -> None:
    """Append ``records`` to ``recorder``: times moved to the ``perf_counter`` clock by the
    binary's ``start_s``; status codes as gRPC status names (an unknown code as ``CODE_<n>``);
    ``deadlines_s[message]`` (s) decides whether an OK answer was late."""
    for r in records:
        key = int(r["message"])
        code = int(r["code"])
        recorder.add(key, start_s + float(r["scheduled_s"]), start_s + float(r["sent_s"]), start_s + float(r["done_s"]),
                     CODE_NAMES.get(code, f"CODE_{code}"), deadlines_s[key])


class GoRun:
    """One run of the binary, started and connected (see :meth:`GoLoadgen.started`).

    Attributes:
        start_s: the binary's start on the ``perf_counter`` clock (s); its schedule counts from it.
    """

    def __init__(self, proc: asyncio.subprocess.Process, start_s: float, out: Path, stderr: Path,
                 children_cpu_s: float) -> None:
        self._proc = proc
        self.start_s = start_s
        self._out = out
        self._stderr = stderr
        self._children_cpu_s = children_cpu_s
        self._cpu_s: float | None = None

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the binary has used: read from ``/proc`` while it runs,
        from this process's reaped-children times once it has exited (nothing else is reaped
        during a point)."""
        if self._cpu_s is not None:
            return self._cpu_s
        return tree_cpu_seconds(self._proc.pid)

    async def drive(self, recorder: Recorder, stop: asyncio.Event, deadlines_s: Sequence[float]) -> None:
        """Wait until ``stop`` is set, then tell the binary to send nothing scheduled at or
        after ``recorder.window_end``, wait for its last answer and add its records to
        ``recorder``. Raises RuntimeError, with the binary's stderr, when it fails."""
        stopped = asyncio.ensure_future(stop.wait())
        exited = asyncio.ensure_future(self._proc.wait())
        try:
            await asyncio.wait((stopped, exited), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        assert self._proc.stdin is not None
        if stop.is_set() and self._proc.returncode is None:
            self._proc.stdin.write(f"stop {recorder.window_end - self.start_s:.9f}\n".encode())
            with contextlib.suppress(ConnectionError):  # it may have finished its schedule meanwhile
                await self._proc.stdin.drain()
        self._proc.stdin.close()
        code = await exited
        own = os.times()
        self._cpu_s = own.children_user + own.children_system - self._children_cpu_s
        if code != 0:
            raise RuntimeError(f"the Go load generator exited with status {code}: {self._stderr.read_text().strip()}")
        add_records(recorder, read_records(self._out), self.start_s, deadlines_s)


class GoLoadgen:
    """Runs the Go binary against one server's door.

    Args:
        url: the door's ``127.0.0.1:PORT`` (the binary refuses any address that is not loopback):
            the gRPC door's, or the HTTP door's for :meth:`started` with ``http_path``.
        binary: the built ``loadgen``.
    """

    def __init__(self, url: str, binary: Path = LOADGEN) -> None:
        self.url = url
        self.binary = binary

    @contextlib.asynccontextmanager
    async def started(self, messages: Sequence[bytes], schedule: tuple[np.ndarray, np.ndarray, np.ndarray | int],
                      connections: int, http_path: str | None = None) -> AsyncIterator[GoRun]:
        """The binary, started over ``connections`` connections, once it has printed its start;
        killed on exit if still running. ``schedule`` is (arrivals in s, non-decreasing;
        message index per call; deadline per call or for all, in µs, 0 = none). With
        ``http_path`` (``/v2/models/<model>/infer``) the messages are JSON bodies POSTed to that
        path of the HTTP door at ``url``; else serialized ModelInferRequests. Raises
        RuntimeError when it fails before starting (e.g. the server is unreachable)."""
        calls = schedule_rows(*schedule)
        with tempfile.TemporaryDirectory(prefix="trtserve-loadgen-") as tmp:
            files = Path(tmp)
            write_messages(files / "messages.bin", messages)
            calls.tofile(files / "schedule.bin")
            own = os.times()
            with (files / "stderr.txt").open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    str(self.binary), "-addr", self.url, "-connections", str(connections),
                    *(("-http", http_path) if http_path is not None else ()),
                    "-messages", str(files / "messages.bin"), "-schedule", str(files / "schedule.bin"),
                    "-out", str(files / "records.bin"),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                )
            try:
                assert proc.stdout is not None
                line = (await proc.stdout.readline()).decode().split()
                if len(line) != 2 or line[0] != "start":
                    await proc.wait()
                    raise RuntimeError(f"the Go load generator did not start (status {proc.returncode}): "
                                       f"{(files / 'stderr.txt').read_text().strip()}")
                yield GoRun(proc, float(line[1]), files / "records.bin", files / "stderr.txt",
                            own.children_user + own.children_system)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
