"""The engine-core process of ``trtserve serve`` (started by :mod:`trtserve.serving.supervisor`)."""

from __future__ import annotations

import asyncio
import logging
import signal
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtserve.engine.core import EngineCore
    from trtserve.serving.settings import ServeConfig

log = logging.getLogger("trtserve")


def engine_main(config: ServeConfig, address: str, conn: Connection) -> None:
    """Serve ``config.repository`` to the front ends at ``address``; report ``("bound",
    metrics port or None)`` on ``conn`` once the socket is bound. Stops when the supervisor
    says so on ``conn`` (or closes it), after finishing every queued request and closing the
    runtimes; exits 0.

    SIGTERM and SIGINT are ignored: a signal to the whole process group (a terminal's Ctrl-C,
    systemd's default stop) must not close the engine core while the front ends are still
    draining into it; the supervisor stops it after them."""
    from trtserve import logs
    from trtserve.serving.settings import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.configure(config.log_level, config.log_format, config.log_requests)
    asyncio.run(_engine(config, address, conn))


def make_core(config: ServeConfig, address: str | None) -> EngineCore:
    """The engine core of ``config``: its model registry (nothing loaded yet) and metrics
    settings."""
    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.core import EngineCore
    from trtserve.engine.registry import ModelRegistry

    options = runtimes.RuntimeOptions(intra_op_threads=config.intra_op_threads, compute_nice=config.compute_nice)
    registry = ModelRegistry(
        config.repository, clock=MonotonicClock(), backend_factory=partial(runtimes.create, options=options)
    )
    return EngineCore(registry, address, metrics_host=config.metrics_host, metrics_port=config.metrics_port,
                      lifecycle=config.lifecycle)


def log_models(core: EngineCore) -> None:
    """One line per model: its state and reason."""
    for name, state, reason, _spec in core.table():
        log.info("model %-16s %s %s", name, state, reason)


async def _engine(config: ServeConfig, address: str, conn: Connection) -> None:
    core = make_core(config, address)
    await core.start()
    conn.send(("bound", core.metrics.port if core.metrics is not None else None))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_reader(conn.fileno(), stop.set)  # "stop", or the pipe closed
    load = asyncio.ensure_future(core.load())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((load, stopped), return_when=asyncio.FIRST_COMPLETED)
    if load.done():
        load.result()
        log_models(core)
    await stopped
    if not load.done():
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    await core.aclose()
