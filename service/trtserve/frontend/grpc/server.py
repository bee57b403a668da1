"""One front end's ``grpc.aio`` server: the inference, ModelControl, Tokenizer, health and reflection
services on one port, shared with the other front ends (SO_REUSEPORT: the kernel spreads
*connections* over them, steered to this server's own sockets by
:mod:`~trtserve.frontend.grpc.reuseport`; every request of one HTTP/2 connection stays in one
front end), and its keepalive and ping policy (:class:`Keepalive`)."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve._proto.trtserve.v1 import control_pb2, control_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from trtserve.clock import Clock
from trtserve.frontend.grpc.model_control import ModelControlService
from trtserve.frontend.grpc.reuseport import steer_port
from trtserve.frontend.grpc.security import BearerTokenInterceptor, TlsConfig
from trtserve.frontend.grpc.service import DEFAULT_STREAM_INFLIGHT, SERVICE_NAME, InferenceService
from trtserve.frontend.grpc.tokenizer import TokenizerService
from trtserve.frontend.state import AUTO, DEFAULT_MAX_MESSAGE_BYTES, FrontendState
from trtserve.ipc.engine import Engine

CONTROL_SERVICE_NAME = control_pb2.DESCRIPTOR.services_by_name["ModelControl"].full_name
TOKENIZER_SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name


@dataclass(frozen=True)
class Keepalive:
    """HTTP/2 keepalive and the ping policy of the gRPC server (Triton's ``--grpc-keepalive-*``
    and ``--grpc-http2-*`` flags; times in ms). The defaults accept client pings every 5 s or
    more, with or without a call in progress, so a client or load balancer that pings every
    10 s keeps long calls and idle streams open (gRPC's own default refuses pings more often
    than every 5 minutes without data: after ``max_ping_strikes`` it ends every call on the
    connection UNAVAILABLE "Too many pings").

    Attributes:
        time_ms: how often the server pings an idle connection.
        timeout_ms: how long it waits for the ping's answer before closing the connection.
        permit_without_calls: accept (and send) pings on a connection with no call in progress.
        max_pings_without_data: pings the server may send without data in between (0: any number).
        min_recv_ping_interval_without_data_ms: the shortest interval between client pings it
            accepts while no data is sent; a faster ping is a strike.
        max_ping_strikes: strikes before the server ends the connection (GOAWAY; 0: never).
    """

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = True
    max_pings_without_data: int = 0
    min_recv_ping_interval_without_data_ms: int = 5_000
    max_ping_strikes: int = 2

    def __post_init__(self) -> None:
        for name in ("time_ms", "timeout_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"keepalive {name} must be > 0 ms, got {getattr(self, name)}")
        for name in ("max_pings_without_data", "min_recv_ping_interval_without_data_ms", "max_ping_strikes"):
            if getattr(self, name) < 0:
                raise ValueError(f"keepalive {name} must be >= 0, got {getattr(self, name)}")

    def options(self) -> list[tuple[str, int]]:
        """The ``grpc.aio.server`` channel arguments."""
        return [
            ("grpc.keepalive_time_ms", self.time_ms),
            ("grpc.keepalive_timeout_ms", self.timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", self.min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
        ]

    def describe(self) -> str:
        """The policy in one sentence for the start-up log, naming the flag behind each number.

        It says what a refusal looks like, because trtserve cannot log one when it happens:
        grpc core ends the connection (GOAWAY ENHANCE_YOUR_CALM ``too_many_pings``) without
        telling the Python server, and its only record of it is a debug trace
        (``GRPC_TRACE=http``, or ``http_keepalive``'s per-ping lines) that also writes a line per
        call (docs/guide/operating.md, "Keepalive").
        """
        idle = ("also with no call in progress" if self.permit_without_calls
                else "with no call in progress any ping within 2 h is a strike")
        if self.max_ping_strikes:
            refusal = (f"once more than {self.max_ping_strikes} come sooner (--grpc-http2-max-ping-strikes) it ends "
                       "the connection with GOAWAY ENHANCE_YOUR_CALM 'too_many_pings' (the client's calls end "
                       "UNAVAILABLE 'Too many pings'; gRPC does not tell trtserve, which logs nothing then)")
        else:
            refusal = "faster ones are never refused (--grpc-http2-max-ping-strikes 0)"
        return (f"gRPC ping policy: client pings accepted every {self.min_recv_ping_interval_without_data_ms} ms "
                f"or more while no data flows (--grpc-http2-min-recv-ping-interval-without-data), {idle} "
                f"(--grpc-keepalive-permit-without-calls {str(self.permit_without_calls).lower()}); {refusal}; "
                f"the server pings an idle connection every {self.time_ms} ms (--grpc-keepalive-time) and closes "
                f"it when a ping goes {self.timeout_ms} ms unanswered (--grpc-keepalive-timeout)")


async def start_frontend(
    engine: Engine,
    clock: Clock,
    pool: Executor,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    reuse_port: bool = False,
    frontends: int = 1,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_receive_bytes: int | None = None,
    stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
    max_request_elements: int | None = None,
    max_inflight_rpcs: int | str | None = None,
    max_concurrent_streams: int | None = None,
    tls: TlsConfig | None = None,
    auth_token: str | None = None,
    auth_health: bool = False,
    keepalive: Keepalive | None = None,
) -> tuple[grpc.aio.Server, InferenceService, int]:
    """Start a front end's ``grpc.aio`` server on ``host:port`` (0: an ephemeral port).

    It answers at once (health NOT_SERVING, requests UNAVAILABLE "still loading") until
    ``service.state.loaded()`` has run. Returns the server, the service and the bound port.

    Args:
        engine: the connection to the engine core (connected).
        pool: executor for the handlers' pre/post-processing.
        reuse_port: bind with SO_REUSEPORT, so that other front ends can listen on the same port;
            without it (one front end) no other process can bind the port while it serves.
        frontends: with ``reuse_port``, how many front ends of this server share the port: new
            connections go to the first ``frontends`` sockets of the port's group only
            (:func:`~trtserve.frontend.grpc.reuseport.steer_port`), not to a later socket of
            another process.
        max_message_bytes: the largest response (a larger one fails alone with
            RESOURCE_EXHAUSTED) and, unless ``max_receive_bytes``, the largest request.
        max_receive_bytes: the largest request message (gRPC refuses a larger one with
            RESOURCE_EXHAUSTED before it is read); default ``max_message_bytes``.
        max_request_elements: most elements one request may declare over its inputs
            (default: the receive limit, which no valid request can exceed).
        max_inflight_rpcs: most inference requests in progress at once (unary calls and
            stream messages; health, metadata, statistics and model control never count and
            are never refused): one more is refused RESOURCE_EXHAUSTED before its tensors are
            decoded (:class:`~trtserve.frontend.inflight.InflightGate`); ``"auto"``: measured
            capacity × useful wait of the models served (:mod:`trtserve.batching.capacity`),
            recomputed when they change; ``None`` or 0: no bound.
        max_concurrent_streams: HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS`` of each connection
            (grpc's ``grpc.max_concurrent_streams``): a client keeps a call beyond it waiting on its
            side until one of the connection's calls ends, so the server spends nothing on it;
            ``None`` or 0: grpc's own default (no limit).
        tls: serve TLS (mutual TLS when it has a client CA) instead of plaintext.
        auth_token: require ``authorization: Bearer <token>`` on every call, except health
            checking and reflection unless ``auth_health``.
        keepalive: the keepalive and ping policy (default :class:`Keepalive`'s).

    Raises:
        RuntimeError: the address cannot be bound (``cannot listen on HOST:PORT (gRPC): ...``).
        ValueError: ``max_inflight_rpcs`` is neither a count >= 0 nor "auto", or
            ``max_concurrent_streams`` is below 0.
    """
    counted = max_inflight_rpcs is None or (isinstance(max_inflight_rpcs, int) and max_inflight_rpcs >= 0)
    if max_inflight_rpcs != AUTO and not counted:
        raise ValueError(f"max_inflight_rpcs must be a count >= 0 or 'auto', got {max_inflight_rpcs!r}")
    if max_concurrent_streams is not None and max_concurrent_streams < 0:
        raise ValueError(f"max_concurrent_streams must be >= 0 (0: no limit), got {max_concurrent_streams}")
    max_receive_bytes = max_receive_bytes or max_message_bytes
    options = [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        *(keepalive or Keepalive()).options(),
        *((("grpc.max_concurrent_streams", max_concurrent_streams),) if max_concurrent_streams else ()),
    ]
    interceptors = [BearerTokenInterceptor(auth_token, protect_health=auth_health)] if auth_token else []
    state = FrontendState(engine, clock, pool, max_send_bytes=max_message_bytes,
                          max_request_elements=max_request_elements or max_receive_bytes,
                          max_inflight=max_inflight_rpcs)
    service = InferenceService(state, stream_inflight=stream_inflight)

    server = grpc.aio.server(options=options, interceptors=interceptors)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    control_pb2_grpc.add_ModelControlServicer_to_server(ModelControlService(engine, service._call), server)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(TokenizerService(state, service._call), server)
    health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, CONTROL_SERVICE_NAME, TOKENIZER_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
        server,
    )
    address = f"{host}:{port}"
    try:  # grpcio raises "Failed to bind ..." (older versions returned 0), without the reason
        bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise RuntimeError(f"cannot listen on {address} (gRPC): the address is in use or not available here")
    await service.update_health()
    await server.start()
    if reuse_port and frontends > 1:
        steer_port(bound, frontends)
    return server, service, bound
