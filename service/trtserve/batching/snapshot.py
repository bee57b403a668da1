"""What one dispatcher shows the rest of the server: a frozen record taken at one moment.

Metrics, ``trtserve profile`` and the front ends' view of a model read this record rather than
the dispatcher's queue, latency model and slots (as vLLM's scheduler hands out its stats), so
that the dispatcher's insides can change without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DispatchSnapshot:
    """One model version's dispatcher at one moment (:meth:`Dispatcher.snapshot
    <trtserve.batching.dispatcher.Dispatcher.snapshot>`).

    Attributes:
        queued_requests: requests waiting to run: in the queue, or staged behind a slot's
            running batch (not yet started on its thread).
        queued_rows: rows waiting to run, the same way.
        slots: execution slots (``instance_group`` count).
        busy_slots: slots running a batch now.
        unhealthy_slots: slots running one batch past the hang limit.
        healthy: not every slot is hung.
        arrival_rate: rows per second arriving, as the dispatcher estimates it.
        cap: the batch cap in force (rows).
        cap_live: whether the cap moves while serving (:mod:`trtserve.batching.cap`).
        cap_reason: one sentence: how the cap in force was set.
        cap_moves: times the cap moved while serving.
        drain_s: predicted seconds until everything queued now has started running.
        host_overhead_s: host CPU seconds per batch beside its engine run.
        host_busy_share: the event-loop thread's busy share, 0..1.
        tight_budget_s: the tight end of recent deadline budgets, seconds (``math.inf``: none).
        curve: padded length → batch rows → predicted run time of such a batch (seconds), at
            the measured buckets of the latency model.
    """

    queued_requests: int
    queued_rows: int
    slots: int
    busy_slots: int
    unhealthy_slots: int
    healthy: bool
    arrival_rate: float
    cap: int
    cap_live: bool
    cap_reason: str
    cap_moves: int
    drain_s: float
    host_overhead_s: float
    host_busy_share: float
    tight_budget_s: float
    curve: Mapping[int, Mapping[int, float]]


__all__ = ["DispatchSnapshot"]
