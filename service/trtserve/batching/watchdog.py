"""The hang watchdog of one dispatcher: a batch that runs far past its predicted time marks its
slot unhealthy, and the backend aborts it where it can.

A batch still running after :data:`HANG_FACTOR` times its predicted run time, and at least
:data:`HANG_MIN_S` seconds, marks its slot unhealthy until it returns (the model reports not
ready while every slot is), and is aborted where the backend can
(:class:`~trtserve.runtimes.base.Abortable`: a Python model's worker process is killed and
started again; its ``run`` then fails the batch and returns). Touched only from the event loop.
"""

from __future__ import annotations

import logging
import math

from trtserve.runtimes.base import Abortable, Backend

log = logging.getLogger(__name__)

HANG_FACTOR = 20.0
"""A batch counts as hung after this many times its predicted run time ..."""
HANG_MIN_S = 10.0
"""... and at least this many seconds."""


class HangWatch:
    """Which slots run a batch past the hang limit.

    Args:
        backend: the model's runtime (asked to abort a hung batch where it is
            :class:`~trtserve.runtimes.base.Abortable`).

    Attributes:
        unhealthy: slots whose batch is past its hang limit and has not returned.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.unhealthy: set[int] = set()
        self._limits: dict[int, tuple[float, float]] = {}  # running slot -> (started, counts as hung at)

    def started(self, slot: int, now: float, predicted: float) -> None:
        """A batch predicted to take ``predicted`` seconds started on ``slot`` at ``now``."""
        self._limits[slot] = (now, now + max(HANG_FACTOR * predicted, HANG_MIN_S))

    def finished(self, slot: int) -> None:
        """The batch on ``slot`` returned (answered or failed): the slot is healthy again."""
        del self._limits[slot]
        self.unhealthy.discard(slot)

    def check(self, now: float) -> float:
        """Mark the slots whose batch passed its hang limit by ``now`` (logged once; the backend
        asked to abort it). Returns when the next running batch reaches its limit
        (``math.inf``: none)."""
        wake = math.inf
        for slot, (started, hang_at) in self._limits.items():
            if now < hang_at:
                wake = min(wake, hang_at)
            elif slot not in self.unhealthy:
                self.unhealthy.add(slot)
                why = (f"execution slot {slot} has run one batch for {now - started:.1f} s, past the hang "
                       f"limit of {hang_at - started:.1f} s")
                log.warning("%s: marked unhealthy", why)
                if isinstance(self.backend, Abortable):
                    try:
                        if self.backend.abort(slot, why):
                            log.warning("execution slot %d: aborting its batch", slot)
                    except Exception:  # a runtime bug must not stop the dispatch loop
                        log.exception("execution slot %d: abort failed", slot)
        return wake


__all__ = ["HANG_FACTOR", "HANG_MIN_S", "HangWatch"]
