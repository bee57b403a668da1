"""``trtserve serve``: the process tree — one engine core and N front ends, supervised
(with ``--frontends 1``, one process: :func:`~trtserve.serving.inprocess.serve_in_process`).

::

    trtserve serve (supervisor: starts, restarts, stops; serves nothing itself)
    ├── engine core      every model's dispatcher and execution slots; the metrics endpoint
    └── front end × N    grpc.aio on one port (SO_REUSEPORT), each a ZeroMQ DEALER to the core

Start: :func:`serve` claims every fixed port (:mod:`trtserve.serving.ports`: one server per
address, or exit 2 with one line); the supervisor makes the HTTP door's listening socket, one
for all the front ends; the engine core binds its socket and starts loading; front end 0 binds
the gRPC port, the others bind the same port (steered to these N sockets only,
:mod:`trtserve.frontend.grpc.reuseport`); each answers at once (health NOT_SERVING) and is ready
once the engine core's model table has reached it. Then the supervisor prints ``trtserve
listening on HOST:PORT``.

While serving: a front end that exits is restarted on the same port (its in-flight calls fail
UNAVAILABLE when their connection drops; the engine core drops their queued rows); more than
``MAX_RESTARTS`` within ``RESTART_WINDOW_S`` stops the server. An engine core that exits takes
the server down: the front ends are killed and the supervisor exits non-zero, with a log line
saying why, for an outer supervisor (systemd, Kubernetes) to restart it.

SIGTERM or SIGINT: every front end drains (stops admitting, answers everything admitted,
within the grace period), then the engine core finishes what is queued and closes its
runtimes; all exit 0. A second signal kills the tree at once (exit 1). Children die with the
supervisor (``PR_SET_PDEATHSIG``), so no process is left behind however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any

from trtserve.serving.ports import PortClaim, PortInUse, claim_ports
from trtserve.serving.settings import ServeConfig, announcer, log_ping_policy, queue_line

log = logging.getLogger("trtserve")

MAX_RESTARTS = 5
"""Front-end restarts tolerated within :data:`RESTART_WINDOW_S`; one more stops the server."""
RESTART_WINDOW_S = 60.0
"""The window (seconds) over which front-end restarts are counted."""
# Beyond the grace period, how long the supervisor waits for a front end or the engine core
# to finish stopping before it kills it.
STOP_SLACK_S = 10.0
# How long a child may take to bind its socket before the start counts as failed.
START_TIMEOUT_S = 120.0


class Child:
    """One child process and its pipe: it reports ``("bound", ...)`` (or ``("refused", line)``:
    an address it could not bind) and ``("ready",)``; the supervisor may send ``("stop",)``."""

    def __init__(self, name: str, target: Any, args: tuple[Any, ...]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe()
        self.name = name
        self.process = context.Process(target=target, args=(*args, child_conn), name=name, daemon=False)
        self.process.start()
        child_conn.close()

    def expect(self, kind: str, timeout: float = START_TIMEOUT_S) -> tuple[Any, ...]:
        """Wait for the child's ``kind`` report.

        Raises:
            PortInUse: the child could not bind its address.
            RuntimeError: the child exited or sent nothing in time.
        """
        if self.conn.poll(timeout):
            try:
                message = self.conn.recv()
            except EOFError:
                message = None
            if message is not None and message[0] == kind:
                return message
            if message is not None and message[0] == "refused":
                self.process.join(5.0)
                raise PortInUse(message[1])
        self.process.join(1.0)
        raise RuntimeError(f"{self.name} did not start (exit code {self.process.exitcode})")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child if it is still running."""
        if self.process.pid is not None and self.process.is_alive():
            try:
                os.kill(self.process.pid, sig)
            except ProcessLookupError:
                pass


class Supervisor:
    """Starts and watches the engine core and the front ends of one server (see the module
    docstring)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.rundir = tempfile.mkdtemp(prefix="trtserve-")  # mode 0700: the socket is ours alone
        self.address = f"ipc://{self.rundir}/engine.sock"
        self.engine: Child | None = None
        self.frontends: dict[int, Child] = {}
        self.port = config.port
        self.http_port = config.http_port
        self.http_socket: socket.socket | None = None
        self.claims: list[PortClaim] = []  # the ports bound as 0, claimed once known
        self.restarts: deque[float] = deque()
        self.stopping = False
        self._announce = announcer(config)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def run(self) -> int:
        """Serve until a signal; returns the exit status (0 after a clean drain)."""
        self._install_signals()
        try:
            return self._serve()
        except PortInUse as exc:
            print(f"trtserve serve: {exc}", file=sys.stderr, flush=True)
            self._kill_all()
            return 2
        except RuntimeError as exc:
            log.error("%s", exc)
            self._kill_all()
            return 1
        finally:
            shutil.rmtree(self.rundir, ignore_errors=True)
            for claim in self.claims:
                claim.release()

    def _serve(self) -> int:
        from trtserve.frontend.http.server import listening_socket
        from trtserve.serving.engine_process import engine_main

        config = self.config
        if self.http_port is not None:
            try:
                self.http_socket = listening_socket(config.host, self.http_port, reuse_port=False)
            except RuntimeError as exc:
                raise PortInUse(str(exc)) from None
            if not config.http_port:
                self.http_port = self.http_socket.getsockname()[1]
                self.claims.append(PortClaim(config.host, self.http_port, "HTTP"))
        self.engine = Child("engine core", engine_main, (config, self.address))
        _, metrics_port = self.engine.expect("bound")
        log.info("engine core started (pid %d)", self.engine.process.pid)
        self._start_frontend(0, config.port)
        if not config.port:
            self.claims.append(PortClaim(config.host, self.port, "gRPC"))
        self._announce(f"trtserve bound {config.host}:{self.port}, loading models")
        log_ping_policy(config)
        if self.http_port is not None:
            self._announce(f"trtserve HTTP on {config.host}:{self.http_port}")
        if config.frontend.get("queue") is not None:
            self._announce(queue_line(config.frontend["queue"]))
        if metrics_port is not None:
            self._announce(f"trtserve metrics on http://{config.metrics_host}:{metrics_port}/metrics")
        for index in range(1, config.frontends):
            self._start_frontend(index, self.port)
        waiting = set(self.frontends)
        while waiting and not self.stopping:
            self._step(ready_wanted=waiting)
        if not self.stopping:
            # Tests and tools read the bound port from this line.
            self._announce(
                f"trtserve listening on {config.host}:{self.port} ({config.frontends} front end(s))"
            )
        while not self.stopping:
            self._step()
        return self._stop()

    def _start_frontend(self, index: int, port: int) -> None:
        from trtserve.serving.frontend_process import frontend_main

        child = self.frontends[index] = Child(
            f"front end {index}", frontend_main, (self.config, self.address, port, self.http_socket, index)
        )
        (_, self.port, self.http_port) = child.expect("bound")
        log.info("front end %d started on port %d (pid %d)", index, self.port, child.process.pid)

    def _step(self, ready_wanted: set[int] | None = None) -> None:
        """Wait for one event: a child's report or exit, or a signal."""
        assert self.engine is not None
        conns = {child.conn: index for index, child in self.frontends.items()}
        sentinels = {child.process.sentinel: index for index, child in self.frontends.items()}
        ready = wait([self._wake_r, self.engine.process.sentinel, *conns, *sentinels])
        if self.engine.process.sentinel in ready:
            self.engine.process.join()
            log.error("the engine core exited (%s): stopping the server",
                      describe_exit(self.engine.process.exitcode))
            self._kill_all()
            raise SystemExit(1)
        for item in ready:
            if item in conns:
                index = conns[item]
                try:
                    message = item.recv()
                except EOFError:
                    continue
                if message[0] == "ready" and ready_wanted is not None:
                    ready_wanted.discard(index)
            elif item in sentinels and not self.stopping:
                self._restart(sentinels[item])
        if self._wake_r in ready:
            os.read(self._wake_r, 64)

    def _restart(self, index: int) -> None:
        child = self.frontends[index]
        child.process.join()
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) > MAX_RESTARTS:
            raise RuntimeError(
                f"front ends exited {len(self.restarts)} times within {RESTART_WINDOW_S:.0f} s (last: "
                f"{describe_exit(child.process.exitcode)}): stopping the server"
            )
        log.warning("front end %d (pid %s) exited (%s): restarting it", index, child.process.pid,
                    describe_exit(child.process.exitcode))
        self._start_frontend(index, self.port)

    def _stop(self) -> int:
        """Drain: every front end, then the engine core."""
        assert self.engine is not None
        log.info("draining %d front end(s) (grace period %.1f s)", len(self.frontends), self.config.grace)
        for child in self.frontends.values():
            child.signal(signal.SIGTERM)
        status = 0
        limit = self.config.grace + STOP_SLACK_S
        for child in self.frontends.values():
            status |= self._wait_exit(child, limit)
        self.engine.conn.send(("stop",))  # it ignores SIGTERM (see serving.engine_process.engine_main)
        status |= self._wait_exit(self.engine, limit)
        log.info("stopped")
        return 0 if status == 0 else 1

    def _wait_exit(self, child: Child, limit: float) -> int:
        child.process.join(limit)
        if child.process.is_alive():
            log.error("%s did not stop within %.0f s: killed", child.name, limit)
            child.signal(signal.SIGKILL)
            child.process.join()
            return 1
        if child.process.exitcode != 0:
            log.error("%s exited (%s)", child.name, describe_exit(child.process.exitcode))
            return 1
        return 0

    def _kill_all(self) -> None:
        for child in [*self.frontends.values(), *([self.engine] if self.engine else [])]:
            child.signal(signal.SIGKILL)
            child.process.join(5.0)

    def _install_signals(self) -> None:
        def on_signal(signum: int, frame: Any) -> None:
            if self.stopping:
                log.warning("second signal: exiting now")
                self._kill_all()
                logging.shutdown()
                os._exit(1)
            self.stopping = True
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)


def describe_exit(code: int | None) -> str:
    """A child's exit code in words: ``exit code 3`` or ``killed by SIGKILL``."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def serve(config: ServeConfig) -> int:
    """Run the server of ``config`` until a signal; returns the exit status. One front end:
    one process (:func:`~trtserve.serving.inprocess.serve_in_process`); more: the supervised
    tree. Every fixed port is claimed first (:func:`~trtserve.serving.ports.claim_ports`) and
    held until the server exits; a port taken by another server or process: one line on
    stderr (``trtserve serve: cannot listen on HOST:PORT: ...``), exit 2."""
    try:
        claims = claim_ports({"gRPC": (config.host, config.port), "HTTP": (config.host, config.http_port),
                              "metrics": (config.metrics_host, config.metrics_port)})
    except PortInUse as exc:
        print(f"trtserve serve: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        if config.frontends == 1:
            from trtserve.serving.inprocess import serve_in_process

            return asyncio.run(serve_in_process(config))
        try:
            return Supervisor(config).run()
        except SystemExit as exc:
            return int(exc.code or 0)
    finally:
        for claim in claims:
            claim.release()
