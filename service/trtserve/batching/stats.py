"""Counters the dispatcher updates as it runs batches; read by metrics and ModelStatistics.

Updated only from the event loop thread. The metrics endpoint reads them from its own thread
without a lock: every update is a single int/float store or list-item increment, and readers
copy (``list(...)``, ``dict(...)``) before iterating, so a scrape sees each counter whole,
possibly one batch behind another.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Upper bounds (seconds) of the duration histograms: 100 µs to 30 s.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class Histogram:
    """Observations counted per bucket (Prometheus ``le`` upper bounds, then +Inf), and their sum.

    ``observe`` is one bisect and two increments: cheap enough for the request path.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = DURATION_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of ``value`` (seconds, for the duration histograms)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """Observations counted, over every bucket."""
        return sum(self.counts)

    def snapshot(self) -> tuple[list[int], float]:
        """(per-bucket counts, sum), copied so another thread may read them."""
        return list(self.counts), self.sum


@dataclass
class DispatchStats:
    """What one model's dispatcher has done since load (the warm-up run excluded).

    Attributes:
        batches: engine runs.
        rows: rows run, over all batches.
        compute_seconds: total engine run time of all batches (seconds).
        batch_sizes: batch size (rows) → engine runs at that size.
        batch_seconds: batch size (rows) → total engine seconds at that size.
        expired_before_run: requests answered DEADLINE_EXCEEDED without being run.
        finished_late: requests answered DEADLINE_EXCEEDED because their deadline passed while
            their batch was still running.
        compute: engine run time per batch (seconds), as a histogram.
        queue: per request, seconds from queueing to its first rows starting to run
            (:meth:`record_started`).
        request_runs: request pieces run (a request split over several batches counts once
            per batch); with ``request_compute_seconds``, Triton's per-request compute_infer.
        request_compute_seconds: over every piece run, the run time of its batch.
        padded_elements: input elements the engine ran, padding included (``rows`` times the
            longest row's elements, per batch).
        real_elements: of those, the elements the requests carried (the rest was padding).
        host_seconds: host CPU (the event-loop thread) spent on per-batch work beside the
            engine runs, over all batches (seconds; see :mod:`trtserve.batching.host`).
        staged_batches: batches handed to a busy slot to run as soon as its batch returned
            (staging, :mod:`trtserve.batching.dispatcher`).
        loop_failures: times the dispatch loop itself raised (a bug) and answered its queued
            requests INTERNAL before starting again (:meth:`Dispatcher._loop
            <trtserve.batching.dispatcher.Dispatcher._loop>`).
    """

    batches: int = 0
    rows: int = 0
    compute_seconds: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    batch_seconds: dict[int, float] = field(default_factory=dict)
    expired_before_run: int = 0
    finished_late: int = 0
    compute: Histogram = field(default_factory=Histogram)
    queue: Histogram = field(default_factory=Histogram)
    request_runs: int = 0
    request_compute_seconds: float = 0.0
    padded_elements: int = 0
    real_elements: int = 0
    host_seconds: float = 0.0
    staged_batches: int = 0
    loop_failures: int = 0

    def record_batch(self, rows: int, seconds: float, *, padded: int = 0, real: int = 0, requests: int = 0) -> None:
        """Count one engine run of ``rows`` rows that took ``seconds``.

        Args:
            padded: elements run, padding included; ``real``: the elements requests carried.
            requests: requests with rows in the batch, each counted once however many segments
                or pieces it has there (each is charged the batch's run time).
        """
        self.batches += 1
        self.rows += rows
        self.compute_seconds += seconds
        self.batch_sizes[rows] += 1
        self.batch_seconds[rows] = self.batch_seconds.get(rows, 0.0) + seconds
        self.compute.observe(seconds)
        self.padded_elements += padded
        self.real_elements += real
        self.request_runs += requests
        self.request_compute_seconds += seconds * requests

    def record_started(self, waits: Iterable[float]) -> None:
        """Count the queue time (seconds) of each request whose first rows start running now."""
        for wait in waits:
            self.queue.observe(wait)

    def reset(self) -> None:
        """Forget everything counted so far (the warm-up run is not the model's traffic)."""
        self.__dict__.update(DispatchStats().__dict__)

    @property
    def mean_batch_size(self) -> float:
        """Mean rows per engine run (0 before the first)."""
        return self.rows / self.batches if self.batches else 0.0

    @property
    def mean_host_seconds(self) -> float:
        """Mean host CPU seconds per batch beside the engine run (0 before the first)."""
        return self.host_seconds / self.batches if self.batches else 0.0

    @property
    def padding_ratio(self) -> float:
        """The share of the elements run that were padding (0 before the first batch)."""
        return 1.0 - self.real_elements / self.padded_elements if self.padded_elements else 0.0
