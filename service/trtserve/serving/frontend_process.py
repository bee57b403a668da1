"""A front-end process of ``trtserve serve`` (started by :mod:`trtserve.serving.supervisor`)."""

from __future__ import annotations

import asyncio
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtserve.serving.settings import ServeConfig


def frontend_main(config: ServeConfig, address: str, port: int, http_socket: socket.socket | None, index: int,
                  conn: Connection) -> None:
    """Serve gRPC on ``config.host:port`` (SO_REUSEPORT, steered to the server's
    ``config.frontends`` front ends) and, unless ``http_socket`` is None, HTTP on that listening
    socket (the supervisor's, shared by every front end) for the engine core at ``address``
    until SIGTERM, then drain. Reports ``("bound", port, http port or None)`` once listening,
    or ``("refused", line)`` when the gRPC address cannot be bound, and ``("ready",)`` once the
    model table has arrived and the handlers are loaded."""
    from trtserve import logs
    from trtserve.serving.settings import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides what a Ctrl-C means
    logs.configure(config.log_level, config.log_format, config.log_requests)
    asyncio.run(_frontend(config, address, port, http_socket, index, conn))


async def _frontend(config: ServeConfig, address: str, port: int, http_socket: socket.socket | None, index: int,
                    conn: Connection) -> None:
    from trtserve.clock import MonotonicClock
    from trtserve.frontend.doors import open_doors
    from trtserve.ipc.client import EngineClient

    engine = EngineClient(address, index)
    await engine.connect()
    pool = ThreadPoolExecutor(config.cpu_workers, thread_name_prefix="cpu")
    http_port = http_socket.getsockname()[1] if http_socket is not None else None
    try:
        doors = await open_doors(engine, MonotonicClock(), pool, host=config.host, port=port, http_port=http_port,
                                 reuse_port=True, frontends=config.frontends, http_socket=http_socket, index=index,
                                 http_limits=config.http_limits, **config.frontend)
    except RuntimeError as exc:  # the address is taken: the supervisor prints it and exits 2
        conn.send(("refused", str(exc)))
        await engine.aclose()
        pool.shutdown(wait=False)
        return
    conn.send(("bound", doors.grpc_port, doors.http_port))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    loaded = asyncio.ensure_future(doors.state.loaded())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((loaded, stopped), return_when=asyncio.FIRST_COMPLETED)
    if loaded.done():
        loaded.result()
        conn.send(("ready",))
    await stopped
    await doors.drain(config.grace)
    if not loaded.done():
        loaded.cancel()
    await engine.aclose()
    pool.shutdown(wait=False)
