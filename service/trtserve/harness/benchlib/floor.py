"""trtserve against the transport's floor: server CPU per call beside the null server's
(:mod:`.null_server`: grpcio and uvicorn parsing each request and answering a canned reply),
same callers, same run, per door. No clock, no I/O.

The ratio is the share of a call's CPU that trtserve's own code adds to the transport's; the
targets: at most :data:`FLOOR_RATIO` × on each door for the small model, and a stream message
at most :data:`STREAM_RATIO` × a unary call.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtserve.harness.benchlib.compare import SWEEP_MODE, quotient
from trtserve.harness.benchlib.protocols import HTTP_MODE
from trtserve.harness.benchlib.report import FLOOR, SERVER, Point, Target, fmt

FLOOR_MODEL = "tiny"
FLOOR_CALLERS = 64
FLOOR_RATIO = 1.3
"""tiny at 64 callers: trtserve's server CPU per call at most this × the null server's, per door."""
STREAM_MODE = "closed-stream"
STREAM_RATIO = 0.5
"""tiny at 64 in flight: server CPU per stream message at most this × per unary call (64 callers)."""


def _point(points: Sequence[Point], server: str, mode: str) -> Point | None:
    return next((p for p in points if p.model == FLOOR_MODEL and p.server == server and p.mode == mode
                 and p.load == FLOOR_CALLERS), None)


def floor_targets(points: Sequence[Point]) -> list[Target]:
    """Per door (gRPC, HTTP): trtserve's server CPU per call ÷ the null server's; then the
    stream message ÷ the unary call. SKIP, saying what is missing, where a point did not run."""
    targets = []
    for door, mode in (("gRPC", SWEEP_MODE), ("HTTP", HTTP_MODE)):
        name = (f"{FLOOR_MODEL} at {FLOOR_CALLERS} callers over {door}: server CPU per call <= {FLOOR_RATIO:g} x "
                f"the null server's (same run, whole process tree)")
        own, floor = _point(points, SERVER, mode), _point(points, FLOOR, mode)
        if own is None or floor is None:
            targets.append(Target(name, "SKIP", f"needs {mode} at {FLOOR_CALLERS} callers for trtserve and the "
                                                f"null server (--floor, --protocol with {door.lower()})"))
            continue
        r = quotient(own.server_cpu_us_per_request, floor.server_cpu_us_per_request)
        targets.append(Target(name, "PASS" if r is not None and r <= FLOOR_RATIO else "MISS", (
            f"{fmt(own.server_cpu_us_per_request, '.0f')}/{fmt(floor.server_cpu_us_per_request, '.0f')} us = "
            f"{fmt(r, '.2f')}; trtserve's own code adds "
            f"{fmt(_difference(own.server_cpu_us_per_request, floor.server_cpu_us_per_request), '.0f')} us a call")))
    name = (f"{FLOOR_MODEL} at {FLOOR_CALLERS}: server CPU per stream message <= {STREAM_RATIO:g} x per unary call")
    unary, stream = _point(points, SERVER, SWEEP_MODE), _point(points, SERVER, STREAM_MODE)
    if unary is None or stream is None:
        targets.append(Target(name, "SKIP", f"needs {SWEEP_MODE} and {STREAM_MODE} at {FLOOR_CALLERS}"))
    else:
        r = quotient(stream.server_cpu_us_per_request, unary.server_cpu_us_per_request)
        targets.append(Target(name, "PASS" if r is not None and r <= STREAM_RATIO else "MISS", (
            f"{fmt(stream.server_cpu_us_per_request, '.0f')}/{fmt(unary.server_cpu_us_per_request, '.0f')} us = "
            f"{fmt(r, '.2f')}")))
    return targets


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


__all__ = ["FLOOR_RATIO", "STREAM_RATIO", "floor_targets"]
