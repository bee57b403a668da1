"""What a bulk run did, the same for both paths (servers and ``--ray``): rows read, written,
skipped as already committed, refused for good (the errors file), and *pending*: refused only
with a transient code (:data:`RETRY_CODES`) after their retries, so neither final nor in the
errors file, and sent again by a re-run."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

# Transient refusals: retried, and never final (a row refused only with these is left for a re-run).
RETRY_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "ABORTED"})
LATENCY_SAMPLES = 200_000
"""Most per-message latencies a run keeps for its percentiles, so memory stays bounded."""


@dataclass
class Summary:
    """What a run did (``trtserve bulk`` prints it; ``--summary-json`` writes it)."""

    rows_read: int = 0
    rows_written: int = 0
    skipped: int = 0
    duplicates: int = 0
    errors: int = 0
    errors_total: int = 0
    pending: int = 0  # rows given up on after transient refusals: a re-run sends them again
    pending_codes: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    splits: int = 0
    broken_streams: int = 0
    wall_s: float = 0.0
    rows_per_s: float = 0.0
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    messages: int = 0
    mean_batch_size: float = math.nan
    output_rows: int = 0
    per_endpoint: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lines = [
            f"rows written {self.rows_written}  (read {self.rows_read}, skipped as already committed {self.skipped}, "
            f"duplicate ids {self.duplicates})",
            f"errors {self.errors} this run ({self.errors_total} in the errors file)  pending {self.pending}  "
            f"retries {self.retries}  broken streams {self.broken_streams}  split messages {self.splits}",
            f"wall {self.wall_s:.1f} s  {self.rows_per_s:.1f} rows/s",
        ]
        if self.messages:
            lines[-1] += (f"  latency per message p50 {self.latency_p50_ms:.1f} ms p99 {self.latency_p99_ms:.1f} ms "
                          f"({self.messages} messages)")
        if not math.isnan(self.mean_batch_size):
            lines.append(f"mean batch size {self.mean_batch_size:.2f} (servers' ModelStatistics, this run)")
        lines.append("rows per endpoint: " + ", ".join(f"{k}: {v}" for k, v in self.per_endpoint.items()))
        if self.pending:
            lines.append(f"output not final: {self.pending} row(s) pending (committed rows are kept in the parts)")
        else:
            lines.append(f"output rows {self.output_rows}")
        return lines

    def pending_note(self, max_retries: int | None) -> str:
        """The sentence ``trtserve bulk`` ends with when rows are pending ("" when none)."""
        if not self.pending:
            return ""
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.pending_codes.items()))
        after = f" after {max_retries} retries" if max_retries is not None else ""
        return (f"{self.pending} row(s) not done: refused with retryable codes ({codes}){after}; they are "
                "not in the errors file: re-run the same command to resume them")


class LatencySample:
    """Per-message latencies in seconds, for the summary's percentiles: the first
    :data:`LATENCY_SAMPLES`, then each later one in place of a kept one at random."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def add(self, seconds: float) -> None:
        if len(self.seconds) < LATENCY_SAMPLES:
            self.seconds.append(seconds)
        else:
            self.seconds[random.randrange(LATENCY_SAMPLES)] = seconds

    def percentiles_ms(self) -> tuple[float, float]:
        """(p50, p99) in milliseconds; NaN each when nothing was added."""
        if not self.seconds:
            return math.nan, math.nan
        lat = np.array(self.seconds) * 1e3
        return float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
