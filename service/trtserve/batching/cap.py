"""The batch cap as a live estimate: how many rows a batch may take, learned while serving.

A load measures a throughput curve and starts from its knee (:mod:`trtserve.engine.warmup`), but
a load on a busy machine measures every size slow and unevenly, and a cap is never measured above
itself by traffic: batches never grow past it. So while the queue holds more rows than the cap
allows, :class:`BatchCap` keeps testing its neighbours by hill climbing:

* **A probe** runs a batch of a *candidate* size, then one of the cap in force, in turn, and
  compares each pair's rows per second (in logs), so that whatever else the machine is doing
  weighs on both sides of a pair alike; only full batches count (a batch the queue or the
  deadlines cut short measures nothing). It takes :data:`PROBE_PAIRS` to :data:`PROBE_MAX_PAIRS`
  pairs: it ends as soon as the mean difference clears the bar below by :data:`CONFIDENCE`
  standard errors either way, and keeps the cap if it never does (noise moves nothing).
* **Up** (twice the cap, at most the hard limit and the largest size whose predicted run time
  fits the latency budget) is taken when it runs more than :data:`GAIN` more rows per second;
  then the next size up is probed at once, so a cap climbs from 4 to 32 in three probes.
* **Down** (half the cap) is taken when it runs at least 1 − :data:`GAIN` of the cap's rows per
  second (the knee rule of ``trtserve profile``: the smallest size within 5 % of the best, since a
  smaller batch answers sooner); then the next size down is probed at once.
* **Between probes**: after a probe that kept the cap, the next one waits :data:`PROBE_EVERY`
  full batches, doubled after each probe that kept it, up to :data:`PROBE_MAX_EVERY` (and back to
  :data:`PROBE_EVERY` after a move); probes go up and down in turn. A short noisy spell costs at
  most a move that the next probes undo; on a quiet machine at the knee every probe keeps the
  cap, so they thin out to one in :data:`PROBE_MAX_EVERY` full batches.

A fixed ``max_batch_size`` in a model's config stays a hard limit and the cap is that, unless the
model asks for ``adaptive_batch_size`` (or leaves ``max_batch_size`` to the server): then the cap
moves below the hard limit. Touched only from the dispatcher's event loop; no clock (it counts
batches), so the dispatcher's tests drive it on a fake clock and the policy stays pure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

GAIN = 0.05
"""A larger cap must run more than this share more rows per second; a smaller one, at least
1 − this share as many (the knee rule's tolerance)."""
CONFIDENCE = 2.0
"""Standard errors by which a probe's evidence must clear :data:`GAIN` to move the cap (about
95 %, one-sided)."""
PROBE_PAIRS = 4
"""Pairs of full batches (one of each size, in turn) a probe compares at least ..."""
PROBE_MAX_PAIRS = 16
"""... and at most: between the two it goes on while the evidence is neither way."""
PROBE_EVERY = 8
"""Full batches between a probe that kept the cap and the next one, at first."""
PROBE_MAX_EVERY = 64
"""The most full batches between two probes."""
PROBE_PATIENCE = 8
"""A probe that gathers no sample in this many batches in a row (the queue no longer holds a
full batch of the size it waits for) is given up, as one that kept the cap."""


class BatchCap:
    """The batch cap of one model (rows), and why it is what it is.

    Args:
        limit: the hard limit (``max_batch_size``; the model file's limit where the server chose).
        start: the cap to start from (at most ``limit``).
        live: whether the cap moves (``adaptive_batch_size``, or a batch size the server chose);
            otherwise it stays ``limit``.
        reason: why it starts at ``start`` (for the log, metrics and ``trtserve profile``).
        fits: whether a batch of that many rows may be tried (its predicted run time within the
            model's latency budget); everything fits by default.

    Attributes:
        value: the cap in force: decisions fill batches up to it (a probe tries another size
            for some batches: :meth:`for_batch`).
        reason: one sentence: how the cap in force was set.
        moves: how many times the cap moved since the start.
    """

    def __init__(self, limit: int, start: int, *, live: bool, reason: str,
                 fits: Callable[[int], bool] = lambda rows: True) -> None:
        self.limit = max(limit, 1)
        self.value = min(max(start, 1), self.limit) if live else self.limit
        self.live = live
        self.reason = reason
        self.moves = 0
        self._fits = fits
        self._every = PROBE_EVERY
        self._since = 0  # full batches at the cap since the last probe
        self._up = True  # the direction of the next probe
        self._candidate: int | None = None  # the size a probe tries (None: no probe)
        self._turn = 0  # which side's batch the probe asks for next: even the candidate, odd the cap
        self._idle = 0  # batches since the probe's last sample
        self._pending = 0.0  # log rows/s of the candidate's batch awaiting its pair
        self._diffs: list[float] = []  # per pair: log(candidate rows/s) − log(cap rows/s)

    def for_batch(self, queued_rows: int) -> int:
        """The cap for the next batch, with ``queued_rows`` rows waiting: the cap in force, or
        during a probe the size whose turn it is. A probe starts only while more rows wait than
        the cap allows (the cap does not limit a shorter queue, so nothing would be learned)."""
        if self._candidate is None:
            if not self.live or queued_rows <= self.value or self._since < self._every:
                return self.value
            self._start_probe()
            if self._candidate is None:
                return self.value
        return self._candidate if self._turn % 2 == 0 else self.value

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` rows ran in ``seconds``: a sample for a probe when it is a full
        batch of the size whose turn it was; one more full batch at the cap otherwise."""
        if not self.live:
            return
        if self._candidate is None:
            if rows >= self.value:
                self._since += 1
            return
        size = self._candidate if self._turn % 2 == 0 else self.value
        if rows != size or seconds <= 0:
            self._idle += 1
            if self._idle >= PROBE_PATIENCE:
                self._end_probe(None)
            return
        self._idle = 0
        rate = math.log(size / seconds)
        if self._turn % 2 == 0:
            self._pending = rate
        else:
            self._diffs.append(self._pending - rate)  # log of candidate rows/s over the cap's, one pair
        self._turn += 1
        if self._turn % 2 == 0 and len(self._diffs) >= PROBE_PAIRS:
            verdict = self._verdict()
            if verdict is not None or len(self._diffs) >= PROBE_MAX_PAIRS:
                self._end_probe(self._candidate if verdict else None)

    def _start_probe(self) -> None:
        up = min(self.value * 2, self.limit)
        down = max(self.value // 2, 1)
        options = [up if up > self.value and self._fits(up) else None, down if down < self.value else None]
        if not self._up:
            options.reverse()
        candidate = next((c for c in options if c is not None), None)
        self._since = 0
        if candidate is None:
            return
        self._up = candidate > self.value
        self._candidate, self._turn, self._idle, self._diffs = candidate, 0, 0, []

    def _verdict(self) -> bool | None:
        """Whether the pairs so far say to move to the candidate (True), to keep the cap (False),
        or neither yet (None): a paired comparison of log rows/s, each pair run back to back so
        that what else the machine does weighs on both. Up moves when the candidate is faster
        by more than :data:`GAIN` with :data:`CONFIDENCE`; down moves when it is, with that
        confidence, no more than :data:`GAIN` slower."""
        diffs = self._diffs
        mean = statistics.fmean(diffs)
        error = statistics.stdev(diffs) / math.sqrt(len(diffs))
        bar = math.log(1 + GAIN) if self._up else math.log(1 - GAIN)
        if mean - CONFIDENCE * error > bar:
            return True
        if mean + CONFIDENCE * error < bar:
            return False
        return None

    def _end_probe(self, move: int | None) -> None:
        self._candidate = None
        if move is None:
            self._every = min(self._every * 2, PROBE_MAX_EVERY)
            self._up = not self._up
            return
        gain = math.exp(statistics.fmean(self._diffs)) - 1
        way = "grew" if move > self.value else "shrank"
        self.reason = (f"{way} from {self.value} to {move} rows while serving: {gain:+.0%} rows/s over "
                       f"{len(self._diffs)} pairs of batches run in turn")
        self.value, self.moves, self._every = move, self.moves + 1, PROBE_EVERY
        self._since = self._every  # go on in the same direction at once


__all__ = ["CONFIDENCE", "GAIN", "PROBE_EVERY", "PROBE_MAX_EVERY", "PROBE_MAX_PAIRS", "PROBE_PAIRS",
           "PROBE_PATIENCE", "BatchCap"]
