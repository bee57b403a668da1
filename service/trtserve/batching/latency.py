"""Predicted engine run time of a batch, learned from measured batches.

The dispatch policy asks "how long would a batch of b rows, padded to length s, take?" to
decide whether a queued request can still meet its deadline, whether waiting for more rows
pays off, and which batch size is the knee of the throughput curve.

The model keeps, per (rows bucket, length bucket) with power-of-two buckets, a running centroid
(mean rows, mean seconds) of the batches measured there; ``length`` is the padded size of the
batch's variable-length dims (1 for fixed shapes), and a sample is scaled to its length
bucket's upper bound in proportion to the length. Within a length bucket the prediction
interpolates linearly between centroids (run time is close to affine in rows on CPU and GPU
engines, so centroids of an affine curve lie on it) and extrapolates from the last slope
beyond them; an unmeasured length bucket is scaled from the nearest measured one in
proportion to the length. Each update moves the estimate a fraction ``alpha`` of the way to the
new sample, after clipping the sample to ``clip`` times the current estimate (and not below
1/clip of it), so one outlier (a GC pause, a noisy neighbour) moves it little while a lasting
drift is followed within a few dozen batches.

Each centroid also keeps a *low* estimate of its run time: it drops at once to a faster sample
and rises by ``rise`` of the gap on a slower one, so it sits near the fast end of the recent
samples (a low quantile: about the ``rise / (1 + rise)`` one for noise symmetric about the
mean). :meth:`LatencyModel.lower_bound` reads it. Refusing a request on the *mean* of a noisy
CPU engine refuses ones that would have made it, and a refused request is never measured, so an
estimate inflated by a busy moment would keep refusing; the low estimate refuses only what even
a fast run would not finish in time.
"""

from __future__ import annotations

import bisect


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (1, 2, 4, 8, ...)."""
    return 1 << max(n - 1, 0).bit_length()


class LatencyModel:
    """Predicted run time (seconds) of one batch, by rows and padded length.

    Not thread-safe: updated and read only from the dispatcher's event loop.

    Args:
        alpha: weight of a new measurement (0..1].
        clip: a sample is clipped into [estimate / clip, estimate * clip] before it is used.
        seed: run time in seconds assumed before anything is measured.
        rise: how far (0..1] the low estimate moves toward a sample slower than it.
    """

    def __init__(self, alpha: float = 0.2, clip: float = 3.0, seed: float = 0.0, rise: float = 0.02) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if clip < 1:
            raise ValueError(f"clip must be >= 1, got {clip}")
        if not 0 < rise <= 1:
            raise ValueError(f"rise must be in (0, 1], got {rise}")
        self._alpha = alpha
        self._clip = clip
        self._seed = seed
        self._rise = rise
        # length bucket -> row bucket -> [mean rows, mean seconds, low seconds]; and the same
        # points sorted by row bucket
        self._tables: dict[int, dict[int, list[float]]] = {}
        self._points: dict[int, list[list[float]]] = {}
        self._lengths: list[int] = []

    @property
    def lengths(self) -> list[int]:
        """The padded-length buckets measured so far, ascending."""
        return list(self._lengths)

    @property
    def measured(self) -> bool:
        """Whether any batch has been observed."""
        return bool(self._lengths)

    def observe(self, rows: int, seconds: float, length: int = 1) -> None:
        """Record that a batch of ``rows`` rows padded to ``length`` ran in ``seconds``."""
        lb = bucket(length)
        value = seconds * lb / max(length, 1)
        if lb not in self._tables:
            self._tables[lb] = {}
            bisect.insort(self._lengths, lb)
        table = self._tables[lb]
        point = table.get(bucket(rows))
        if point is None:
            table[bucket(rows)] = [float(rows), value, value]
            self._points[lb] = [table[b] for b in sorted(table)]
            return
        points = self._points[lb]
        expected = _interpolate(points, rows)
        value = min(max(value, expected / self._clip), expected * self._clip)
        # The low estimate: the sample moved along the mean curve to the centroid's rows; then,
        # as the centroid's rows move, the low estimate moves along the curve with them (else
        # it would drift below the curve on a noiseless engine).
        low = max(value + point[1] - expected, 0.0)
        point[2] = low if low < point[2] else point[2] + self._rise * (low - point[2])
        moved = point[0] + self._alpha * (rows - point[0])
        point[2] += _interpolate(points, moved) - point[1]  # before the centroid moves
        point[0] = moved
        point[1] += self._alpha * (value - point[1])

    def predict(self, rows: int, length: int = 1) -> float:
        """Predicted run time in seconds of a batch of ``rows`` rows (>= 1) padded to ``length``."""
        return self._estimate(rows, length, MEAN, scale_up=True)

    def lower_bound(self, rows: int, length: int = 1) -> float:
        """What a batch of ``rows`` rows padded to ``length`` needs at least: the low
        estimate (see the module docstring), and for a length never measured never scaled
        *up* from the nearest measured length.

        Refusing or expiring a request on a guess would turn a long row that the warm-up never
        measured (run time mostly fixed overhead, far from proportional to length), or a row
        arriving after a few slow batches, into a false DEADLINE_EXCEEDED; decisions that only
        *refuse* use this, decisions that wait use the cautious :meth:`predict`.

        It is also held consistent with the other measurements, since run time grows with rows
        and with length, and with length no faster than in proportion (a fixed part plus a part
        per element): it is at most the low estimate of any measured batch of more rows at the
        same length, of the same rows at any longer length, and of the same rows at a shorter
        length times the ratio of the lengths. So a length bucket or row bucket first measured
        in a slow spell (the warm-up measures one length; traffic brings the others, one batch
        at a time) cannot refuse its requests for good: a refused request is never measured,
        so its bucket would never be measured again."""
        estimate = self._estimate(rows, length, LOW, scale_up=False)
        lb = bucket(length)
        points = self._points.get(lb)
        if points is not None:
            estimate = min(estimate, min((p[LOW] for p in points if p[0] >= rows), default=estimate))
        for other in self._lengths:
            if other != lb:
                at = _interpolate(self._points[other], max(rows, 1), LOW)
                estimate = min(estimate, at if other > lb else at * lb / other)
        return estimate

    def spread(self, rows: int, length: int = 1) -> float:
        """How much slower than its low estimate a batch of ``rows`` rows padded to ``length``
        typically runs at the slow end: ``(2·mean − low) / low``, at least 1. The low estimate sits
        near the ``rise / (1 + rise)`` quantile (about the 2nd percentile at the default
        ``rise``), so for run-time noise symmetric about the mean ``2·mean − low`` sits near the
        98th; 1 before anything is measured, or on a noiseless engine. At most ``clip``: the
        low estimate may lag far below the mean (it rises only ``rise`` of the gap a sample, so
        after an instant warm-up, or one very fast run, it stays near zero for dozens of
        batches), and a run slower than ``clip`` times the estimate counts as an outlier anyway."""
        low = self.lower_bound(rows, length)
        mean = self.predict(rows, length)
        return min(max((2 * mean - low) / low, 1.0), self._clip) if low > 0 else 1.0

    def _estimate(self, rows: int, length: int, column: int, *, scale_up: bool) -> float:
        if not self._lengths:
            return self._seed
        lb = bucket(length)
        if lb in self._points:
            return _interpolate(self._points[lb], max(rows, 1), column)
        # Nearest measured length bucket, scaled in proportion to the length (down only,
        # unless ``scale_up``).
        near = min(self._lengths, key=lambda b: abs(b.bit_length() - lb.bit_length()))
        factor = lb / near if scale_up else min(1.0, lb / near)
        return _interpolate(self._points[near], max(rows, 1), column) * factor

    def top_rows(self, length: int = 1) -> int:
        """The largest row bucket measured at ``length``'s bucket (0 for none): where the
        predictions stop being measurements and become extrapolations."""
        table = self._tables.get(bucket(length))
        return max(table) if table else 0

    def curve(self, length: int = 1) -> dict[int, float]:
        """Row bucket → predicted seconds of a batch of that many rows at ``length``
        (for metrics, the adaptive batch size and ``trtserve profile``)."""
        table = self._tables.get(bucket(length), {})
        # list(): the metrics endpoint reads this from another thread
        return {rb: self.predict(rb, length) for rb in list(table)}


MEAN, LOW = 1, 2
"""Columns of a centroid after its mean rows: mean seconds, low seconds."""


def _interpolate(points: list[list[float]], rows: float, column: int = MEAN) -> float:
    """Linear interpolation of ``column`` through centroids sorted by row bucket (so by mean
    rows too: the buckets' row ranges are disjoint)."""
    r0, t0 = points[0][0], points[0][column]
    if rows <= r0 or len(points) == 1:
        # Below the smallest measurement, or a single one: proportional to rows.
        return t0 * rows / r0
    for a, b in zip(points, points[1:]):
        if rows <= b[0]:
            return a[column] + (b[column] - a[column]) * (rows - a[0]) / (b[0] - a[0])
    a, b = points[-2], points[-1]
    return b[column] + max((b[column] - a[column]) / (b[0] - a[0]), 0.0) * (rows - b[0])
