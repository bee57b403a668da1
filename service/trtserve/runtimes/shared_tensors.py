"""Tensors between the server and a Python model's worker process, over a
``multiprocessing`` pipe: numeric arrays in a shared memory block of each direction's own,
BYTES (object) arrays pickled in the message itself.

The writer (:class:`Arena`) copies a batch's numeric tensors into its block and sends a
:data:`Packet` saying where they are; when a batch outgrows the block it makes a larger one and
sends that block's descriptor right after the packet. The reader (:class:`Attachment`) maps the
block a descriptor names and copies each batch out. Blocks have no name in any file system (a
``memfd`` on Linux), so however the processes end nothing is left behind.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from multiprocessing import reduction
from multiprocessing.connection import Connection

import numpy as np

from trtserve.datatypes import Tensors

_ALIGN = 64  # bytes; every tensor in shared memory starts on a cache line

# Numeric tensors in shared memory: the byte size of a new block whose descriptor follows the
# packet on the pipe (0: the reader's current block), and per tensor (dtype, shape, byte
# offset); BYTES tensors travel in the packet itself (pickled).
Packet = tuple[int, dict[str, tuple[np.dtype, tuple[int, ...], int]], Tensors]


def send_with_fd(conn: Connection, message: object, fd: int | None) -> None:
    """Send ``message``, then (for a packet that names a new block) the block's descriptor."""
    try:
        conn.send(message)
        if fd is not None:
            reduction.send_handle(conn, fd, 0)  # the pid is used on Windows only
    finally:
        if fd is not None:
            os.close(fd)  # the peer has its own copy; the mapping keeps the memory


def _anonymous_block(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory with no name in any file system."""
    if hasattr(os, "memfd_create"):  # Linux
        fd = os.memfd_create("trtserve-tensors", os.MFD_CLOEXEC)
    else:
        with tempfile.TemporaryFile() as f:  # already unlinked
            fd = os.dup(f.fileno())
    os.ftruncate(fd, size)
    return fd


class Arena:
    """The writing side of one direction of a worker's shared memory: a grow-only block that
    holds one batch's numeric tensors back to back. A block it outgrows is unmapped at once
    (the reader's mapping stays valid until it moves on to the new block)."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def write(self, tensors: Tensors) -> tuple[Packet, int | None]:
        """Copy the numeric tensors into the block. Returns the packet that tells the reader
        where they are, and the descriptor of a new block to send after it (else ``None``)."""
        numeric = {name: arr for name, arr in tensors.items() if arr.dtype != np.dtype(object)}
        objects = {name: arr for name, arr in tensors.items() if name not in numeric}
        if not numeric:
            return (0, {}, objects), None
        layout: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        end = 0
        for name, arr in numeric.items():
            offset = -(-end // _ALIGN) * _ALIGN
            layout[name] = (arr.dtype, arr.shape, offset)
            end = offset + arr.nbytes
        fd = None
        if self._map is None or len(self._map) < end:
            size = max(end, 2 * (len(self._map) if self._map is not None else 0), 1 << 16)
            fd = _anonymous_block(size)
            self.close()
            self._map = mmap.mmap(fd, size)
        for name, (dtype, shape, offset) in layout.items():
            np.ndarray(shape, dtype, buffer=self._map, offset=offset)[...] = numeric[name]
        return (len(self._map) if fd is not None else 0, layout, objects), fd

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class Attachment:
    """The reading side: maps the writer's current block and copies each batch out of it."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def read(self, packet: Packet, conn: Connection) -> Tensors:
        """The packet's tensors as read-only arrays of their own (the block is reused next
        batch); a new block's descriptor is read from ``conn`` first.

        Raises:
            EOFError, OSError: the writer went away before the descriptor came.
        """
        size, layout, objects = packet
        if size:
            fd = reduction.recv_handle(conn)
            try:
                self.close()
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        tensors = dict(objects)
        for tname, (dtype, shape, offset) in layout.items():
            assert self._map is not None
            tensors[tname] = np.ndarray(shape, dtype, buffer=self._map, offset=offset).copy()
        for arr in tensors.values():
            arr.flags.writeable = False
        return tensors

    def close(self) -> None:
        """Drop the mapping (the memory goes once the writer has dropped it too)."""
        if self._map is not None:
            self._map.close()
            self._map = None
