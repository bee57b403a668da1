"""Measured arrival rate of rows, for the adaptive dispatch policy and the metrics."""

from __future__ import annotations

from collections import deque


class ArrivalRate:
    """Rows per second arriving, over the last ``window`` arrivals.

    The rate at ``now`` is the rows of every remembered arrival but the oldest, divided by the
    time since the oldest: it reacts within ``window`` arrivals to a change of load (the policy
    must see an overload within milliseconds on a fast model: at three times a host's capacity,
    its backlog grows two milliseconds per millisecond), and a lone request after an idle spell
    reads as a low rate, not as a load. It is at most one mean arrival (rows) per time since
    the last arrival: when arrivals stop, the rate drops as the gap grows, so a wait for rows
    that are not coming ends (a burst followed by silence must not read as a load). Fewer than
    two arrivals: 0. Not thread-safe (event loop only).

    Args:
        window: arrivals remembered (at least 2).
    """

    def __init__(self, window: int = 16) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2 arrivals, got {window}")
        self._seen: deque[tuple[float, int]] = deque(maxlen=window)
        self._rows = 0  # rows of the remembered arrivals

    def observe(self, now: float, rows: int) -> None:
        """Record ``rows`` rows arriving at ``now`` (monotonic seconds)."""
        if len(self._seen) == self._seen.maxlen:
            self._rows -= self._seen[0][1]
        self._seen.append((now, rows))
        self._rows += rows

    def rate(self, now: float) -> float:
        """Rows per second at ``now``."""
        if len(self._seen) < 2:
            return 0.0
        oldest, first_rows = self._seen[0]
        rate = (self._rows - first_rows) / max(now - oldest, 1e-6)
        gap = now - self._seen[-1][0]
        if gap > 0:
            rate = min(rate, self._rows / len(self._seen) / gap)
        return rate
