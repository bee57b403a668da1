"""Requests with deadlines, counted as a client with an SLO counts them: goodput (answers OK
within their deadline per second), misses (everything else: late answers and refusals alike),
refusals by gRPC status, latency of the OK answers. Pure: numbers in, numbers out.

Units: latency in microseconds in, milliseconds out; deadlines in microseconds in,
milliseconds out; goodput in answers per second of the measuring window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_DEADLINE_MS = 5.0
"""The floor of every deadline the bench derives from a measured run time: below a few ms a
Python gRPC round trip alone (about 1 ms) would miss it."""
REFUSALS = ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
"""The refusals counted by name: overloaded (retry elsewhere) and deadline cannot be met.
Every other non-OK status is counted as ``other``."""
OTHER = "other"


OPEN_BATCH_RUNS = 2.0
"""The open loop's deadline covers this many run times of the batch the closed loop formed at
capacity (see :func:`open_deadline_us`)."""


def deadline_us(batch1_ms: float, factor: float, floor_ms: float = MIN_DEADLINE_MS) -> int:
    """``factor`` × the batch-of-one run time ``batch1_ms`` (ms), at least ``floor_ms``, in µs."""
    return round(max(factor * batch1_ms, floor_ms) * 1000)


def open_deadline_us(batch1_ms: float, factor: float, capacity_batch_ms: float) -> int:
    """The open loop's deadline in µs: :func:`deadline_us` of ``factor``, and at least
    :data:`OPEN_BATCH_RUNS` × ``capacity_batch_ms``, the raw run time (ms) of a batch as large
    as the closed loop's mean batch at capacity. Near capacity the server must run batches
    about that large to keep up, and a request arriving while one runs waits for it and then
    runs in the next: a deadline below two such runs asks whether the load can be met at all
    (for minilm on 2 cores, 4 × its 6 ms batch of one is below one batch of 16), not whether the
    server meets it."""
    return max(deadline_us(batch1_ms, factor), round(OPEN_BATCH_RUNS * capacity_batch_ms * 1000))


@dataclass(frozen=True)
class DeadlineClass:
    """The requests of one deadline class in one measuring window.

    Attributes:
        name: the class (``all``, ``tight``, ``loose``).
        deadline_ms: the deadline every request of the class carried (gRPC deadline and
            ``timeout`` parameter), in ms.
        requests: requests scheduled in the window.
        good: answered OK within the deadline.
        late: answered OK after the deadline.
        refused: ``RESOURCE_EXHAUSTED``, ``DEADLINE_EXCEEDED`` and ``other`` → answers
            with that status (each key present, 0 included).
        refused_early: DEADLINE_EXCEEDED answers that came before the deadline had passed
            (the server said in advance it could not make it, instead of timing out).
        window_s: the window's length in seconds.
        p50_ms, p99_ms: latency of the OK answers (late ones included); None without any.
    """

    name: str
    deadline_ms: float
    requests: int
    good: int
    late: int
    refused: dict[str, int]
    refused_early: int
    window_s: float
    p50_ms: float | None
    p99_ms: float | None

    @property
    def goodput(self) -> float:
        """Answers OK within the deadline per second of the window."""
        return self.good / self.window_s if self.window_s > 0 else 0.0

    @property
    def misses(self) -> int:
        """Requests not answered OK within the deadline (late answers and refusals)."""
        return self.requests - self.good

    @property
    def miss_share(self) -> float:
        """:attr:`misses` as a share of :attr:`requests` (0 without requests)."""
        return self.misses / self.requests if self.requests else 0.0


def deadline_class(name: str, deadline_us: int, window_s: float, latency_us: np.ndarray, codes: Sequence[str],
                   late_mask: np.ndarray) -> DeadlineClass:
    """Summarize one class's requests (parallel arrays: latency send → answer in µs, status
    name, and whether an OK answer came after the deadline)."""
    codes_arr = np.asarray(codes, dtype=object)
    latency = np.asarray(latency_us, dtype=np.float64)
    late_arr = np.asarray(late_mask, dtype=bool)
    ok = codes_arr == "OK"
    refused = {code: int((codes_arr == code).sum()) for code in REFUSALS}
    refused[OTHER] = int((~ok).sum()) - sum(refused.values())
    early = (codes_arr == "DEADLINE_EXCEEDED") & (latency < deadline_us)
    p50, p99 = (float(v) for v in np.percentile(latency[ok], (50, 99)) / 1000.0) if ok.any() else (None, None)
    return DeadlineClass(
        name=name, deadline_ms=deadline_us / 1000.0, requests=len(codes_arr), good=int((ok & ~late_arr).sum()),
        late=int((ok & late_arr).sum()), refused=refused, refused_early=int(early.sum()), window_s=window_s,
        p50_ms=p50, p99_ms=p99,
    )
