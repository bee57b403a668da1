"""Predicted engine run time per batch size, learned from measured batches.

The dispatch policy asks "how long would a batch of b rows take?" to decide whether a queued
request can still meet its deadline and how long it may wait for more rows. The model keeps
an exponentially weighted mean per power-of-two bucket of the batch size and interpolates
linearly between measured buckets (run time is close to affine in rows on both CPU and GPU
engines); an unmeasured size above every bucket is extrapolated from the per-row slope.
"""

from __future__ import annotations

import bisect


def _bucket(rows: int) -> int:
    """The power of two at or above ``rows`` (1, 2, 4, 8, ...)."""
    return 1 << max(rows - 1, 0).bit_length()


class LatencyModel:
    """Predicted run time (seconds) of one batch, by rows.

    Not thread-safe: updated and read only from the dispatcher's event loop.

    Args:
        alpha: weight of a new measurement in the running mean of its bucket (0..1].
        seed: run time in seconds assumed for a batch of one before anything is measured.
    """

    def __init__(self, alpha: float = 0.2, seed: float = 0.0) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._seed = seed
        self._buckets: list[int] = []  # sorted bucket sizes with a measurement
        self._mean: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        """Record that a batch of ``rows`` rows ran in ``seconds``."""
        bucket = _bucket(rows)
        # Scale to the bucket's size so that partial buckets do not bias it low.
        value = seconds * bucket / rows if rows > 1 else seconds
        if bucket in self._mean:
            self._mean[bucket] += self._alpha * (value - self._mean[bucket])
        else:
            self._mean[bucket] = value
            bisect.insort(self._buckets, bucket)

    def predict(self, rows: int) -> float:
        """Predicted run time in seconds of a batch of ``rows`` rows (>= 1)."""
        buckets = self._buckets
        if not buckets:
            return self._seed
        rows = max(rows, 1)
        i = bisect.bisect_left(buckets, rows)
        if i < len(buckets) and buckets[i] == rows:
            return self._mean[rows]
        if i == 0:
            # Below the smallest measurement: assume no cheaper than it scaled down linearly.
            return self._mean[buckets[0]] * rows / buckets[0]
        lo = buckets[i - 1]
        if i == len(buckets):
            if len(buckets) == 1:
                return self._mean[lo] * rows / lo
            prev = buckets[-2]
            slope = (self._mean[lo] - self._mean[prev]) / (lo - prev)
            return self._mean[lo] + max(slope, 0.0) * (rows - lo)
        hi = buckets[i]
        frac = (rows - lo) / (hi - lo)
        return self._mean[lo] + frac * (self._mean[hi] - self._mean[lo])

    def snapshot(self) -> dict[int, float]:
        """Bucket size → mean run time (seconds), for metrics and ``trtserve profile``."""
        return dict(self._mean)
