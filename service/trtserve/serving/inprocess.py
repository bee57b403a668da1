"""``trtserve serve --frontends 1``: the engine core and one front end in one process; and one
model served in process without a server (:func:`local_model`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING

from trtserve.serving.ports import PortClaim
from trtserve.serving.settings import ServeConfig, announcer, log_ping_policy, queue_line

if TYPE_CHECKING:
    from trtserve.engine.registry import ModelRegistry
    from trtserve.frontend.pipeline import FrontendModel

log = logging.getLogger("trtserve")


async def serve_in_process(config: ServeConfig) -> int:
    """``--frontends 1``: the engine core and one front end in this process, the front end
    calling the dispatchers directly (:class:`~trtserve.engine.local.LocalEngine`: no ZeroMQ
    hop). SIGTERM/SIGINT drains as the tree does; a second signal exits at once. Returns the
    exit status (0 after a clean drain)."""
    from trtserve.clock import MonotonicClock
    from trtserve.engine.local import LocalEngine
    from trtserve.frontend.doors import open_doors
    from trtserve.serving.engine_process import log_models, make_core

    core = make_core(config, None)
    await core.start()
    engine = LocalEngine.of(core)
    pool = ThreadPoolExecutor(config.cpu_workers, thread_name_prefix="cpu")
    # Listen first, load second: while models load, health says NOT_SERVING, ServerReady
    # false and ServerLive true, instead of a refused connection.
    try:
        doors = await open_doors(engine, MonotonicClock(), pool, host=config.host, port=config.port,
                                 http_port=config.http_port, http_limits=config.http_limits, **config.frontend)
    except RuntimeError as exc:  # a port in use: one line, exit 2, as every other start-up refusal
        print(f"trtserve serve: {exc}", file=sys.stderr, flush=True)
        await core.aclose()
        pool.shutdown(wait=False)
        return 2
    port = doors.grpc_port
    # Ports asked for as 0 are claimed once known (the fixed ones were, before binding).
    claims = [PortClaim(config.host, bound, door) for door, asked, bound in
              (("gRPC", config.port, port), ("HTTP", config.http_port, doors.http_port)) if asked == 0 and bound]
    announce = announcer(config)
    announce(f"trtserve bound {config.host}:{port}, loading models")
    log_ping_policy(config)
    if doors.http_port is not None:
        announce(f"trtserve HTTP on {config.host}:{doors.http_port}")
    if doors.queue is not None:
        announce(queue_line(doors.queue.settings))
        if core.metrics is not None:
            core.metrics.registry.register(doors.queue.metrics)
    if core.metrics is not None:
        announce(f"trtserve metrics on http://{config.metrics_host}:{core.metrics.port}/metrics")
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second signal: exiting now")
            logging.shutdown()
            os._exit(1)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    load = asyncio.ensure_future(core.load())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((load, stopped), return_when=asyncio.FIRST_COMPLETED)
    if load.done():
        load.result()
        await doors.state.loaded()
        log_models(core)
        announce(f"trtserve listening on {config.host}:{port} (1 front end, in process)")
    else:
        log.info("signal while loading: stopping")
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    await stopped
    log.info("draining (grace period %.1f s)", config.grace)
    await doors.drain(config.grace)
    await core.aclose()
    pool.shutdown(wait=False)
    for claim in claims:
        claim.release()
    log.info("stopped")
    return 0


def local_model(registry: ModelRegistry, name: str, pool: Executor) -> FrontendModel:
    """Model ``name`` of a loaded ``registry`` with its handler, served in process: the front
    end's :class:`~trtserve.frontend.pipeline.FrontendModel` over a
    :class:`~trtserve.engine.local.LocalEngine` (the Ray bulk actors run a model this way).

    Raises:
        ModelNotFound, ModelNotReady: see :meth:`~trtserve.engine.registry.ModelRegistry.get`.
    """
    from trtserve.engine.local import LocalEngine
    from trtserve.frontend.pipeline import FrontendModel

    return FrontendModel(registry.get(name).spec, LocalEngine(registry.get), pool=pool)
