"""One front end's doors: the gRPC server and, when asked for, the HTTP server and the Redis
queue door, over one :class:`~trtserve.frontend.state.FrontendState` (one set of served models,
one in-flight gate, one drain)."""

from __future__ import annotations

import socket
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from trtserve.clock import Clock
from trtserve.frontend.drain import drain
from trtserve.frontend.grpc.server import start_frontend
from trtserve.frontend.grpc.service import InferenceService
from trtserve.frontend.http.protocol import HttpLimits
from trtserve.frontend.http.server import HttpServer, start_http
from trtserve.frontend.queue.door import HEALTH_NAME, QueueDoor, QueueSettings
from trtserve.frontend.state import DEFAULT_MAX_MESSAGE_BYTES, FrontendState
from trtserve.ipc.engine import Engine


@dataclass
class Doors:
    """The running doors of one front end.

    Attributes:
        grpc: the ``grpc.aio`` server; ``service``: its inference service.
        grpc_port: the gRPC port bound.
        http: the HTTP server, or None (``--allow-http`` not given).
        queue: the Redis queue door, or None (``--redis-url`` not given).
    """

    grpc: grpc.aio.Server
    service: InferenceService
    grpc_port: int
    http: HttpServer | None
    queue: QueueDoor | None = None

    @property
    def state(self) -> FrontendState:
        """The front end's served models, gate and request path."""
        return self.service.state

    @property
    def http_port(self) -> int | None:
        """The HTTP port bound, or None."""
        return self.http.port if self.http is not None else None

    async def drain(self, grace: float) -> None:
        """Graceful shutdown of every door (:func:`~trtserve.frontend.drain.drain`)."""
        servers = [self.grpc, *(door for door in (self.http, self.queue) if door is not None)]
        await drain(servers, self.state, grace)


async def open_doors(engine: Engine, clock: Clock, pool: Executor, *, host: str, port: int, http_port: int | None,
                     reuse_port: bool = False, frontends: int = 1, http_socket: socket.socket | None = None,
                     http_limits: HttpLimits | None = None, queue: QueueSettings | None = None,
                     index: int = 0, **options: Any) -> Doors:
    """Start the gRPC door on ``host:port``; unless ``http_port`` is None, the HTTP door on
    ``host:http_port`` (0: a free port), both answering at once (not ready until the state loads);
    and with ``queue``, the queue door, which reads each model's stream once the state serves it.

    Args:
        reuse_port, frontends: the gRPC port is shared with the other front ends of this server,
            ``frontends`` in all (:func:`~trtserve.frontend.grpc.server.start_frontend`); the
            HTTP port too, unless ``http_socket``.
        http_socket: the HTTP door's listening socket, made once for all the front ends (the
            way no other process can join the port); default: bind ``host:http_port`` here.
        http_limits: the HTTP door's bounds on each connection (default: :class:`HttpLimits`'s).
        options: the keyword arguments of :func:`~trtserve.frontend.grpc.server.start_frontend`
            (limits, TLS, auth); the HTTP door takes the receive limit as its body limit, and the
            same TLS and bearer token.
        queue, index: the queue door's settings, and this front end's number (its consumer name).

    Raises:
        RuntimeError: an address cannot be bound.
        ValueError: an option out of range, or TLS for the HTTP door not read from files.
    """
    server, service, bound = await start_frontend(engine, clock, pool, host=host, port=port, reuse_port=reuse_port,
                                                  frontends=frontends, **options)
    http = None
    if http_port is not None:
        limit = options.get("max_receive_bytes") or options.get("max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES
        http = await start_http(service.state, host=host, port=http_port, reuse_port=reuse_port, sock=http_socket,
                                max_body_bytes=limit, tls=options.get("tls"), auth_token=options.get("auth_token"),
                                auth_health=options.get("auth_health", False), limits=http_limits)
    door = None
    if queue is not None:
        door = QueueDoor(service.state, queue, index)

        async def publish(ok: bool) -> None:
            serving = ok and service.serving
            await service.health.set(HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING if serving
                                     else health_pb2.HealthCheckResponse.NOT_SERVING)

        door.health_hooks.append(publish)
        await publish(False)
    return Doors(server, service, bound, http, door)


__all__ = ["Doors", "open_doors"]
