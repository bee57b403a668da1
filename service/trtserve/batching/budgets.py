"""The tight end of the recently observed deadline budgets of one model.

A request's *budget* is its deadline minus its arrival (seconds; ``math.inf`` for none). The
dispatch policy caps a batch so that a tight request arriving while it runs can still be
answered in time (:mod:`~trtserve.batching.policy`); "tight" is a low quantile of the budgets of the last
``size`` requests, so a mix of 50 % 10 ms and 50 % 200 ms deadlines protects the 10 ms ones,
while a rare tight request (under ``quantile`` of the traffic) does not shrink every batch.
"""

from __future__ import annotations

import math

import numpy as np


class DeadlineBudgets:
    """Recent deadline budgets (seconds) and their ``quantile`` (the tight end).

    The quantile is recomputed every ``every`` observations (a sort of ``size`` floats), so
    :meth:`observe` costs an array store on the request path. Not thread-safe (event loop only).

    Args:
        size: budgets remembered (the most recent).
        quantile: the low quantile read as "tight" (0..1).
        every: observations between recomputations.
    """

    def __init__(self, size: int = 256, quantile: float = 0.1, every: int = 32) -> None:
        if size < 1 or every < 1:
            raise ValueError(f"size and every must be >= 1, got {size} and {every}")
        if not 0 <= quantile <= 1:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        self.quantile = quantile
        self._values = np.full(size, math.inf)
        self._seen = 0
        self._every = every
        self.tight = math.inf

    def observe(self, budget: float) -> None:
        """Record one request's budget (seconds; ``math.inf`` for no deadline)."""
        self._values[self._seen % len(self._values)] = budget
        self._seen += 1
        if self._seen % self._every == 0 or self._seen < self._every:
            known = self._values[: min(self._seen, len(self._values))]
            # "lower": an observed budget, never a value between two (inf stays inf).
            self.tight = float(np.quantile(known, self.quantile, method="lower"))
