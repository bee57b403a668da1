"""One front end's HTTP server: uvicorn (httptools) inside the front end's own asyncio loop,
serving :class:`~trtserve.frontend.http.app.RestApp`.

uvicorn's ``Server.startup``/``shutdown`` run on the running loop, so the HTTP door shares the
process, the loop and the :class:`~trtserve.frontend.state.FrontendState` of the gRPC door
(its served models, in-flight gate and drain). ``Server.serve`` is not used: it installs its
own SIGINT/SIGTERM handlers, and the front end's drain decides what a signal means. The
listening socket is made here (:func:`listening_socket`) or handed in: ``trtserve serve`` with
several front ends makes one, without SO_REUSEPORT, and every front end accepts on it, so no
other process can bind the HTTP port while the server runs.
"""

from __future__ import annotations

import logging
import socket

import uvicorn

from trtserve.frontend.http.app import RestApp
from trtserve.frontend.state import FrontendState

log = logging.getLogger(__name__)


class HttpServer:
    """A running HTTP door (see :func:`start_http`); :meth:`stop` is its drain's last step."""

    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self.server = server
        self.port = port

    async def stop(self, grace: float | None) -> None:
        """Close the listener and the idle connections; a request still being written gets
        ``grace`` seconds (the drain has answered every admitted request already)."""
        self.server.config.timeout_graceful_shutdown = grace
        await self.server.shutdown()


def listening_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), listening.

    Raises:
        RuntimeError: the address cannot be bound (the message names it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it a response's body write waits for the ACK of its header write (Nagle against the
    # client's delayed ACK: 40 ms a request on a kept-alive connection).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port} (HTTP): {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def start_http(state: FrontendState, *, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False,
                     sock: socket.socket | None = None, max_body_bytes: int, auth_token: str | None = None,
                     auth_health: bool = False) -> HttpServer:
    """Start the HTTP door of ``state`` on ``host:port`` (0: a free port), or on the listening
    socket ``sock`` (shared with other front ends; ``host``, ``port`` and ``reuse_port`` unused).

    Args:
        max_body_bytes: the largest request body (413 beyond it).
        auth_token, auth_health: as for the gRPC door (:class:`~trtserve.frontend.http.app.RestApp`).

    Raises:
        RuntimeError: the address cannot be bound.
    """
    app = RestApp(state, max_body_bytes=max_body_bytes, auth_token=auth_token, auth_health=auth_health)
    config = uvicorn.Config(app, loop="none", http="httptools", lifespan="off", access_log=False,
                            log_level="warning", server_header=False, date_header=False,
                            h11_max_incomplete_event_size=max_body_bytes)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)  # set by Server._serve, which is not used (lifespan "off")
    if sock is None:
        sock = listening_socket(host, port, reuse_port=reuse_port)
    await server.startup(sockets=[sock])
    return HttpServer(server, sock.getsockname()[1])


__all__ = ["HttpServer", "listening_socket", "start_http"]
