"""Metrics and ModelStatistics (issue 8): after a known workload every counter, histogram and
gauge of the Prometheus endpoint holds the numbers the dispatcher saw, ModelStatistics the same;
queue-full refusals, late answers and busy slots are counted; separate servers count apart.

In-process servers (``ServerThread``) with an ONNX identity and slow Python models.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from integration.helpers import row, sample, scrape, write_identity, write_slow
from servers import code_of
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request


@pytest.fixture
def metrics_server(make_server, tmp_path):
    write_identity(tmp_path)
    write_slow(tmp_path, "late", batch_ms=5, late_s=0.4)
    write_slow(tmp_path, "one", max_batch_size=1, batch_ms=300, queue="default_queue_policy { max_queue_size: 1 }")
    return make_server(tmp_path, metrics_port=0)


def test_metrics_after_a_known_workload(metrics_server):
    srv = metrics_server
    stats = srv.registry.get("ident").dispatcher.stats
    lengths = [3, 5, 3, 8, 1, 5, 2, 7, 4, 6]
    with srv.client() as c:
        for n in lengths:
            c.infer("ident", row(n))
        streamed = dict(c.stream_infer("ident", (row(n) for n in lengths)))
        bad = pb.ModelInferRequest(model_name="ident")
        bad.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2]).contents.int_contents.extend([1, 2])
        assert code_of(c.stub.ModelInfer, bad) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(c.stub.ModelInfer, build_request("nope", row(1))) == grpc.StatusCode.NOT_FOUND
        expired = build_request("ident", row(2), timeout_us=1)
        assert code_of(c.stub.ModelInfer, expired) == grpc.StatusCode.DEADLINE_EXCEEDED
        statistics = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="ident")).model_stats[0]
    assert len(streamed) == len(lengths)
    m = scrape(srv.metrics_at())

    ok = 2 * len(lengths)
    assert sample(m, "trtserve_requests_total", model="ident", code="OK") == ok
    assert sample(m, "trtserve_requests_total", model="ident", code="INVALID_ARGUMENT") == 1
    assert sample(m, "trtserve_requests_total", model="ident", code="DEADLINE_EXCEEDED") == 1
    assert sample(m, "trtserve_requests_total", model="_unknown", code="NOT_FOUND") == 1
    assert sample(m, "trtserve_request_duration_seconds_count", model="ident", code="OK") == ok
    assert sample(m, "trtserve_request_duration_seconds_bucket", model="ident", code="OK", le="+Inf") == ok
    assert sample(m, "trtserve_deadline_exceeded_total", model="ident", when="before_run") == 1
    assert sample(m, "trtserve_deadline_exceeded_total", model="ident", when="finished_late") == 0
    # The dispatcher's view: every batch and row (warm-up excluded), and no padding left out.
    assert sample(m, "trtserve_batch_size_rows_count", model="ident", version="1") == stats.batches > 0
    assert sample(m, "trtserve_batch_size_rows_sum", model="ident", version="1") == stats.rows == ok
    assert sample(m, "trtserve_compute_duration_seconds_count", model="ident", version="1") == stats.batches
    real = 2 * sum(lengths)
    elements = sample(m, "trtserve_batch_elements_total", model="ident", version="1")
    assert elements - sample(m, "trtserve_padding_elements_total", model="ident", version="1") == real
    assert sample(m, "trtserve_padding_ratio", model="ident", version="1") == pytest.approx(1 - real / elements)
    assert sample(m, "trtserve_queue_depth", model="ident", version="1") == 0
    assert sample(m, "trtserve_slots", model="ident", version="1") == 1
    assert sample(m, "trtserve_model_ready", model="ident", version="1") == 1
    assert sample(m, "trtserve_slots_unhealthy", model="ident", version="1") == 0
    assert sample(m, "trtserve_inflight_requests") == 0
    # The latency model, as the dispatcher sees it: "one" sleeps 300 ms per batch (warm-up rows
    # are 16 long), and the batch cap is the configured max_batch_size.
    assert 0.29 < sample(m, "trtserve_predicted_batch_seconds", model="one", version="1", rows="1", length="16") < 0.6
    assert sample(m, "trtserve_batch_cap_rows", model="one", version="1") == 1
    assert ("trtserve_arrival_rate_rows", (("model", "ident"), ("version", "1"))) in m
    # ModelStatistics carries the same numbers.
    infer = statistics.inference_stats
    assert infer.success.count == ok and infer.success.ns > 0
    assert infer.fail.count == 2  # INVALID_ARGUMENT and DEADLINE_EXCEEDED
    assert statistics.inference_count == stats.rows and statistics.execution_count == stats.batches
    assert sum(b.compute_infer.count for b in statistics.batch_stats) == stats.batches
    assert abs(statistics.last_inference / 1000 - time.time()) < 60
    # Every answered request was queued and ran once: the dispatcher's stats hooks are wired (a
    # count of 0 here means it stopped calling them, and fails, not skips).
    assert sample(m, "trtserve_queue_duration_seconds_count", model="ident", version="1") == ok == infer.queue.count
    assert infer.compute_infer.count == ok


def test_queue_full_late_answers_and_busy_slots_are_counted(metrics_server):
    srv = metrics_server
    port = srv.metrics_at()
    scrape(port)  # starts the busy-ratio window
    with srv.client() as c, ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda _: code_of(c.infer, "one", row(2)), range(6)))
        # 7 makes the model overrun the 150 ms the caller allows: DEADLINE_EXCEEDED at the
        # deadline while the batch still runs, counted as finished late.
        late = build_request("late", row(2, 7.0), timeout_us=150_000)
        assert code_of(c.stub.ModelInfer, late) == grpc.StatusCode.DEADLINE_EXCEEDED
    m = scrape(port)
    rejected = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert rejected >= 1 and codes.count(grpc.StatusCode.OK) == 6 - rejected
    assert sample(m, "trtserve_rejected_total", model="one", reason="queue_full") == rejected
    assert sample(m, "trtserve_requests_total", model="one", code="RESOURCE_EXHAUSTED") == rejected
    assert sample(m, "trtserve_deadline_exceeded_total", model="late", when="finished_late") == 1
    assert sample(m, "trtserve_slot_busy_seconds_total", model="one", version="1") >= 0.3 * (6 - rejected) * 0.9
    assert 0 < sample(m, "trtserve_slot_busy_ratio", model="one", version="1") <= 1


def test_separate_servers_have_separate_registries(make_server, tmp_path):
    write_identity(tmp_path)
    a, b = make_server(tmp_path, metrics_port=0), make_server(tmp_path, metrics_port=0)
    with a.client() as c:
        c.infer("ident", row(3))
    assert sample(scrape(a.metrics_at()), "trtserve_requests_total", model="ident", code="OK") == 1
    assert sample(scrape(b.metrics_at()), "trtserve_requests_total", model="ident", code="OK") == 0
