"""What one batch costs the host, and how busy the host is: the dispatcher's second resource.

A batch costs the engine its run time (:mod:`~trtserve.batching.latency`) and costs the *host* — the event-loop
thread the dispatcher runs on — a roughly fixed amount of CPU: deciding, taking the rows off
the queue, creating the batch's task, the hand-off to the slot's thread and back, and
scattering the outputs to the callers (in the process tree also the IPC to the front ends).
On a fast engine (a small MLP that runs in tens of microseconds) this per-batch cost dwarfs the
run itself, and the same thread must also read the incoming requests; so running many tiny
batches starves ingress, and waiting for a few more rows pays although the slot is free. At
low load the host has room, so a lone request still runs at once.

:class:`HostMeter` measures both, from one CPU-time counter of the loop thread
(:func:`time.thread_time` in production, the simulated host's busy time in the simulator):

* **per batch** (:attr:`HostMeter.per_batch`, seconds of CPU): the counter's advance across
  the dispatcher's own per-batch code — the loop iteration that decided and launched the
  batch, the call into the backend up to its first suspension, and the code after the run
  that records and delivers the outputs — as an exponentially weighted mean (weight
  ``alpha``). CPU the slot's thread spends outside the engine call (packing) and the
  callers' own wake-ups are not in it: they are per row, not per batch.
* **busy share** (:meth:`HostMeter.share`): the counter's advance over wall time in windows
  of ``window`` seconds, smoothed across windows (1.0 = the thread never rested); and the part
  of it the per-batch work explains, (batches in the window) × ``per_batch`` / window.

Not thread-safe: updated and read only from the dispatcher's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class HostMeter:
    """Per-batch host CPU (seconds) and the host thread's busy share over recent windows.

    Args:
        cpu: CPU seconds used so far by the thread the dispatcher runs on (monotonic).
        window: seconds of wall time per busy-share measurement.
        alpha: weight of a new per-batch sample, and of a new window in the busy share (0..1].
    """

    def __init__(
        self, cpu: Callable[[], float] = time.thread_time, *, window: float = 0.01, alpha: float = 0.5
    ) -> None:
        if not window > 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.cpu = cpu
        self.window = window
        self.alpha = alpha
        self.per_batch = 0.0
        self._busy = 0.0
        self._batch_busy = 0.0
        self._at: float | None = None
        self._cpu_at = 0.0
        self._batches = 0

    def observe_batch(self, seconds: float) -> None:
        """Record that one batch cost the host ``seconds`` of CPU (beside its engine run)."""
        if self._batches == 0 and self.per_batch == 0.0:
            self.per_batch = seconds
        else:
            self.per_batch += self.alpha * (seconds - self.per_batch)
        self._batches += 1

    @property
    def busy(self) -> float:
        """The busy share as of the last closed window, read without closing one (safe to read
        from another thread, e.g. a metrics scrape: a float read)."""
        return self._busy

    def share(self, now: float) -> tuple[float, float]:
        """(busy share, per-batch share) of the host thread over the recent windows, each a
        fraction of wall time (the first may exceed 1 where the counter runs ahead of the
        clock, as a simulated host with a backlog does); ``now`` in monotonic seconds. Closes
        the current window once ``window`` seconds have passed."""
        if self._at is None:
            self._at, self._cpu_at, self._batches = now, self.cpu(), 0
            return self._busy, self._batch_busy
        span = now - self._at
        if span >= self.window:
            used = self.cpu()
            # A long idle gap is one window of (near) zero: it resets the shares at once.
            weight = 1.0 if span > 10 * self.window else self.alpha * span / self.window
            weight = min(weight, 1.0)
            self._busy += weight * ((used - self._cpu_at) / span - self._busy)
            self._batch_busy += weight * (self._batches * self.per_batch / span - self._batch_busy)
            self._at, self._cpu_at, self._batches = now, used, 0
        return self._busy, self._batch_busy
