"""Measured arrival rate of rows, for the adaptive dispatch policy."""

from __future__ import annotations

import math


class ArrivalRate:
    """Rows per second arriving, as an exponentially decaying average.

    Each arrival adds its rows to a count that decays with time constant ``tau`` seconds; the
    rate is count / tau. After a step change in load the estimate moves ~63% of the way in
    ``tau`` seconds. Not thread-safe (event loop only).
    """

    def __init__(self, tau: float = 0.5) -> None:
        if not tau > 0:
            raise ValueError(f"tau must be > 0 seconds, got {tau}")
        self.tau = tau
        self._count = 0.0
        self._at = -math.inf

    def observe(self, now: float, rows: int) -> None:
        """Record ``rows`` rows arriving at ``now`` (monotonic seconds)."""
        self._count = self._decayed(now) + rows
        self._at = now

    def rate(self, now: float) -> float:
        """Rows per second at ``now``."""
        return self._decayed(now) / self.tau

    def _decayed(self, now: float) -> float:
        if self._at == -math.inf:
            return 0.0
        return self._count * math.exp(-(now - self._at) / self.tau)
