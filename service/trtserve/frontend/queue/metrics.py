"""The queue door's Prometheus metrics: one :class:`QueueMetrics` per door, a collector the
server's ``/metrics`` registry takes (:meth:`CollectorRegistry.register
<prometheus_client.CollectorRegistry.register>`; ``trtserve serve --frontends 1`` registers it).

=======================================  =========  ==============  ===============================================
family                                   type       labels          what
=======================================  =========  ==============  ===============================================
trtserve_queue_pickup_delay_seconds      histogram  model           Redis's time at the read minus the entry id's
trtserve_queue_lag_entries               gauge      model           entries of the stream not yet read by the group
trtserve_queue_pending_entries           gauge      model           entries read by the group and not yet acked
trtserve_queue_held_entries              gauge      model           entries this door holds now (its credit in use)
trtserve_queue_redelivered_total         counter    model           entries reclaimed from an idle consumer
trtserve_queue_expired_total             counter    model           answered DEADLINE_EXCEEDED (never run)
trtserve_queue_dead_lettered_total       counter    model, reason   moved to the dead-letter stream (``garbage``:
                                                                    unreadable; ``deliveries``: too many tries)
=======================================  =========  ==============  ===============================================

Lag and pending are the group's (every consumer's), read from ``XINFO GROUPS`` by each door
every reclaim tick; the others count this door's work.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import Metric

PICKUP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of ``trtserve_queue_pickup_delay_seconds``."""


class QueueMetrics:
    """The queue door's metric families (the module docstring's table); a Prometheus collector."""

    def __init__(self) -> None:
        self.pickup_delay = Histogram("trtserve_queue_pickup_delay_seconds",
                                      "Time from the entry id (Redis's clock) to the door reading the entry",
                                      ["model"], buckets=PICKUP_BUCKETS, registry=None)
        self.lag = Gauge("trtserve_queue_lag_entries", "Entries of the model's stream the group has not read yet",
                         ["model"], registry=None)
        self.pending = Gauge("trtserve_queue_pending_entries",
                             "Entries the group has read and not acknowledged", ["model"], registry=None)
        self.held = Gauge("trtserve_queue_held_entries", "Entries this door holds now (its credit in use)",
                          ["model"], registry=None)
        self.redelivered = Counter("trtserve_queue_redelivered", "Entries reclaimed from an idle consumer",
                                   ["model"], registry=None)
        self.expired = Counter("trtserve_queue_expired", "Entries answered DEADLINE_EXCEEDED without running",
                               ["model"], registry=None)
        self.dead_lettered = Counter("trtserve_queue_dead_lettered", "Entries moved to the dead-letter stream",
                                     ["model", "reason"], registry=None)
        self._all = (self.pickup_delay, self.lag, self.pending, self.held, self.redelivered, self.expired,
                     self.dead_lettered)

    def collect(self) -> Iterator[Metric]:
        """Every family, for a scrape."""
        for metric in self._all:
            yield from metric.collect()


__all__ = ["PICKUP_BUCKETS", "QueueMetrics"]
