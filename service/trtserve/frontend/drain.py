"""Graceful shutdown of one front end, whatever its transport: stop admitting, answer
everything admitted within the grace period, then stop the server."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import Protocol

from trtserve.clock import Clock
from trtserve.frontend.inflight import InflightGate

log = logging.getLogger(__name__)

FINAL_WRITE_S = 0.5
"""After the grace ran out, how long the UNAVAILABLE answers get to be written before the server
stops (seconds)."""
FINAL_STOP_S = 5.0
"""Once all is answered, the longest the server waits for the last writes before it stops
(seconds)."""


class Stoppable(Protocol):
    """A transport's server: ``grpc.aio.Server``, or an HTTP server with the same ``stop``."""

    async def stop(self, grace: float | None) -> None:
        """Stop serving: calls still running get ``grace`` seconds (``None``: no limit)."""
        ...


class Drainable(Protocol):
    """What :func:`drain` needs of a front end's service."""

    inflight: InflightGate
    clock: Clock

    async def begin_drain(self) -> None:
        """Stop admitting (ServerReady false, health NOT_SERVING, new requests UNAVAILABLE)."""
        ...


async def drain(servers: Sequence[Stoppable], service: Drainable, grace: float) -> None:
    """Graceful shutdown of one front end, within ``grace`` seconds:

    1. at once: ServerReady false, health NOT_SERVING, new calls and new stream messages
       UNAVAILABLE (never NOT_FOUND: models stay loaded); ServerLive stays true;
    2. every admitted request, unary or inside a stream, is answered; each stream ends OK
       after its last answer;
    3. if the grace runs out first, the requests still in progress are answered UNAVAILABLE;
    4. then each of ``servers`` (its doors) stops, with a short grace for the last writes.

    The engine core keeps serving meanwhile; the supervisor closes it once every front end
    has drained.
    """
    clock, gate = service.clock, service.inflight
    end = clock.now() + grace if math.isfinite(grace) else math.inf

    def left() -> float | None:
        return None if end == math.inf else max(0.0, end - clock.now())

    await service.begin_drain()
    if not await gate.wait_quiet(left()):
        log.warning("grace period of %.1f s ran out: %d request(s) answered UNAVAILABLE", grace, gate.abandon())
        await gate.wait_quiet(FINAL_WRITE_S)
    # Everything admitted is answered: what is left is writing the last stream messages
    # (and open health Watch calls, which never end by themselves), so a short stop.
    remaining = left()
    grace_left = (
        FINAL_STOP_S if remaining is None else min(max(remaining, FINAL_WRITE_S), FINAL_STOP_S)
    )
    await asyncio.gather(*(server.stop(grace_left) for server in servers))


__all__ = ["FINAL_STOP_S", "FINAL_WRITE_S", "Drainable", "Stoppable", "drain"]
