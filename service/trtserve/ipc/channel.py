"""A ZeroMQ socket served by the running asyncio loop: one reader callback drains every message
that has arrived, with no future per message.

pyzmq's own asyncio sockets create and resolve a future for each receive and send, and at
thousands of messages a second that machinery takes a large share of the engine core's loop.
Here the socket's file descriptor wakes a drain that receives with ``NOBLOCK`` until nothing is
left and hands each message to a callback; sends never block (both ends set no high-water
mark, so a send only queues).

ZeroMQ's descriptor signals *changes* (edge-triggered): a send may consume the notification
of a message that arrived meanwhile, so after every send the socket's ``EVENTS`` is checked
and a drain scheduled if a message is waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq

log = logging.getLogger(__name__)

# Messages handled per drain before the loop gets a turn (so one busy peer cannot starve timers).
DRAIN_BATCH = 256
# As plain ints: pyzmq's enum members make every `&` and keyword a Python-level enum operation.
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def open_socket(kind: int) -> zmq.Socket:
    """A plain socket of ``kind`` (``zmq.ROUTER`` for the engine core, ``zmq.DEALER`` for a
    front end) with no high-water mark (a ROUTER drops messages past it; what is in flight is
    bounded by the front ends' admission instead) and no linger on close."""
    sock: zmq.Socket = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class Channel:
    """``socket`` (connected or bound) driven by the running loop.

    Args:
        socket: a plain (not asyncio) pyzmq socket.
        on_message: called on the loop with each received message's frames
            (``zmq.Frame`` objects: ``.buffer`` views the bytes without a copy); an exception
            is logged and the next message handled.
    """

    def __init__(self, socket: zmq.Socket, on_message: Callable[[list[zmq.Frame]], None]) -> None:
        self.socket = socket
        self.on_message = on_message
        self._loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))
        self._scheduled = False
        self._closed = False
        self._loop.add_reader(self._fd, self._drain)
        self._schedule()  # anything that arrived before the reader was added

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message (``bytes``, buffers or numpy arrays; buffers above pyzmq's copy
        threshold go without a copy). Never blocks."""
        if self._closed:
            return
        self.socket.send_multipart(frames, flags=_NOBLOCK, copy=False)
        if int(self.socket.getsockopt(_EVENTS)) & _POLLIN:
            self._schedule()

    def close(self) -> None:
        """Stop reading and close the socket (unsent messages are dropped)."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self.socket.close(linger=0)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        for _ in range(DRAIN_BATCH):
            try:
                frames = self.socket.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self.on_message(frames)
            except Exception:  # one bad message must not stop the others
                log.exception("a message on %s could not be handled",
                              self.socket.getsockopt_string(zmq.LAST_ENDPOINT))
        self._schedule()  # more may be waiting: continue after the loop's other work
