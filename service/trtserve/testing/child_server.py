"""Servers as child processes on 127.0.0.1: ``trtserve serve`` (for the demo, the benchmark
and the compatibility tests, which must not share a process with the client under test) and
any other server that prints the address it listens on (the benchmark's peer)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")
_HTTP = re.compile(r"HTTP on ([\d.]+):(\d+)")
"""The HTTP door's line, printed before the "listening" one (``trtserve HTTP on HOST:PORT``)."""
_METRICS = re.compile(r"metrics on http://([\d.]+):(\d+)/metrics")
"""The metrics endpoint's line, printed before the "listening" one."""


class ChildServer:
    """``with ChildServer(cmd) as srv:`` — a live server at ``srv.url``.

    The child runs in its own session (process group), so a Ctrl-C at the terminal reaches
    only this process, whose ``with`` block then stops the child; whatever the child started
    and left behind (worker processes) is killed with its process group on the way out, so
    no orphan survives.

    Args:
        cmd: the command line; the server prints ``listening on HOST:PORT`` once it serves
            and, where it also serves HTTP, ``HTTP on HOST:PORT`` before that line.
        env: the child's environment (default: this process's).
        start_timeout: seconds to wait for the "listening" line.
        name: what the error messages call the server.

    Raises:
        RuntimeError: the server exited or did not listen in time (with its last output).
    """

    def __init__(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, start_timeout: float = 300.0,
                 name: str = "the server") -> None:
        self.cmd = list(cmd)
        self.env = dict(env) if env is not None else None
        self.start_timeout = start_timeout
        self.name = name
        self.url = ""
        self.http_url = ""  # HOST:PORT of the HTTP door; empty when the server announced none
        self.metrics_url = ""  # HOST:PORT of the metrics endpoint; empty when the server announced none
        self.output: deque[str] = deque(maxlen=200)
        # Set at the end of the output: once every process writing to it (the server, its
        # model workers, multiprocessing's resource tracker) has exited.
        self.output_closed = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, start_new_session=True)
        listening = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                http = _HTTP.search(line)
                if http and not self.http_url:
                    self.http_url = f"{http.group(1)}:{http.group(2)}"
                metrics = _METRICS.search(line)
                if metrics and not self.metrics_url:
                    self.metrics_url = f"{metrics.group(1)}:{metrics.group(2)}"
                match = _LISTENING.search(line)
                if match and not listening.is_set():
                    self.url = f"{match.group(1)}:{match.group(2)}"
                    listening.set()
            self.output_closed.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        try:
            while not listening.wait(0.2):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start:\n" + "".join(self.output))
        except BaseException:  # Ctrl-C while it starts, too
            self.stop(timeout=5.0)
            raise
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful drain), wait up to ``timeout`` seconds, then kill; then kill
        what is left of its process group. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone: nothing was left behind
        return self.proc.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(ChildServer):
    """``with ServerProcess(repository) as srv:`` — ``trtserve serve`` at ``srv.url`` (gRPC),
    ``srv.http_url`` (HTTP) and ``srv.metrics_url`` (Prometheus), every door on a free port
    (``--port 0 --http-port 0 --metrics-port 0``, before ``extra_args``, which may set them or
    turn a door off with ``--allow-http false`` / ``--allow-metrics false``).

    Args:
        repository: the model repository directory.
        extra_args: more ``trtserve serve`` flags.
        start_timeout: seconds to wait for the "listening" line (models load first).
        env: the server's environment (default: this process's).
    """

    def __init__(self, repository: Path, *extra_args: str, start_timeout: float = 300.0,
                 env: Mapping[str, str] | None = None) -> None:
        self.repository = Path(repository)
        self.extra_args = extra_args
        ports = ["--port", "0"]
        for door, flag in (("--allow-http", "--http-port"), ("--allow-metrics", "--metrics-port")):
            if not _turned_off(extra_args, door):
                ports += [flag, "0"]
        super().__init__(
            [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(self.repository),
             "--host", "127.0.0.1", *ports, *extra_args],
            env=env, start_timeout=start_timeout, name="trtserve",
        )


def _turned_off(args: Sequence[str], switch: str) -> bool:
    """Whether ``args`` set ``switch`` (``--allow-http``) false, as ``--allow-http false`` or
    ``--allow-http=false`` (the last one given wins, as in argparse)."""
    value = None
    for i, arg in enumerate(args):
        if arg == switch and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(switch + "="):
            value = arg.split("=", 1)[1]
    return value is not None and value.strip().lower() in ("0", "false", "no", "off")
