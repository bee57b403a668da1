"""Run ``trtserve serve`` as a child process on 127.0.0.1 (for the demo, the benchmark and
the compatibility tests, which must not share a process with the client under test)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")


class ServerProcess:
    """``with ServerProcess(repository) as srv:`` — a live server at ``srv.url``.

    Args:
        repository: the model repository directory.
        extra_args: more ``trtserve serve`` flags.
        start_timeout: seconds to wait for the "listening" line (models load first).

    Raises:
        RuntimeError: the server exited or did not listen in time (with its last output).
    """

    def __init__(self, repository: Path, *extra_args: str, start_timeout: float = 300.0) -> None:
        self.repository = Path(repository)
        self.extra_args = extra_args
        self.start_timeout = start_timeout
        self.url = ""
        self.output: deque[str] = deque(maxlen=200)
        # Set at the end of the output: once every process writing to it (the server, its
        # model workers, multiprocessing's resource tracker) has exited.
        self.output_closed = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(self.repository),
               "--host", "127.0.0.1", "--port", "0", *self.extra_args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        listening = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                match = _LISTENING.search(line)
                if match and not listening.is_set():
                    self.url = f"{match.group(1)}:{match.group(2)}"
                    listening.set()
            self.output_closed.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while not listening.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("trtserve did not start:\n" + "".join(self.output))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful drain), wait up to ``timeout`` seconds, then kill. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()
