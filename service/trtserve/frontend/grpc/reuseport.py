"""Keep a shared gRPC port to the server's own front ends: a classic BPF program on the port's
``SO_REUSEPORT`` group that hands every new connection to one of the first N sockets of the
group, the N front ends of this server.

Why: grpcio's Python server cannot serve an inherited listening socket (its core can, through a
systemd socket or a passive listener, but the wheels are built without libsystemd and Python
exposes neither), so with two or more front ends each binds the port itself with
``SO_REUSEPORT``. Linux then lets any later socket of the same user with ``SO_REUSEPORT`` (every
grpc server by default) join the group without an error, and by default spreads connections
over all members by a hash. With this program (``SO_ATTACH_REUSEPORT_CBPF``, Linux >= 4.5, no
privilege needed) the kernel picks member ``random % N``; members are numbered in the order
they joined, so a socket that joins after the N front ends is never picked.

What remains (see the port rule, docs/guide/operating.md): a socket that joins while a front end is being
restarted can take that front end's number (the kernel moves the last member into a freed
place) and then gets its share of connections; the program is the group's, so another member
may replace it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct

log = logging.getLogger(__name__)

SO_ATTACH_REUSEPORT_CBPF = 51  # <asm-generic/socket.h>; not in Python's socket module
_SKF_AD_RANDOM = -0x1000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM (<linux/filter.h>): a random u32
_BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_ALU_MOD_K = 0x94  # BPF_ALU | BPF_MOD | BPF_K
_BPF_RET_A = 0x16  # BPF_RET | BPF_A


def steering_program(members: int) -> list[tuple[int, int, int, int]]:
    """The classic BPF program ``A = random; A %= members; return A`` as ``struct sock_filter``
    tuples ``(code, jt, jf, k)``; its return value is the index of the group member chosen.

    Raises:
        ValueError: ``members`` < 1.
    """
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    return [(_BPF_LD_W_ABS, 0, 0, _SKF_AD_RANDOM & 0xFFFFFFFF), (_BPF_ALU_MOD_K, 0, 0, members), (_BPF_RET_A, 0, 0, 0)]


def attach_steering(sock: socket.socket, members: int) -> None:
    """Attach :func:`steering_program` to the ``SO_REUSEPORT`` group of the listening ``sock``
    (it replaces the group's program, which every member shares).

    Raises:
        OSError: the kernel refused the program.
    """
    program = steering_program(members)
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *instruction) for instruction in program))
    fprog = struct.pack("HL", len(program), ctypes.addressof(code))  # struct sock_fprog; the kernel copies code
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def listening_sockets(port: int) -> list[socket.socket]:
    """This process's TCP sockets listening on ``port`` with ``SO_REUSEPORT`` (those the gRPC
    core made, found through ``/proc/self/fd``), as duplicates the caller closes."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed meanwhile (listdir's own fd, a racing close)
            continue
        try:
            if (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
                    and sock.getsockname()[1] == port):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def steer_port(port: int, members: int) -> None:
    """Steer the connections of the gRPC ``port`` to its first ``members`` sockets (this
    server's front ends), through this process's listening socket(s) on it. A failure is
    logged (the port still serves, unprotected), not raised."""
    sockets = listening_sockets(port)
    if not sockets:
        log.warning("port %d: no listening socket found to attach the reuseport program to: other processes "
                    "of this user can take connections from it", port)
    for sock in sockets:
        try:
            attach_steering(sock, members)
        except OSError as exc:
            log.warning("port %d: the kernel refused the reuseport program (%s): other processes of this user "
                        "can take connections from it", port, exc.strerror or exc)
        finally:
            sock.close()


__all__ = ["attach_steering", "listening_sockets", "steer_port", "steering_program"]
