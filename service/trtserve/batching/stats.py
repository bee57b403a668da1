"""Counters the dispatcher updates as it runs batches; read by metrics and ModelStatistics."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class DispatchStats:
    """What one model's dispatcher has done since load.

    Attributes:
        batches: engine runs.
        rows: rows run, over all batches.
        compute_seconds: total engine run time of all batches (seconds).
        batch_sizes: batch size (rows) → engine runs at that size.
        batch_seconds: batch size (rows) → total engine seconds at that size.
        expired_before_run: requests answered DEADLINE_EXCEEDED without being run.
    """

    batches: int = 0
    rows: int = 0
    compute_seconds: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    batch_seconds: dict[int, float] = field(default_factory=dict)
    expired_before_run: int = 0

    def record_batch(self, rows: int, seconds: float) -> None:
        """Count one engine run of ``rows`` rows that took ``seconds``."""
        self.batches += 1
        self.rows += rows
        self.compute_seconds += seconds
        self.batch_sizes[rows] += 1
        self.batch_seconds[rows] = self.batch_seconds.get(rows, 0.0) + seconds

    @property
    def mean_batch_size(self) -> float:
        """Mean rows per engine run (0 before the first)."""
        return self.rows / self.batches if self.batches else 0.0
