"""The settings of ``trtserve serve`` and what each of its processes does first.

Kept apart from :mod:`trtserve.serving.supervisor` so that the child processes' mains
(:mod:`trtserve.serving.engine_process`, :mod:`trtserve.serving.frontend_process`) import the
settings, not the supervisor that starts them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtserve.engine.lifecycle import LifecycleConfig
from trtserve.runtimes.threads import DEFAULT_COMPUTE_NICE

if TYPE_CHECKING:  # the engine core's process never loads uvicorn
    from trtserve.frontend.http.protocol import HttpLimits

log = logging.getLogger("trtserve")


@dataclass(frozen=True)
class ServeConfig:
    """Everything the processes of one server need (picklable; from the CLI).

    Attributes:
        repository: the model repository directory.
        host, port: where the front ends listen for gRPC (port 0: an ephemeral port).
        http_port: where they listen for HTTP (0: an ephemeral port; None: no HTTP door).
            Triton's ports by default: gRPC 8001, HTTP 8000, metrics 8002.
        http_limits: the HTTP door's bounds on each connection (None: the defaults of
            :class:`~trtserve.frontend.http.protocol.HttpLimits`).
        frontends: front-end processes (>= 1).
        grace: seconds to finish admitted work on SIGTERM.
        frontend: keyword arguments of :func:`trtserve.frontend.doors.open_doors` (limits, TLS,
            auth; ``queue``: the queue door's settings).
        cpu_workers: threads per front end for handler pre/post-processing.
        intra_op_threads: ONNX Runtime threads per session (0: one per core).
        compute_nice: added to the nice value of ONNX Runtime's threads (0..19).
        metrics_host, metrics_port: the engine core's Prometheus endpoint (0: an ephemeral port;
            None: off).
        log_level, log_format, log_requests: logging of every process (as the CLI's flags).
        lifecycle: model control mode, models to load, poll interval, readiness rule.
    """

    repository: Path
    host: str = "127.0.0.1"
    port: int = 8001
    http_port: int | None = 8000
    http_limits: HttpLimits | None = None
    frontends: int = 1
    grace: float = 30.0
    frontend: dict[str, Any] = field(default_factory=dict)
    cpu_workers: int = 2
    intra_op_threads: int = 0
    compute_nice: int = DEFAULT_COMPUTE_NICE
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 8002
    log_level: str = "INFO"
    log_format: str = "text"
    log_requests: bool = False
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)


def default_frontends() -> int:
    """``--frontends auto``: one front end per two cores, between 1 and 8 (so 1, one process,
    on a 2-core machine; 8 on a 16-core GPU host).

    Half the cores: each front end saturates about one core of gRPC work, and the engine core
    needs cores of its own for the runtimes' threads (on 2 cores a second front end was measured
    to add no throughput, and the one-process server is the fastest for one caller).
    """
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent (the supervisor) dies (Linux
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so no process outlives the server."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the supervisor's own cleanup remains
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def log_ping_policy(config: ServeConfig) -> None:
    """Log the gRPC keepalive and ping policy in effect, once per server, as one line
    (:meth:`Keepalive.describe <trtserve.frontend.grpc.server.Keepalive.describe>`; with
    ``--log-format json`` its numbers are also the record's ``ping_policy`` field)."""
    from trtserve.frontend.grpc.server import Keepalive

    keepalive = config.frontend.get("keepalive") or Keepalive()
    log.info("%s", keepalive.describe(), extra={"ping_policy": asdict(keepalive)})


def announcer(config: ServeConfig) -> Any:
    """How start-up lines are written: stdout, or with ``--log-format json`` a JSON log
    record like every other line (tools find "listening on HOST:PORT" in either)."""
    if config.log_format == "json":
        return lambda line: log.info("%s", line)
    return lambda line: print(line, flush=True)


def queue_line(settings: Any) -> str:
    """The start-up line of the queue door (a :class:`~trtserve.frontend.queue.door.QueueSettings`)."""
    return (f"trtserve queue door on {settings.redact()} (streams {settings.prefix}:requests:<model>, "
            f"group trtserve)")
