"""The batch cap as a live estimate: how many rows a batch may take, learned while serving.

A load measures a throughput curve and starts from its knee (:mod:`trtserve.engine.warmup`), but
a load on a busy machine measures every size slow and unevenly, and a cap is never measured above
itself by traffic: batches never grow past it. A cap can be too large too: a load measures its
curve on its own sample rows, and a closed loop whose callers keep as many rows in flight as the
cap (128 callers of 8 rows, cap 1024) never queues more than one batch, so the slot idles while
each batch's answers go back and the next one fills (measured on an H200, minilm at 256 tokens:
0.54 of the raw best batch at a cap of 1024), where at half the cap one batch fills while the
other runs. So :class:`BatchCap` keeps testing its neighbours by hill climbing, half the cap while
the queue holds a full batch at the cap, twice the cap while it holds more:

* **A probe** serves in turn a phase at a *candidate* size and a phase at the cap in force, and
  compares each pair's rows served per second of wall time (in logs): the rows its batches ran
  over the time from the phase's first batch's start to its last batch's end, the slot's idle
  time included, which is what a closed loop loses at too large a cap (and in a backlog it is the
  engine's rows/s). A phase lasts until it has served :data:`PHASE_BATCHES` batches of the larger
  of the two sizes; whatever else the machine does weighs on both phases of a pair alike. A probe
  takes :data:`PROBE_PAIRS` to :data:`PROBE_MAX_PAIRS` pairs: it ends as soon as the mean
  difference clears the bar below by :data:`CONFIDENCE` standard errors either way, and keeps the
  cap if it never does (noise moves nothing), or if a phase's largest batch is under half the
  smaller size (the load fell: neither size limits the batches any more).
* **Up** (twice the cap, at most the hard limit and the largest size whose predicted run time
  fits the latency budget) is probed while more rows wait than the cap allows, and taken when it
  serves more than :data:`GAIN` more rows per second; then the next size up is probed at once,
  so a cap climbs from 4 to 32 in three probes.
* **Down** (half the cap) is probed while half the cap's rows wait, and taken when it serves at
  least 1 − :data:`GAIN` of the cap's rows per second (the knee rule of ``trtserve profile``: the
  smallest size within 5 % of the best, since a smaller batch answers sooner); then the next size
  down is probed at once.
* **The engine's curve agrees**: a move is taken only where the learned curve (the dispatcher's
  latency model, which the probe's own batches have just measured) also runs the candidate more
  than :data:`GAIN` more rows per engine-second (up), or at least 1 − :data:`GAIN` as many (down).
  Served rows/s alone cannot tell a size that serves as much from a load that both sizes keep up
  with (below capacity both phases serve the arrivals: a cap let drift below the knee then runs
  the engine near its limit and queues grow), nor a burst's silence that fell on one side of every
  pair; the engine-second cannot tell a closed loop's idle slot. Together they move for both.
* **Between probes**: after a probe that kept the cap, the next one waits :data:`PROBE_EVERY`
  batches of at least half the cap, doubled after each probe that kept it, up to
  :data:`PROBE_MAX_EVERY` (and back to :data:`PROBE_EVERY` after a move); probes go up and down in
  turn. A short noisy spell costs at most a move that the next probes undo; on a quiet machine at
  the knee every probe keeps the cap, so they thin out to one in :data:`PROBE_MAX_EVERY` batches.

A fixed ``max_batch_size`` in a model's config stays a hard limit and the cap is that, unless the
model asks for ``adaptive_batch_size`` (or leaves ``max_batch_size`` to the server): then the cap
moves below the hard limit. Touched only from the dispatcher's event loop; it reads no clock (the
dispatcher passes each batch's start and end), so the dispatcher's tests drive it on a fake clock.
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
"""Pairs of phases (one at each size, in turn) a probe compares at least ..."""
PROBE_MAX_PAIRS = 16
"""... and at most: between the two it goes on while the evidence is neither way."""
PHASE_BATCHES = 4
"""A probe's phase lasts until it has served this many batches' worth of rows of the larger size."""
PROBE_EVERY = 8
"""Batches of at least half the cap between a probe that kept it and the next one, at first."""
PROBE_MAX_EVERY = 64
"""The most such batches between two probes."""


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
        engine: the engine's rows per second of run time at a batch of that many rows (the learned
            curve), asked when a probe's phases call for a move; ``None``: the phases decide alone.

    Attributes:
        value: the cap in force: decisions fill batches up to it (a probe tries another size
            for some batches: :meth:`for_batch`).
        reason: one sentence: how the cap in force was set.
        moves: how many times the cap moved since the start.
        probes: how many probes ended (a move, a kept cap, or a fall in load).
        last_probe: one sentence on how the last probe ended (for a DEBUG log), or ``""``.
    """

    def __init__(self, limit: int, start: int, *, live: bool, reason: str,
                 fits: Callable[[int], bool] = lambda rows: True,
                 engine: Callable[[int], float] | None = None) -> None:
        self.limit = max(limit, 1)
        self.value = min(max(start, 1), self.limit) if live else self.limit
        self.live = live
        self.reason = reason
        self.moves = 0
        self.probes = 0
        self.last_probe = ""
        self._fits = fits
        self._engine = engine
        self._every = PROBE_EVERY
        self._since = 0  # batches of at least half the cap since the last probe
        self._up = True  # the direction of the next probe
        self._candidate: int | None = None  # the size a probe tries (None: no probe)
        self._turn = 0  # whose phase it is: even the candidate's, odd the cap's
        self._phase = _Phase()
        self._pending = 0.0  # log rows/s of the candidate's phase awaiting its pair
        self._diffs: list[float] = []  # per pair: log(candidate rows/s) − log(cap rows/s)
        self._phase_no = 0  # counts phases and probes: a batch decided in another one is not counted

    @property
    def phase(self) -> int:
        """The probe phase a batch decided now is for: pass it back to :meth:`observe` with the
        batch. A batch decided before the phase switched (one staged behind the running batch,
        or running on another slot) ran at the other phase's size and must not count in this one."""
        return self._phase_no

    def for_batch(self, queued_rows: int) -> int:
        """The cap for the next batch, with ``queued_rows`` rows waiting: the cap in force, or
        during a probe the size whose phase it is. A probe starts only while half the cap's rows
        wait (a shorter queue runs whole under either size, so nothing would be learned), and
        tries a larger size only while more rows wait than the cap allows."""
        if self._candidate is None:
            if not self.live or 2 * queued_rows < self.value or self._since < self._every:
                return self.value
            self._start_probe(grow=queued_rows > self.value)
            if self._candidate is None:
                return self.value
        return self._candidate if self._turn % 2 == 0 else self.value

    def observe(self, rows: int, start: float, end: float, phase: int | None = None) -> None:
        """A batch of ``rows`` rows ran from ``start`` to ``end`` (monotonic seconds): part of a
        probe's phase, or one more batch towards the next probe. ``phase``: :attr:`phase` when the
        batch was decided (``None``: now). A batch decided in an earlier phase is not counted, and
        the phase it ran into starts at its end (its time was the other size's)."""
        if not self.live:
            return
        if self._candidate is None:
            if 2 * rows >= self.value:
                self._since += 1
            return
        if phase is not None and phase != self._phase_no:
            if self._phase.rows == 0 and self._phase.first < math.inf:
                self._phase.first = max(self._phase.first, end)
            return
        sizes = (self._candidate, self.value)
        phase = self._phase.add(rows, start, end)
        if phase.rows < PHASE_BATCHES * max(sizes):
            return
        self._phase = _Phase(since=end)  # phases tile the time: the idle between them counts too
        if 2 * phase.largest < min(sizes) or phase.seconds <= 0:
            self._end_probe(None, "the load fell: neither size limits the batches")
            return
        rate = math.log(phase.rows / phase.seconds)
        self._phase_no += 1
        if self._turn % 2 == 0:
            self._pending = rate
        else:
            self._diffs.append(self._pending - rate)  # log of candidate rows/s over the cap's, one pair
        self._turn += 1
        if self._turn % 2 == 0 and len(self._diffs) >= PROBE_PAIRS:
            verdict = self._verdict()
            if verdict is not None or len(self._diffs) >= PROBE_MAX_PAIRS:
                self._conclude(verdict)

    def _start_probe(self, *, grow: bool) -> None:
        up = min(self.value * 2, self.limit)
        down = max(self.value // 2, 1)
        options = [up if grow and up > self.value and self._fits(up) else None, down if down < self.value else None]
        if not self._up:
            options.reverse()
        candidate = next((c for c in options if c is not None), None)
        self._since = 0
        if candidate is None:
            return
        self._up = candidate > self.value
        self._candidate, self._turn, self._phase, self._diffs = candidate, 0, _Phase(), []
        self._phase_no += 1

    def _verdict(self) -> bool | None:
        """Whether the pairs so far say to move to the candidate (True), to keep the cap (False),
        or neither yet (None): a paired comparison of log rows/s, each pair's phases run back to
        back so that what else the machine does weighs on both. Up moves when the candidate is faster
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

    def _engine_agrees(self, candidate: int) -> bool:
        """Whether the learned curve runs ``candidate`` rows more than :data:`GAIN` more rows per
        engine-second than the cap (a larger candidate), or at least 1 − :data:`GAIN` as many."""
        if self._engine is None:
            return True
        ratio = self._engine(candidate) / max(self._engine(self.value), 1e-12)
        return ratio > 1 + GAIN if candidate > self.value else ratio >= 1 - GAIN

    def _conclude(self, verdict: bool | None) -> None:
        """End the probe on the pairs' ``verdict`` (:meth:`_verdict`), asking the engine's curve
        before a move."""
        candidate = self._candidate
        assert candidate is not None
        gain = math.exp(statistics.fmean(self._diffs)) - 1
        evidence = f"{gain:+.0%} rows/s over {len(self._diffs)} pairs of phases"
        served = f"{candidate} rows against {self.value}: {evidence}"
        if not verdict:
            self._end_probe(None, f"{served}, {'not clear' if verdict is None else 'not enough'}")
        elif not self._engine_agrees(candidate):
            assert self._engine is not None
            curve = self._engine(candidate) / max(self._engine(self.value), 1e-12) - 1
            self._end_probe(None, f"{served}, but the engine's curve gives {curve:+.0%} rows per engine-second")
        else:
            way = "grew" if candidate > self.value else "shrank"
            self.reason = f"{way} from {self.value} to {candidate} rows while serving: {evidence} served in turn"
            self._end_probe(candidate, served)

    def _end_probe(self, move: int | None, why: str) -> None:
        self._candidate = None
        self._phase_no += 1
        self.probes += 1
        self.last_probe = f"{'moved' if move else 'kept'}: {why}"
        if move is None:
            self._every = min(self._every * 2, PROBE_MAX_EVERY)
            self._up = not self._up
            return
        self.value, self.moves, self._every = move, self.moves + 1, PROBE_EVERY
        self._since = self._every  # go on in the same direction at once


class _Phase:
    """The batches of one phase of a probe: rows, the largest batch, and the time it spans: from
    the end of the phase before it (``since``; the first phase: its first batch's start) to its
    last batch's end."""

    def __init__(self, since: float = math.inf) -> None:
        self.rows = 0
        self.largest = 0
        self.first = since
        self.last = -math.inf

    def add(self, rows: int, start: float, end: float) -> _Phase:
        self.rows += rows
        self.largest = max(self.largest, rows)
        self.first, self.last = min(self.first, start), max(self.last, end)
        return self

    @property
    def seconds(self) -> float:
        return self.last - self.first


__all__ = ["CONFIDENCE", "GAIN", "PHASE_BATCHES", "PROBE_EVERY", "PROBE_MAX_EVERY", "PROBE_MAX_PAIRS",
           "PROBE_PAIRS", "BatchCap"]
