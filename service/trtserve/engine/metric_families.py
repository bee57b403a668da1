"""Every Prometheus family trtserve exports, in one table: name, type, labels and help.

:class:`~trtserve.engine.metrics.TrtServeCollector` fills fresh families from this table at each
scrape (:func:`families`); ``docs/reference/metrics.md`` is generated from what it exports
(``make docs``). Counter names are written without ``_total`` (prometheus_client adds it).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

VERSIONED = ("model", "version")
"""The labels of the per-version series (one per served version of a model)."""


class Family(NamedTuple):
    """One family: its Prometheus type, label names and help text."""

    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...]
    help: str


FAMILIES: dict[str, Family] = {
    # -- per front end and per request (counted by the front ends, per model) --
    "trtserve_inflight_requests": Family(
        "gauge", (), "Requests being processed now (unary and stream messages)."),
    "trtserve_frontend_requests": Family(
        "counter", ("frontend",), "Requests each front end sent to the engine core."),
    "trtserve_requests": Family(
        "counter", ("model", "code"), "Requests answered, by model and gRPC status code."),
    "trtserve_request_duration_seconds": Family(
        "histogram", ("model", "code"), "Time from decoding a request to its encoded answer."),
    "trtserve_deadline_exceeded": Family(
        "counter", ("model", "when"),
        "Requests past their deadline: answered DEADLINE_EXCEEDED before running (before_run) "
        "or answered after the deadline (finished_late)."),
    "trtserve_rejected": Family(
        "counter", ("model", "reason"),
        "Requests refused at admission, before queueing: queue_full (max_queue_size), queue_wait (the predicted "
        "queue wait leaves no time before the deadline), deadline_unmeetable (not even an idle server could), "
        "inflight_bound (the front end held --max-inflight-rpcs requests in progress), window (the HTTP door held "
        "the request beyond its concurrency window until its deadline passed; answered 504)."),
    "trtserve_goodput_requests": Family(
        "counter", ("model",), "Requests answered OK within their deadline (or without one)."),
    # -- per served version (its dispatcher) --
    "trtserve_queue_duration_seconds": Family(
        "histogram", VERSIONED, "Time from queueing a request to its first rows running."),
    "trtserve_compute_duration_seconds": Family("histogram", VERSIONED, "Engine run time of one batch."),
    "trtserve_batch_size_rows": Family("histogram", VERSIONED, "Rows per engine run."),
    "trtserve_queue_depth": Family("gauge", VERSIONED, "Requests waiting to run (queued or staged)."),
    "trtserve_queue_rows": Family("gauge", VERSIONED, "Rows waiting to run (queued or staged)."),
    "trtserve_slots": Family("gauge", VERSIONED, "Execution slots (instance_group count)."),
    "trtserve_slots_busy": Family("gauge", VERSIONED, "Execution slots running a batch now."),
    "trtserve_slot_busy_seconds": Family("counter", VERSIONED, "Engine run time summed over every slot."),
    "trtserve_slot_busy_ratio": Family(
        "gauge", VERSIONED,
        "Share of slot time spent running batches since the previous scrape "
        "(rate(trtserve_slot_busy_seconds_total[w]) / trtserve_slots for a fixed window)."),
    "trtserve_padding_ratio": Family(
        "gauge", VERSIONED, "Share of the elements run that were padding, since the version first loaded."),
    "trtserve_padding_elements": Family("counter", VERSIONED, "Input elements run that were padding."),
    "trtserve_batch_elements": Family("counter", VERSIONED, "Input elements run, padding included."),
    "trtserve_model_ready": Family(
        "gauge", VERSIONED, "1 when the model serves (loaded, and not every slot hung), else 0."),
    "trtserve_slots_unhealthy": Family(
        "gauge", VERSIONED, "Execution slots running one batch past the hang limit."),
    "trtserve_predicted_batch_seconds": Family(
        "gauge", (*VERSIONED, "rows", "length"),
        "The latency model: predicted run time of a batch of `rows` rows padded to `length` (measured buckets)."),
    "trtserve_arrival_rate_rows": Family(
        "gauge", VERSIONED, "Rows per second arriving, as the dispatcher estimates it."),
    "trtserve_batch_cap_rows": Family(
        "gauge", VERSIONED,
        "The batch cap in force: most rows a batch may take (max_batch_size, or the live cap below it)."),
    "trtserve_batches_staged": Family(
        "counter", VERSIONED,
        "Batches handed to a busy execution slot to run as soon as its batch returned (staging: no idle "
        "slot between full batches)."),
    "trtserve_dispatch_loop_failures": Family(
        "counter", VERSIONED,
        "Times the dispatch loop raised (a bug, logged with its traceback): the requests it held were answered "
        "INTERNAL and the loop started again. Alert on any."),
    "trtserve_batch_cap_moves": Family(
        "counter", VERSIONED, "Times the live batch cap moved while serving (each move is logged with why)."),
    "trtserve_queue_drain_seconds": Family(
        "gauge", VERSIONED,
        "Predicted time until every queued row and running batch is done, at the slow end of the measured run "
        "times (what admission compares with deadlines behind a queue)."),
    "trtserve_batch_host_seconds": Family(
        "gauge", VERSIONED,
        "Measured host CPU one batch costs beside its engine run (decide, launch, hand-off, deliver): "
        "the per-batch cost the adaptive policy weighs against waiting."),
    "trtserve_host_busy_ratio": Family(
        "gauge", VERSIONED, "Busy share (CPU / wall) of the engine core's event-loop thread, recent windows."),
    "trtserve_deadline_budget_tight_seconds": Family(
        "gauge", VERSIONED,
        "The tight end (10th percentile) of recent requests' deadline budgets (deadline - arrival); "
        "batches are capped so that such a request arriving during one is still answered in time. "
        "Absent while most carry none."),
}

_BUILD = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}


def families(*names: str) -> dict[str, Metric]:
    """Fresh, empty families of ``names`` (keys of :data:`FAMILIES`), for one scrape.

    Raises:
        KeyError: a name not in the table.
    """
    built: dict[str, Metric] = {}
    for name in names:
        f = FAMILIES[name]
        built[name] = _BUILD[f.kind](name, f.help, labels=list(f.labels))
    return built


__all__ = ["FAMILIES", "VERSIONED", "Family", "families"]
