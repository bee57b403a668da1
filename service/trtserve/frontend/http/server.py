"""One front end's HTTP server: uvicorn (httptools) inside the front end's own asyncio loop,
serving :class:`~trtserve.frontend.http.app.RestApp`, over HTTPS when given the gRPC door's
:class:`~trtserve.frontend.grpc.security.TlsConfig` (uvicorn's own ``ssl_*`` settings), every
connection bounded by :class:`~trtserve.frontend.http.protocol.HttpLimits` (uvicorn's httptools
protocol with the timers and limits it lacks, :mod:`trtserve.frontend.http.protocol`).

uvicorn's ``Server.startup``/``shutdown`` run on the running loop, so the HTTP door shares the
process, the loop and the :class:`~trtserve.frontend.state.FrontendState` of the gRPC door
(its served models, in-flight gate and drain). ``Server.serve`` is not used: it installs its
own SIGINT/SIGTERM handlers, and the front end's drain decides what a signal means. The
listening socket is made here (:func:`listening_socket`) or handed in: ``trtserve serve`` with
several front ends makes one, without SO_REUSEPORT, and every front end accepts on it, so no
other process can bind the HTTP port while the server runs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from functools import partial
from typing import Any

import uvicorn

from trtserve.frontend.grpc.security import TlsConfig
from trtserve.frontend.http.app import RestApp
from trtserve.frontend.http.hold import TransportHold
from trtserve.frontend.http.protocol import BoundedProtocol, HttpLimits
from trtserve.frontend.state import FrontendState
from trtserve.frontend.window import ConcurrencyWindow

log = logging.getLogger(__name__)


class HttpServer:
    """A running HTTP door (see :func:`start_http`); :meth:`stop` is its drain's last step.

    Attributes:
        hold: its transport hold (None: ``--http-window 0``, or an application that is not the
            KServe one).
    """

    def __init__(self, server: uvicorn.Server, port: int, hold: TransportHold | None = None) -> None:
        self.server = server
        self.port = port
        self.hold = hold

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


def ssl_options(tls: TlsConfig | None) -> dict[str, Any]:
    """uvicorn's ``ssl_*`` settings for ``tls`` (none: plain HTTP): the certificate chain and
    key files, and with a client CA, ``CERT_REQUIRED`` against it (mutual TLS: a client without
    a certificate the CA signed fails the handshake, as on the gRPC door).

    Raises:
        ValueError: ``tls`` was not read from files (:meth:`TlsConfig.from_files`).
    """
    if tls is None:
        return {}
    if tls.files is None:
        raise ValueError("the HTTP door serves TLS from files: make the TlsConfig with TlsConfig.from_files")
    cert, key, client_ca = (str(path) if path else None for path in tls.files)
    options: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca:
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


async def start_http(state: FrontendState, *, host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False,
                     sock: socket.socket | None = None, max_body_bytes: int, tls: TlsConfig | None = None,
                     auth_token: str | None = None, auth_health: bool = False,
                     limits: HttpLimits | None = None) -> HttpServer:
    """Start the HTTP door of ``state`` on ``host:port`` (0: a free port), or on the listening
    socket ``sock`` (shared with other front ends; ``host``, ``port`` and ``reuse_port`` unused).

    Args:
        max_body_bytes: the largest request body (413 beyond it).
        tls: serve HTTPS (mutual TLS when it has a client CA) instead of plain HTTP
            (:func:`ssl_options`).
        auth_token, auth_health: as for the gRPC door (:class:`~trtserve.frontend.http.app.RestApp`).
        limits: the bounds on each connection (default: :class:`HttpLimits`'s defaults).

    Raises:
        RuntimeError: the address cannot be bound.
        ValueError: ``tls`` not read from files.
    """
    app = RestApp(state, max_body_bytes=max_body_bytes, auth_token=auth_token, auth_health=auth_health)
    limits = limits or HttpLimits()
    hold = None
    if limits.window != 0:
        clock = asyncio.get_running_loop().time
        window = (ConcurrencyWindow(clock) if limits.window is None
                  else ConcurrencyWindow(clock, start=limits.window, floor=limits.window, ceiling=limits.window))
        hold = TransportHold(window, app.holdable, app.expired)

        async def release() -> None:  # a drain answers what is held (503) instead of dropping it
            hold.release_all()

        state.drain_hooks.append(release)
    if sock is None:
        sock = listening_socket(host, port, reuse_port=reuse_port)
    return await serve_asgi(app, sock, limits, hold, **ssl_options(tls))


async def serve_asgi(app: Any, sock: socket.socket, limits: HttpLimits | None = None,
                     hold: TransportHold | None = None, **options: Any) -> HttpServer:
    """Serve the ASGI ``app`` on the listening ``sock`` with uvicorn (httptools bounded by
    ``limits``, default :class:`HttpLimits`'s defaults, inference requests through ``hold`` if
    given; no lifespan, no access log, no Server or Date header) on the running loop; ``options``
    are more ``uvicorn.Config`` settings (TLS). The door of :func:`start_http`, and the bench's
    null server's, so that both pay the same per call.

    Raises:
        ValueError, OSError: uvicorn refused ``options`` (a TLS file it cannot load).
    """
    # log_config None: uvicorn's loggers propagate to the root one trtserve.logs configured
    # (--log-format json included) instead of uvicorn's own text handlers.
    protocol = partial(BoundedProtocol, limits=limits or HttpLimits(), hold=hold)
    config = uvicorn.Config(app, loop="none", http=protocol, lifespan="off", access_log=False, log_config=None,
                            log_level="warning", server_header=False, date_header=False, **options)
    config.load()  # with TLS, makes the SSLContext (the files were checked by TlsConfig.from_files)
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)  # set by Server._serve, which is not used (lifespan "off")
    await server.startup(sockets=[sock])
    return HttpServer(server, sock.getsockname()[1], hold)


__all__ = ["HttpServer", "listening_socket", "serve_asgi", "ssl_options", "start_http"]
