"""A front end's concurrency window: how many inference requests a transport lets in at once,
learned while serving from how close the requests it let in came to their deadlines.

Why a window and not a refusal: on a small model a refusal made in Python costs the server
nearly what an answer does (docs/concepts/overload.md, "the price of a refusal"), so past its
capacity a server that reads every request and refuses the excess spends its CPU refusing and
answers nothing in time. A transport that can leave a request unread (the HTTP door,
:mod:`trtserve.frontend.http.hold`) holds what is beyond the window at almost no cost and lets
it in as requests finish; what is held past its deadline is answered 504 by the transport.

The control law is Little's law closed by measurement, in the spirit of Envoy's adaptive
concurrency filter and Netflix's concurrency-limits (both measure latency and grow or shrink a
limit): the requests worth having in the server at once are its throughput × the time each may
spend there. Neither factor is known in advance (the throughput moves with the batch cap, the
machine's other load and the request mix; the deadlines are the callers'), so the window is
moved by what each admitted request shows: its *sojourn ratio*, the time from its arrival at
the door to its answer divided by its deadline budget (``trtserve-timeout-us``). Every
:attr:`ConcurrencyWindow.interval`, once at least :attr:`~ConcurrencyWindow.min_samples`
requests were answered in it:

* the 90th percentile ratio above :attr:`~ConcurrencyWindow.high` (0.8): the requests let in
  come close to their deadlines, so the server holds more than it can answer in time: the
  window shrinks by :attr:`~ConcurrencyWindow.shrink` (× 0.8, not below ``floor``);
* below :attr:`~ConcurrencyWindow.low` (0.5) while requests were held in the interval: the
  window is what keeps them out, and those let in finish well inside their deadlines: it grows
  by :attr:`~ConcurrencyWindow.grow` (× 1.25, at least +1, not above ``ceiling``);
* in between, it stays.

Requests without a deadline give no ratio. While requests are held and no ratio says the
admitted ones are late, the window grows on each interval, so a server whose callers set no
deadlines ends up with no effective window (as no deadline means the caller will wait). The
rule moves multiplicatively on purpose: a step of a quarter of the window reaches any size in a
handful of intervals (8 → 63 in ten, a second), and the dead band between the two thresholds
keeps it still under the noise of a shared machine. Requests held and then answered 504 are
not samples: they say the server is full, which the window already knows.

Touched only from the event loop's thread; the clock is injected (monotonic seconds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_START = 64
"""The window before anything is measured (requests)."""


class ConcurrencyWindow:
    """The number of inference requests a front end's transport lets in at once (see the
    module docstring for the control law).

    Args:
        clock: monotonic seconds.
        start: the first window (requests).
        floor: the least window (requests): below it a batching engine would run starved.
        ceiling: the largest window (requests).
        interval: seconds between two decisions (a decision waits for ``min_samples``).

    Attributes:
        limit: the window in force (requests).
        moves: how many times it moved.
        reason: why it has its value, in words (logged at each move).

    Raises:
        ValueError: ``floor`` < 1, ``start`` outside ``floor..ceiling``, or ``interval`` <= 0.
    """

    low = 0.5
    """Ratio (90th percentile of sojourn ÷ deadline budget) under which the window may grow."""
    high = 0.8
    """Ratio above which the window shrinks."""
    grow = 1.25
    """Factor of a growth step (at least one request more)."""
    shrink = 0.8
    """Factor of a shrink step."""
    min_samples = 8
    """Fewest answered requests a decision reads (the ratios are those of them with a deadline)."""

    def __init__(self, clock: Callable[[], float], *, start: int = DEFAULT_START, floor: int = 2,
                 ceiling: int = 65536, interval: float = 0.1) -> None:
        if floor < 1 or not floor <= start <= ceiling:
            raise ValueError(f"the window needs 1 <= floor <= start <= ceiling, got {floor}, {start}, {ceiling}")
        if not interval > 0:
            raise ValueError(f"the window's interval must be > 0 seconds, got {interval}")
        self.clock = clock
        self.floor, self.ceiling, self.interval = floor, ceiling, interval
        self.limit = start
        self.moves = 0
        self.reason = "the starting window, before any request was measured"
        self._ratios: list[float] = []
        self._done = 0  # requests answered since the last decision
        self._held = False
        self._since = clock()

    def observe(self, sojourn: float, budget: float) -> None:
        """One admitted request answered after ``sojourn`` seconds in the server (arrival at
        the door to answer) with a deadline budget of ``budget`` seconds (``math.inf``: it had
        no deadline, and gives no ratio)."""
        self._done += 1
        if math.isfinite(budget) and budget > 0:
            self._ratios.append(sojourn / budget)
        self._decide()

    def held(self) -> None:
        """A request arrived while the window was full (and was held)."""
        self._held = True

    def _decide(self) -> None:
        now = self.clock()
        if now - self._since < self.interval or self._done < self.min_samples:
            return  # too soon, or too few answers to tell
        ratios = self._ratios
        p90 = sorted(ratios)[int(0.9 * (len(ratios) - 1))] if ratios else 0.0
        old = self.limit
        if ratios and p90 > self.high:
            self.limit = max(self.floor, int(old * self.shrink))
            why = f"shrank: 90% of the requests let in used up to {p90:.0%} of their deadlines"
        elif self._held and p90 < self.low:
            self.limit = min(self.ceiling, max(old + 1, int(old * self.grow)))
            why = (f"grew: requests waited for the window while those let in used at most {p90:.0%} of their "
                   f"deadlines" if ratios else "grew: requests waited for the window and none let in had a deadline")
        else:
            why = ""
        if self.limit != old:
            self.moves += 1
            self.reason = f"{why} ({old} -> {self.limit} requests)"
            log.debug("concurrency window %s", self.reason)
        self._ratios = []
        self._done = 0
        self._held = False
        self._since = now


__all__ = ["DEFAULT_START", "ConcurrencyWindow"]
