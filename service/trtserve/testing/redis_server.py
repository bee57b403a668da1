"""A real redis-server (Debian's, 7.0) on 127.0.0.1 at a free port, for the queue door's tests and
the bench's ``queue`` mode: started in a directory of the caller's; for the tests with an
append-only file fsynced at every write, so a restart keeps everything Redis acknowledged."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"


def missing_reason() -> str | None:
    """Why the tests cannot run here (None: they can)."""
    if not Path(BINARY).exists():
        return "redis-server is not installed (Debian's redis-server package; .ci/run installs it)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``RedisServer(directory).start()``: ``url``, ``client()``, ``pid``, ``restart()``, ``stop()``.

    Args:
        directory: redis-server's working directory (its append-only file goes there).
        durable: True: an append-only file fsynced at every write (a restart loses nothing
            acknowledged; what the fault tests need). False: no persistence at all (the bench,
            which measures the door, not the disk).

    Raises (``start``):
        RuntimeError: redis-server exited, or did not answer PING within 5 s.
    """

    def __init__(self, directory: Path, *, durable: bool = True) -> None:
        self.directory = Path(directory)
        self.durable = durable
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", *persistence, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        for _ in range(500):  # ready when it answers PING (a fresh server: milliseconds)
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with status {self.process.returncode}") from None
                time.sleep(0.01)
        raise RuntimeError("redis-server did not answer PING within 5 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()
