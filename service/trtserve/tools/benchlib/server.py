"""The server under test: a real ``python -m trtserve serve`` subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

LISTENING = re.compile(r"trtserve listening on (127\.0\.0\.1:\d+)")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(stat: str, ticks_per_s: int = CLOCK_TICKS_PER_S) -> float:
    """User + system CPU seconds of a process (all its threads) from its ``/proc/<pid>/stat`` text.

    The command name (field 2) may hold spaces and parentheses, so fields are counted from
    the last ``)``: utime and stime are fields 14 and 15, in clock ticks.
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


class ServerProcess:
    """``python -m trtserve serve --model-repository ROOT --host 127.0.0.1 --port 0``.

    Its stdout and stderr go to ``log_path``. Use as a context manager: ``__enter__`` waits
    for the "listening" line and sets :attr:`address`; ``__exit__`` sends SIGTERM (the
    server drains) and waits for it to exit.

    Args:
        root: the model repository.
        log_path: file for the server's output.
        start_timeout_s: seconds to wait for the server to listen (model loading included).
    """

    def __init__(self, root: Path, log_path: Path, start_timeout_s: float = 180.0) -> None:
        self.root = root
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.address = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        command = [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(self.root),
                   "--host", "127.0.0.1", "--port", "0"]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self.address = self._wait_listening()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_listening(self) -> str:
        assert self._proc is not None
        give_up = time.perf_counter() + self.start_timeout_s
        while time.perf_counter() < give_up:
            match = LISTENING.search(self.log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
            if self._proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self._proc.returncode}; see {self.log_path}")
            time.sleep(0.1)
        raise RuntimeError(f"the server did not listen within {self.start_timeout_s:.0f} s; see {self.log_path}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server has used since it started."""
        assert self._proc is not None
        return proc_cpu_seconds(Path(f"/proc/{self._proc.pid}/stat").read_text())

    def __exit__(self, *exc: object) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
