"""A port belongs to one server: the claim ``trtserve serve`` takes on each address it serves
before it listens, and the one-line refusal when the address is taken.

Two checks, in this order (both made for every fixed ``--port``, ``--http-port`` and
``--metrics-port``; for a gRPC or HTTP port 0 the claim is taken once the port is bound):

1. **The claim**: a Linux abstract unix socket named for the address (``\\0trtserve:HOST:PORT``),
   bound and listening for the server's life. Binding it is atomic, so of two servers started at
   the same moment on one address exactly one wins; the kernel frees it when the process ends,
   however it ends (nothing to clean up). The loser learns the winner's pid by connecting to it
   (``SO_PEERCRED``). The name lives in the network namespace, so it guards every trtserve of
   any user on this host (or container).
2. **The probe**: a plain bind of the address (no ``SO_REUSEPORT``), which fails while any other
   process listens there, trtserve or not.

Neither stops a process that binds *after* the server with ``SO_REUSEPORT`` (gRPC's default):
what decides that is whether the server's own listening sockets carry ``SO_REUSEPORT`` (see
:mod:`trtserve.frontend.grpc.reuseport` and the port rule in docs/guide/operating.md).
"""

from __future__ import annotations

import socket
import struct


class PortInUse(RuntimeError):
    """An address the server was asked to listen on is taken; the message is the one line
    ``trtserve serve`` prints before it exits 2 (``cannot listen on HOST:PORT: ...``)."""


class PortClaim:
    """The claim on one ``host:port``, served by ``door`` (``"gRPC"``, ``"HTTP"``, ``"metrics"``: named in the
    refusal; see the module docstring); held until :meth:`release` or the process ends.

    Raises:
        PortInUse: another trtserve holds the claim (the message gives its pid).
    """

    def __init__(self, host: str, port: int, door: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0trtserve:{host}:{port}"
        try:
            self._sock.bind(name)
        except OSError:
            self._sock.close()
            raise PortInUse(f"cannot listen on {host}:{port} ({door}): another trtserve serves it"
                            f"{_holder(name)}") from None
        self._sock.listen(1)  # listening, so that a loser can ask who holds it (SO_PEERCRED)

    def release(self) -> None:
        """Give the address up (the server has stopped listening there)."""
        self._sock.close()


def _holder(name: str) -> str:
    """`` (pid N)`` for the process listening on the abstract socket ``name``, or ``""``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(name)
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return ""
    pid, _, _ = struct.unpack("3i", creds)
    return f" (pid {pid})"


def check_port_free(host: str, port: int, door: str) -> None:
    """Refuse an address some other process listens on: a plain bind (``SO_REUSEADDR`` only,
    so a port left in TIME_WAIT by the last run is not refused), closed at once.

    Raises:
        PortInUse: the bind failed (the message names the address and the reason).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUse(f"cannot listen on {host}:{port} ({door}): {exc.strerror or exc}") from None


def claim_ports(addresses: dict[str, tuple[str, int | None]]) -> list[PortClaim]:
    """Claim and probe every fixed address of ``addresses`` (door name → (host, port); port None
    and 0 are skipped: claim those with :class:`PortClaim` once bound). Returns the claims, to
    hold while serving.

    Raises:
        PortInUse: a port is claimed by another trtserve or held by any other process (the
            claims taken so far are released).
    """
    claims: list[PortClaim] = []
    try:
        for door, (host, port) in addresses.items():
            if port:
                claims.append(PortClaim(host, port, door))
                check_port_free(host, port, door)
    except PortInUse:
        for claim in claims:
            claim.release()
        raise
    return claims


__all__ = ["PortClaim", "PortInUse", "check_port_free", "claim_ports"]
