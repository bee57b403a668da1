"""Transport security and caller authentication for the gRPC server (part of the gRPC layer;
the HTTP door takes the same :class:`TlsConfig`).

* :class:`TlsConfig`: server certificate and key (TLS), plus a client CA that makes the server
  demand and verify client certificates (mutual TLS).
* :class:`BearerTokenInterceptor`: a ``grpc.aio`` server interceptor that answers
  UNAUTHENTICATED unless the call carries ``authorization: Bearer <token>``. Health checking
  and reflection stay open unless asked otherwise, so that load balancers and ``grpcurl list``
  work without the secret.

The CLI reads files and environment variables; nothing here reads the environment.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# Methods under these prefixes stay open unless ``protect_health`` is set.
OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


@dataclass(frozen=True)
class TlsConfig:
    """PEM material for a TLS listener (the gRPC door's; the HTTP door's too).

    Attributes:
        cert: the server's certificate chain (PEM).
        key: the server's private key (PEM).
        client_ca: CA certificates (PEM) that client certificates must chain to; when set the
            server requires a client certificate (mutual TLS) and refuses the handshake without one.
        files: the (cert, key, client CA) files the PEM was read from (:meth:`from_files`), or
            None; the HTTP door needs them (uvicorn, like :mod:`ssl`, loads a certificate chain
            from files only).
    """

    cert: bytes
    key: bytes
    client_ca: bytes | None = None
    files: tuple[Path, Path, Path | None] | None = None

    @classmethod
    def from_files(cls, cert: Path, key: Path, client_ca: Path | None = None) -> TlsConfig:
        """Read the PEM files, checking that :mod:`ssl` loads them (the HTTP door loads them so,
        and gRPC would fail later with no file named).

        Raises:
            ValueError: a file cannot be read, or is not a PEM certificate chain, a key matching
                it, or CA certificates (the message names the file).
        """

        def read(path: Path) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc

        files = (Path(cert).absolute(), Path(key).absolute(), Path(client_ca).absolute() if client_ca else None)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(files[0], files[1])
        except ssl.SSLError as exc:
            raise ValueError(f"cannot load the TLS certificate {cert} with the key {key} (PEM, a key that matches "
                             f"the certificate): {exc.reason or exc}") from None
        try:
            if files[2] is not None:
                context.load_verify_locations(files[2])
        except ssl.SSLError as exc:
            raise ValueError(f"cannot load the CA certificates {client_ca} (PEM): {exc.reason or exc}") from None
        return cls(read(cert), read(key), read(client_ca) if client_ca else None, files)

    def credentials(self) -> grpc.ServerCredentials:
        """The ``grpc.ServerCredentials`` of this listener (requiring a client certificate
        when ``client_ca`` is set)."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.client_ca, require_client_auth=self.client_ca is not None
        )


def _denied(kind: str) -> Callable[..., Any]:
    message = "missing or invalid bearer token (send metadata 'authorization: Bearer <token>')"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator, as a streaming handler is

    return unary if kind == "unary" else streaming


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuse calls without ``authorization: Bearer <token>`` (constant-time comparison).

    Args:
        token: the shared secret (non-empty).
        protect_health: also require it for health checking and reflection.

    Raises:
        ValueError: an empty token.
    """

    def __init__(self, token: str, *, protect_health: bool = False) -> None:
        if not token:
            raise ValueError("the auth token is empty")
        self._expected = f"Bearer {token}".encode()
        self.protect_health = protect_health

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The call's handler, or one answering UNAUTHENTICATED when the token is missing or
        wrong (open methods pass unless ``protect_health``)."""
        method = details.method or ""
        if not self.protect_health and method.startswith(OPEN_PREFIXES):
            return await continuation(details)
        sent = next((v for k, v in (details.invocation_metadata or ()) if k == "authorization"), None)
        if isinstance(sent, str) and hmac.compare_digest(sent.encode(), self._expected):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers UNAUTHENTICATED."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_denied("unary"), des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_denied("stream"), des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_denied("unary"), des, ser)
    return grpc.stream_stream_rpc_method_handler(_denied("stream"), des, ser)
