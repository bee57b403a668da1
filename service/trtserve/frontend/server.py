"""One front end's ``grpc.aio`` server: the inference, ModelControl, health and reflection
services on one port, shared with the other front ends (SO_REUSEPORT: the kernel spreads
*connections* over them; every request of one HTTP/2 connection stays in one front end)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .._proto.inference import grpc_service_pb2_grpc as pb_grpc
from .._proto.trtserve.v1 import control_pb2, control_pb2_grpc
from ..clock import Clock
from .control import ModelControlService
from .engine_client import Engine
from .security import BearerTokenInterceptor, TlsConfig
from .service import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_STREAM_INFLIGHT, SERVICE_NAME, InferenceService

CONTROL_SERVICE_NAME = control_pb2.DESCRIPTOR.services_by_name["ModelControl"].full_name


AUTO = "auto"
"""``max_inflight_rpcs``: derive the bound from the models' measured capacity once they are loaded."""
HANDOVER_GRACE_S = 5.0
"""How long calls still running on the loading server get once the bounded one listens."""

log = logging.getLogger(__name__)


class FrontendServer:
    """A front end's ``grpc.aio`` server, as :func:`start_frontend` made it.

    With ``max_inflight_rpcs="auto"`` the bound needs the models' measured run times, and grpc
    fixes ``maximum_concurrent_rpcs`` when a server is made; so the port is first served
    without a bound (health NOT_SERVING while the models load), and once the engine core has
    loaded them, if they give a bound (:func:`~trtserve.batching.capacity.inflight_bound`), a
    second server with it starts on the same port (SO_REUSEPORT) and the first one stops: its
    connections get GOAWAY and clients reconnect to the new one. :attr:`bounded` is set once
    this is settled.

    Attributes:
        server: the server listening now.
        limit: its ``maximum_concurrent_rpcs`` (``None``: unbounded).
        bounded: set once the server with its final bound listens.
    """

    def __init__(self, make: Callable[[int | None], grpc.aio.Server], limit: int | None) -> None:
        self._make = make
        self.server = make(limit)
        self.limit = limit
        self.bounded = asyncio.Event()
        self._made = [self.server]  # every server made here: stop() stops them all
        self._handover: asyncio.Task[None] | None = None

    async def stop(self, grace: float | None) -> None:
        """Stop serving (``grpc.aio.Server.stop`` of the server listening now, and of one still
        handing over or being handed over to)."""
        if self._handover is not None:
            self._handover.cancel()
            await asyncio.gather(self._handover, return_exceptions=True)
        await asyncio.gather(*(server.stop(grace) for server in self._made))

    def hand_over_when_loaded(self, engine: Engine) -> None:
        """Once ``engine`` has loaded its models, serve with the bound they give."""
        self._handover = asyncio.ensure_future(self._hand_over(engine))

    async def _hand_over(self, engine: Engine) -> None:
        await engine.loaded.wait()
        limit = await engine.query("inflight_bound")
        if limit is None:
            log.info("front end: no bound on RPCs in flight (a model admits requests without a deadline "
                     "into an unbounded queue: set default_timeout or max_queue_size, or --max-inflight-rpcs)")
            self.bounded.set()
            return
        bounded = self._make(limit)
        self._made.append(bounded)
        await bounded.start()
        loading, self.server, self.limit = self.server, bounded, limit
        self.bounded.set()
        log.info("front end: at most %d RPCs in flight (measured capacity x longest default timeout)", limit)
        await loading.stop(HANDOVER_GRACE_S)
        self._made.remove(loading)


async def start_frontend(
    engine: Engine,
    clock: Clock,
    pool: Executor,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    reuse_port: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_receive_bytes: int | None = None,
    stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
    max_request_elements: int | None = None,
    max_inflight_rpcs: int | str | None = None,
    tls: TlsConfig | None = None,
    auth_token: str | None = None,
    auth_health: bool = False,
) -> tuple[FrontendServer, InferenceService, int]:
    """Start a front end's ``grpc.aio`` server on ``host:port`` (0: an ephemeral port).

    It answers at once (health NOT_SERVING, requests UNAVAILABLE "still loading") until
    ``service.loaded()`` has run. Returns the server, the service and the bound port.

    Args:
        engine: the connection to the engine core (connected).
        pool: executor for the handlers' pre/post-processing.
        reuse_port: bind with SO_REUSEPORT, so that other front ends can listen on the same port.
        max_message_bytes: the largest response (a larger one fails alone with
            RESOURCE_EXHAUSTED) and, unless ``max_receive_bytes``, the largest request.
        max_receive_bytes: the largest request message (gRPC refuses a larger one with
            RESOURCE_EXHAUSTED before it is read); default ``max_message_bytes``.
        max_request_elements: most elements one request may declare over its inputs
            (default: the receive limit, which no valid request can exceed).
        max_inflight_rpcs: most RPCs in progress at once (grpc's ``maximum_concurrent_rpcs``:
            one more is answered RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!" by grpc
            itself, before Python reads it; a stream counts as one RPC however many messages
            it carries, and so does an open health Watch); ``"auto"``: measured capacity ×
            useful wait (:mod:`trtserve.batching.capacity`), see :class:`FrontendServer`;
            ``None`` or 0: no bound.
        tls: serve TLS (mutual TLS when it has a client CA) instead of plaintext.
        auth_token: require ``authorization: Bearer <token>`` on every call, except health
            checking and reflection unless ``auth_health``.

    Raises:
        RuntimeError: the address cannot be bound.
        ValueError: ``max_inflight_rpcs`` is neither a count >= 0 nor "auto".
    """
    auto = max_inflight_rpcs == AUTO
    if not auto and not (max_inflight_rpcs is None or (isinstance(max_inflight_rpcs, int) and max_inflight_rpcs >= 0)):
        raise ValueError(f"max_inflight_rpcs must be a count >= 0 or 'auto', got {max_inflight_rpcs!r}")
    max_receive_bytes = max_receive_bytes or max_message_bytes
    options = [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port or auto else 0),
    ]
    interceptors = [BearerTokenInterceptor(auth_token, protect_health=auth_health)] if auth_token else []
    service = InferenceService(
        engine,
        clock,
        pool,
        max_send_bytes=max_message_bytes,
        stream_inflight=stream_inflight,
        max_request_elements=max_request_elements or max_receive_bytes,
    )
    bound = port

    def make(limit: int | None) -> grpc.aio.Server:
        nonlocal bound
        server = grpc.aio.server(options=options, interceptors=interceptors, maximum_concurrent_rpcs=limit or None)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
        control_pb2_grpc.add_ModelControlServicer_to_server(ModelControlService(engine, service._call), server)
        health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, CONTROL_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = f"{host}:{bound}"
        bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
        if bound == 0:
            raise RuntimeError(f"cannot listen on {address}")
        return server

    frontend = FrontendServer(make, None if isinstance(max_inflight_rpcs, str) else max_inflight_rpcs or None)
    await service.update_health()
    await frontend.server.start()
    if auto:
        frontend.hand_over_when_loaded(engine)
    else:
        frontend.bounded.set()
    return frontend, service, bound
