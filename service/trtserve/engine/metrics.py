"""Prometheus metrics and the numbers behind ModelStatistics.

Two sources, read only when asked (a scrape, a ModelStatistics call), so the request path
pays for one :meth:`RequestStats.record` per request and nothing else:

* :class:`RequestStats`: the outcome and duration of every request, recorded once by the front
  end that answered it when the answer is ready (per model and status code), plus deadlines finished late,
  refusals at admission by reason, answers in time (goodput) and the time of the last success.
* each model's :class:`~trtserve.batching.stats.DispatchStats`: batches, rows, queue and
  compute time, padding, expired requests, updated by its dispatcher.

:class:`TrtServeCollector` turns both into Prometheus families at scrape time, on the HTTP
server's thread, without locks (see :mod:`trtserve.batching.stats`). Each server has its
own :class:`~prometheus_client.CollectorRegistry`, so one process can run several servers.

Labels: ``model`` is the model's name; ``version`` the model version a dispatcher serves (one
series per served version, as Triton's metrics carry model and version). The request series
(answered requests, durations, refusals, deadlines, goodput) are per model only: they are counted
by the front ends, and a request can fail before any version is chosen (an unknown version, a
refusal at admission). Counters never go backwards: a version's counters carry on across a reload
with a changed config, a version removed and added back, and an unload and a load
(:attr:`ModelRegistry.stats <trtserve.engine.registry.ModelRegistry.stats>`); a version no longer
served leaves the scrape (its per-version series stop) and picks up where it stopped if it comes back.

Every family, with its type, labels and help text, is listed in ``docs/reference/metrics.md``,
generated from :class:`TrtServeCollector` by ``tools/reference_docs.py`` (``make docs``); beyond
that page, ``trtserve_model_ready`` has version ``""`` for a model that serves none.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric

from trtserve.batching.stats import DURATION_BUCKETS, DispatchStats, Histogram
from trtserve.clock import Clock, wall_time_ns
from trtserve.engine.metric_families import FAMILIES, families
from trtserve.ipc.messages import UNKNOWN_MODEL, ModelState

if TYPE_CHECKING:
    from trtserve.batching.dispatcher import Dispatcher
    from trtserve.engine.registry import ModelRegistry

REFUSALS = ("queue_full", "queue_wait", "deadline_unmeetable", "inflight_bound", "window")
"""The ``reason`` labels of ``trtserve_rejected_total`` (``TrtServeError.refusal``)."""

BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds (rows) of the ``trtserve_batch_size_rows`` histogram."""


@dataclass
class ModelRequests:
    """One model's requests as the front ends answered them.

    Attributes:
        by_code: gRPC status name → durations (seconds, from decode to encoded response).
        finished_late: requests answered OK after their deadline had passed.
        on_time: requests answered OK by their deadline (or without one): the goodput.
        refused: refusal reason (``TrtServeError.refusal``) → requests refused at admission.
        refused_on_deadline: requests a front end refused DEADLINE_EXCEEDED before they crossed
            to the engine core (their deadline came before a batch of one could finish).
        last_success: clock time of the last successful answer (``None`` before one).
    """

    by_code: dict[str, Histogram] = field(default_factory=dict)
    finished_late: int = 0
    on_time: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    refused_on_deadline: int = 0
    last_success: float | None = None

    def totals(self) -> tuple[tuple[int, float], tuple[int, float]]:
        """((success count, seconds), (failure count, seconds))."""
        ok_n, ok_s, fail_n, fail_s = 0, 0.0, 0, 0.0
        for code, hist in list(self.by_code.items()):
            counts, seconds = hist.snapshot()
            if code == "OK":
                ok_n, ok_s = ok_n + sum(counts), ok_s + seconds
            else:
                fail_n, fail_s = fail_n + sum(counts), fail_s + seconds
        return (ok_n, ok_s), (fail_n, fail_s)


class RequestStats:
    """Outcome and duration of every request, per model. Updated only on the event loop.

    Args:
        clock: the clock request durations are measured on (for ``last_inference``).
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.models: dict[str, ModelRequests] = {}

    def _entry(self, model: str) -> ModelRequests:
        entry = self.models.get(model)
        if entry is None:
            entry = self.models[model] = ModelRequests()
        return entry

    def record(
        self, model: str, code: str, seconds: float, *, refusal: str | None = None, late: bool = False
    ) -> None:
        """Count one answered request of ``model`` with status ``code`` that took ``seconds``;
        ``refusal``: the reason it was refused at admission, if it was; ``late``: answered OK
        after its deadline (not goodput)."""
        entry = self._entry(model)
        hist = entry.by_code.get(code)
        if hist is None:
            hist = entry.by_code[code] = Histogram(DURATION_BUCKETS)
        hist.observe(seconds)
        if code == "OK":
            entry.last_success = self.clock.now()
            if late:
                entry.finished_late += 1
            else:
                entry.on_time += 1
        elif refusal is not None:
            entry.refused[refusal] += 1

    def refused_on_deadline(self, model: str, count: int = 1) -> None:
        """Count requests of ``model`` that a front end refused on their deadline before they
        crossed."""
        self._entry(model).refused_on_deadline += count

    def last_inference_ms(self, model: str) -> int:
        """Milliseconds since the Unix epoch of the model's last success (0 if none)."""
        entry = self.models.get(model)
        if entry is None or entry.last_success is None:
            return 0
        ago = self.clock.now() - entry.last_success
        return int(wall_time_ns() // 1_000_000 - ago * 1000)


def _histogram(
    family: HistogramMetricFamily, labels: list[str], counts: list[int], total: float, bounds: tuple[float, ...]
) -> None:
    cumulative, buckets = 0, []
    for bound, n in zip((*bounds, math.inf), counts):
        cumulative += n
        buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
    family.add_metric(labels, buckets, sum_value=total)


class TrtServeCollector:
    """Builds every ``trtserve_*`` family from the repository's dispatch stats and the
    request stats, at scrape time.

    Args:
        registry: the live model registry (the served models).
        requests: per-request outcomes the front ends reported.
        inflight: returns the requests being processed now.
        clock: for the busy ratio's window.
        frontends: returns front-end number → requests it has sent to the engine core.
    """

    def __init__(
        self, registry: ModelRegistry, requests: RequestStats, inflight: Callable[[], int], clock: Clock,
        frontends: Callable[[], dict[int, int]] = dict,
    ) -> None:
        self.registry = registry
        self.requests = requests
        self.inflight = inflight
        self.frontends = frontends
        self.clock = clock
        # (model, version) → (time, busy seconds) at the last scrape
        self._last_busy: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()  # two scrapes at once share _last_busy

    def collect(self) -> Iterator[Metric]:
        """Every family of :data:`~trtserve.engine.metric_families.FAMILIES`, built now (called
        by prometheus_client on each scrape)."""
        f = families(*FAMILIES)
        with self._lock:
            self._requests(f)
            self._models(f)
        f["trtserve_inflight_requests"].add_metric([], self.inflight())
        for index, count in sorted(self.frontends().items()):
            f["trtserve_frontend_requests"].add_metric([str(index)], count)
        yield from f.values()

    def _requests(self, f: dict[str, Metric]) -> None:
        count, duration = f["trtserve_requests"], f["trtserve_request_duration_seconds"]
        late: dict[str, int] = {}
        early: dict[str, int] = {}
        for model, entry in sorted(list(self.requests.models.items())):
            for code, hist in sorted(list(entry.by_code.items())):
                counts, total = hist.snapshot()
                count.add_metric([model, code], sum(counts))
                _histogram(duration, [model, code], counts, total, hist.bounds)
            late[model] = entry.finished_late
            early[model] = entry.refused_on_deadline
            if model != UNKNOWN_MODEL:
                refused = dict(entry.refused)
                for reason in REFUSALS:
                    f["trtserve_rejected"].add_metric([model, reason], refused.get(reason, 0))
                f["trtserve_goodput_requests"].add_metric([model], entry.on_time)
        before_run: Counter[str] = Counter()
        finished_late: Counter[str] = Counter()
        for (name, _version), stats in list(self.registry.stats.items()):  # every version ever served
            before_run[name] += stats.expired_before_run
            finished_late[name] += stats.finished_late
        deadline = f["trtserve_deadline_exceeded"]
        for name in sorted(self.registry.models):
            deadline.add_metric([name, "before_run"], before_run[name] + early.get(name, 0))
            # finished_late: the dispatcher answered DEADLINE_EXCEEDED while the batch ran, or
            # the answer was ready (OK) only after the deadline.
            deadline.add_metric([name, "finished_late"], finished_late[name] + late.get(name, 0))

    def _dispatchers(self) -> list[tuple[str, str, Dispatcher]]:
        """(name, version, dispatcher) of every served version, by name then version."""
        return [(name, version, served.dispatcher)
                for name, entry in sorted(list(self.registry.models.items()))
                for version, served in list(entry.versions.items())]

    def _models(self, f: dict[str, Metric]) -> None:
        now = self.clock.now()
        for name, entry in sorted(list(self.registry.models.items())):
            serving = entry.state is ModelState.READY
            for version, served in list(entry.versions.items()) or [("", None)]:
                healthy = served is not None and served.dispatcher.healthy
                f["trtserve_model_ready"].add_metric([name, version], 1.0 if serving and healthy else 0.0)
        for name, version, dispatcher in self._dispatchers():
            labels = [name, version]
            self._dispatch_stats(f, labels, dispatcher.stats)
            view = dispatcher.snapshot()
            for family, value in (
                ("trtserve_queue_depth", view.queued_requests), ("trtserve_queue_rows", view.queued_rows),
                ("trtserve_slots", view.slots), ("trtserve_slots_busy", view.busy_slots),
                ("trtserve_slots_unhealthy", view.unhealthy_slots), ("trtserve_arrival_rate_rows", view.arrival_rate),
                ("trtserve_batch_cap_rows", view.cap), ("trtserve_batch_cap_moves", view.cap_moves),
                ("trtserve_queue_drain_seconds", view.drain_s), ("trtserve_batch_host_seconds", view.host_overhead_s),
                ("trtserve_host_busy_ratio", view.host_busy_share),
            ):
                f[family].add_metric(labels, value)
            if math.isfinite(view.tight_budget_s):
                f["trtserve_deadline_budget_tight_seconds"].add_metric(labels, view.tight_budget_s)
            for length, curve in view.curve.items():
                for rows, seconds in curve.items():
                    f["trtserve_predicted_batch_seconds"].add_metric([*labels, str(rows), str(length)], seconds)
            busy = dispatcher.stats.compute_seconds
            then, busy_then = self._last_busy.get((name, version), (None, 0.0))
            if then is not None and now > then:
                ratio = (busy - busy_then) / (view.slots * (now - then))
                f["trtserve_slot_busy_ratio"].add_metric(labels, min(1.0, max(0.0, ratio)))
            self._last_busy[name, version] = (now, busy)

    @staticmethod
    def _dispatch_stats(f: dict[str, Metric], labels: list[str], stats: DispatchStats) -> None:
        """The families read from one version's counters (:class:`~trtserve.batching.stats.DispatchStats`)."""
        counts, total = stats.queue.snapshot()
        _histogram(f["trtserve_queue_duration_seconds"], labels, counts, total, stats.queue.bounds)
        counts, total = stats.compute.snapshot()
        _histogram(f["trtserve_compute_duration_seconds"], labels, counts, total, stats.compute.bounds)
        sizes = dict(stats.batch_sizes)
        per_bucket = [0] * (len(BATCH_ROW_BUCKETS) + 1)
        for size, runs in sizes.items():
            index = next((i for i, b in enumerate(BATCH_ROW_BUCKETS) if size <= b), len(BATCH_ROW_BUCKETS))
            per_bucket[index] += runs
        rows_run = float(sum(size * runs for size, runs in sizes.items()))
        _histogram(f["trtserve_batch_size_rows"], labels, per_bucket, rows_run, BATCH_ROW_BUCKETS)
        f["trtserve_slot_busy_seconds"].add_metric(labels, stats.compute_seconds)
        f["trtserve_padding_ratio"].add_metric(labels, stats.padding_ratio)
        f["trtserve_padding_elements"].add_metric(labels, stats.padded_elements - stats.real_elements)
        f["trtserve_batch_elements"].add_metric(labels, stats.padded_elements)
        f["trtserve_batches_staged"].add_metric(labels, stats.staged_batches)
        f["trtserve_dispatch_loop_failures"].add_metric(labels, stats.loop_failures)


class MetricsServer:
    """The ``/metrics`` HTTP endpoint of one server, on its own registry and thread.

    Args:
        collector: what to expose.
        host, port: where to listen (port 0: an ephemeral port, see :attr:`port`).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, collector: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host = host
        self.port: int = self._httpd.server_port

    def close(self) -> None:
        """Stop listening (a scrape in progress finishes)."""
        self._httpd.shutdown()
        self._httpd.server_close()
