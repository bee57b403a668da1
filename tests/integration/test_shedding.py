"""Load shedding (issue 16, items 1 and 4): what cannot finish in time is refused early and
cheaply, with the status that says why, and the refusals and goodput show in the metrics.

Real servers on 127.0.0.1 (``ServerThread``: the engine core and its front ends over ZeroMQ)
serving the probe model (``engines/slow``'s behaviour: every batch sleeps ``batch_ms``, the
warm-up too), so the latency model's low estimate is at least the sleep on any machine: a
loaded box only makes the queue slower, never a refusal wrong. Rows are 16 long, the warm-up's
length (the latency model scales an unmeasured length down). Deadlines are several times
what separates the outcomes.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from integration.helpers import free_port, sample, scrape
from reliability.casekit import row as probe_row
from reliability.casekit import wait_for, write_probe
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.batching.capacity import best_rows_per_second
from trtserve.client import Client, build_request
from trtserve.engine.lifecycle import ControlMode, LifecycleConfig
from trtserve.testing import ServerProcess


def row(rid: float):
    return probe_row(rid, 16)


def details_of(fn, *args, **kw) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args, **kw)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_deadline_too_short_is_refused_before_decoding_and_counted(make_server, tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=2000)
    srv = make_server(tmp_path, frontends=1, metrics_port=0)
    dispatcher = srv.registry.get("slow").dispatcher
    with srv.client() as c:
        c.infer("slow", row(1.0), timeout=30)  # the model's queue hint comes back with the answer
        crossed, refused = srv.core.frontend_requests[0], dispatcher.stats.expired_before_run
        # A 100 ms gRPC deadline, a 5 ms timeout parameter, and one whose tensor is malformed:
        # each is refused on its deadline before its tensors are read (no INVALID_ARGUMENT).
        # (Before decoding, a front end knows the least run time of a one-element row: 2 s / 16.)
        short = details_of(c.stub.ModelInfer, build_request("slow", row(2.0)), timeout=0.1)
        tiny = details_of(c.stub.ModelInfer, build_request("slow", row(3.0), timeout_us=5000))
        bad = build_request("slow", row(4.0), timeout_us=5000)
        bad.raw_input_contents[0] = b"\0" * 3
        malformed = details_of(c.stub.ModelInfer, bad)
        for code, details in (short, tiny, malformed):
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
            assert "a batch of one of model 'slow' takes at least" in details
        assert srv.core.frontend_requests[0] == crossed  # none reached the engine core
        # Once decoded, the engine core refuses what its rows cannot make: 1 s for 2 s of work.
        late = details_of(c.stub.ModelInfer, build_request("slow", row(5.0)), timeout=1.0)
        assert late[0] == grpc.StatusCode.DEADLINE_EXCEEDED and "even on an idle server" in late[1], late
        assert dispatcher.stats.expired_before_run == refused + 1
        assert srv.core.frontend_requests[0] == crossed + 1
    m = scrape(srv.metrics_at())
    assert sample(m, "trtserve_rejected_total", model="slow", reason="deadline_unmeetable") == 4
    assert sample(m, "trtserve_rejected_total", model="slow", reason="queue_wait") == 0
    assert sample(m, "trtserve_deadline_exceeded_total", model="slow", when="before_run") == 4
    assert sample(m, "trtserve_goodput_requests_total", model="slow") == 1


# Two priority levels: the load at level 1 is queued ahead of every request of level 2 (the
# default), whatever their deadlines.
URGENT = "priority_levels: 2 default_priority_level: 2"


def load_ahead(pool, c, n: int):
    """``n`` one-row requests at priority 1 with a minute to spare."""
    return [pool.submit(c.infer, "slow", row(10.0 + i), timeout=60, priority=1) for i in range(n)]


def test_behind_a_loaded_queue_a_short_deadline_is_refused_and_nothing_queued_is_lost(make_server, tmp_path):
    # 100 ms per batch of up to 4 rows: 40 queued rows are a second of work, on any machine.
    write_probe(tmp_path, "slow", max_batch_size=4, batch_ms=100, dynamic=URGENT)
    srv = make_server(tmp_path, frontends=2, metrics_port=0)
    dispatcher = srv.registry.get("slow").dispatcher
    with srv.client() as c, ThreadPoolExecutor(41) as pool:
        load = load_ahead(pool, c, 40)
        assert wait_for(lambda: dispatcher.queue.queued_rows >= 30, 10)
        drain = scrape(srv.metrics_at())
        # 200 ms could be met by an idle server (one batch: 100 ms), not behind this queue.
        code, details = details_of(c.stub.ModelInfer, build_request("slow", row(2.0)), timeout=0.2)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        match = re.search(r"overloaded: predicted queue wait ([0-9.]+) ms", details)
        assert match and float(match.group(1)) > 200, details
        assert "remaining" in details and "deadline" in details
        # The same request with room to wait is queued behind them and served.
        patient = pool.submit(c.infer, "slow", row(3.0), timeout=60)
        for i, f in enumerate(load):
            np.testing.assert_array_equal(f.result()["OUTPUT0"], row(10.0 + i)["INPUT0"])
        np.testing.assert_array_equal(patient.result()["OUTPUT0"], row(3.0)["INPUT0"])
    m = scrape(srv.metrics_at())
    # The queue's predicted drain time was at least its rows' share of full batches.
    assert sample(drain, "trtserve_queue_drain_seconds", model="slow", version="1") >= 30 * 0.1 / 4 * 0.9
    assert sample(m, "trtserve_queue_drain_seconds", model="slow", version="1") == 0
    # What the adaptive policy learned is shown beside it: host CPU per batch, deadline budgets.
    assert sample(m, "trtserve_batch_host_seconds", model="slow", version="1") > 0
    # (gRPC sends the 60 s timeout rounded up to what its header's few digits can say.)
    assert 0 < sample(m, "trtserve_deadline_budget_tight_seconds", model="slow", version="1") <= 61
    assert sample(m, "trtserve_rejected_total", model="slow", reason="queue_wait") == 1
    assert sample(m, "trtserve_goodput_requests_total", model="slow") == 41
    assert sample(m, "trtserve_requests_total", model="slow", code="RESOURCE_EXHAUSTED") == 1


def test_a_front_end_refuses_before_crossing_from_the_queue_hint(make_server, tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=4, batch_ms=100, dynamic=URGENT)
    srv = make_server(tmp_path, frontends=1, metrics_port=0)
    dispatcher = srv.registry.get("slow").dispatcher
    with srv.client() as c, ThreadPoolExecutor(41) as pool:
        first = pool.submit(c.infer, "slow", row(1.0), timeout=60, priority=1)
        assert wait_for(lambda: dispatcher.idle_slots == 0, 10)
        load = load_ahead(pool, c, 40)
        assert wait_for(lambda: dispatcher.queue.queued_rows >= 30, 10)
        # The next answer carries the queue behind it: at least 650 ms of work.
        answered = sum(f.done() for f in load)
        assert wait_for(lambda: sum(f.done() for f in load) > answered, 10)
        crossed = srv.core.frontend_requests[0]
        code, details = details_of(c.stub.ModelInfer, build_request("slow", row(2.0)), timeout=0.3)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "the model 'slow' is overloaded: predicted queue wait" in details
        assert srv.core.frontend_requests[0] == crossed  # refused without crossing
        # Nothing queued is lost: every one is answered with its own rows.
        np.testing.assert_array_equal(first.result()["OUTPUT0"], row(1.0)["INPUT0"])
        for i, f in enumerate(load):
            np.testing.assert_array_equal(f.result()["OUTPUT0"], row(10.0 + i)["INPUT0"])
    m = scrape(srv.metrics_at())
    assert sample(m, "trtserve_rejected_total", model="slow", reason="queue_wait") == 1


def running_then_queued(c, pool: ThreadPoolExecutor, dispatcher, n: int) -> list:
    """Send ``n`` calls of rows 1.0, 2.0, …: the first alone until its batch runs, then the rest,
    which queue behind it (sent at once, all of them could reach a busy engine core's queue before
    its loop takes the first, and overflow a queue sized for the others)."""
    held = [pool.submit(c.infer, "slow", row(1.0), timeout=60)]
    assert wait_for(lambda: dispatcher.idle_slots == 0 and not len(dispatcher.queue), 30)
    return held + [pool.submit(c.infer, "slow", row(1.0 + i), timeout=60) for i in range(1, n)]


def test_a_full_queue_is_refused_before_crossing(make_server, tmp_path):
    # 1.5 s a batch: the queue stays full far longer than the two calls below take.
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=1500, dynamic="default_queue_policy { max_queue_size: 2 }")
    srv = make_server(tmp_path, frontends=1, metrics_port=0)
    dispatcher = srv.registry.get("slow").dispatcher
    with srv.client() as c, ThreadPoolExecutor(3) as pool:
        held = running_then_queued(c, pool, dispatcher, 3)
        assert wait_for(lambda: dispatcher.idle_slots == 0 and len(dispatcher.queue) == 2, 10)
        # The engine core refuses the first one over and says, with the refusal, that the
        # queue stays full at least until the running batch ends; the front end refuses the next.
        crossed = srv.core.frontend_requests[0]
        first = details_of(c.infer, "slow", row(5.0), timeout=60)
        second = details_of(c.infer, "slow", row(6.0), timeout=60)
        assert first[0] == second[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue is full" in first[1] and "queue of model 'slow' is full" in second[1], (first, second)
        assert srv.core.frontend_requests[0] == crossed + 1
        for i, f in enumerate(held):  # the running one and the two queued are served, their own rows
            np.testing.assert_array_equal(f.result()["OUTPUT0"], row(1.0 + i)["INPUT0"])
    m = scrape(srv.metrics_at())
    assert sample(m, "trtserve_rejected_total", model="slow", reason="queue_full") == 2


def test_requests_beyond_the_inflight_bound_are_refused_while_health_and_statistics_answer(make_server, tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=500)
    srv = make_server(tmp_path, frontends=1, metrics_port=0, max_inflight_rpcs=3)
    with srv.client() as c, ThreadPoolExecutor(6) as pool:
        held = [pool.submit(c.infer, "slow", row(1.0 + i), timeout=60) for i in range(3)]
        assert wait_for(lambda: srv.admitted == 3, 10)
        over = [details_of(c.infer, "slow", row(9.0), timeout=60) for _ in range(3)]
        assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED and "already has 3 requests in progress" in d
                   and "--max-inflight-rpcs 3" in d for code, d in over), over
        # What an orchestrator or a dashboard asks is never counted against the bound.
        assert c.stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert c.stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        assert c.stub.ModelReady(pb.ModelReadyRequest(name="slow"), timeout=10).ready
        assert c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow"), timeout=10).model_stats
        health = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # A stream message beyond it is refused with its own id; the stream goes on.
        answers = list(c.stub.ModelStreamInfer(iter([build_request("slow", row(8.0), request_id="over")]), timeout=60))
        assert answers[0].infer_response.id == "over"
        assert answers[0].infer_response.parameters["error_code"].string_param == "RESOURCE_EXHAUSTED"
        for i, f in enumerate(held):
            np.testing.assert_array_equal(f.result()["OUTPUT0"], row(1.0 + i)["INPUT0"])
    m = scrape(srv.metrics_at())
    assert sample(m, "trtserve_rejected_total", model="slow", reason="inflight_bound") == 4


def test_the_automatic_inflight_bound_is_capacity_times_the_default_timeout(make_server, tmp_path):
    # At most 2 rows/s (500 ms a batch of one); no request waits more than 2 s: 4, and 1 running.
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=500,
                dynamic="default_queue_policy { default_timeout_microseconds: 2000000 }")
    srv = make_server(tmp_path, frontends=1, max_inflight_rpcs="auto")
    admission = srv.service.inflight
    assert wait_for(lambda: admission.limit is not None, 10)
    capacity = best_rows_per_second(srv.registry.get("slow").dispatcher)
    assert 0 < capacity <= 2.0
    assert admission.limit == math.ceil(capacity * 2.0 + 1) and 2 <= admission.limit <= 5
    with srv.client() as c:
        np.testing.assert_array_equal(c.infer("slow", row(3.0), timeout=60)["OUTPUT0"], row(3.0)["INPUT0"])


def test_the_automatic_inflight_bound_of_bounded_queues_refuses_the_rest(make_server, tmp_path):
    # No default timeout, but a queue of 2: 2 queued and 1 running are all worth holding. A batch
    # takes 3 s, so the three calls are in progress together even on a loaded machine.
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=3000, dynamic="default_queue_policy { max_queue_size: 2 }")
    srv = make_server(tmp_path, frontends=1, max_inflight_rpcs="auto")
    assert wait_for(lambda: srv.service.inflight.limit == 3, 10)
    with srv.client() as c, ThreadPoolExecutor(3) as pool:
        held = running_then_queued(c, pool, srv.registry.get("slow").dispatcher, 3)
        assert wait_for(lambda: srv.admitted == 3, 50)  # a batch takes 3 s: all three stay admitted
        code, details = details_of(c.stub.ModelInfer, build_request("slow", row(9.0)), timeout=60)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-inflight-rpcs auto: 3" in details, details
        for i, f in enumerate(held):
            np.testing.assert_array_equal(f.result()["OUTPUT0"], row(1.0 + i)["INPUT0"])


def test_the_automatic_inflight_bound_follows_the_models_loaded_and_unloaded(make_server, tmp_path):
    # Queues of 2 and 3, one batch of one running each: 3 with model a alone, 3 + 4 with b too.
    write_probe(tmp_path, "a", max_batch_size=1, batch_ms=50, dynamic="default_queue_policy { max_queue_size: 2 }")
    write_probe(tmp_path, "b", max_batch_size=1, batch_ms=50, dynamic="default_queue_policy { max_queue_size: 3 }")
    srv = make_server(tmp_path, frontends=1, max_inflight_rpcs="auto",
                      lifecycle=LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("a",)))
    admission = srv.service.inflight
    assert wait_for(lambda: admission.limit == 3, 10)
    with srv.client() as c:
        c.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="b"), timeout=60)
        assert admission.limit == 7
        c.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="b"), timeout=60)
        assert admission.limit == 3


def test_without_deadlines_or_queue_bounds_there_is_no_automatic_bound(make_server, tmp_path, caplog):
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=10)
    with caplog.at_level(logging.INFO, logger="trtserve.frontend.state"):
        srv = make_server(tmp_path, frontends=1, max_inflight_rpcs="auto")
        with srv.client() as c:
            np.testing.assert_array_equal(c.infer("slow", row(3.0))["OUTPUT0"], row(3.0)["INPUT0"])
    assert srv.service.inflight.limit is None
    assert "no bound on requests in progress" in caplog.text  # the bound was computed, and said so


def test_stream_messages_are_refused_with_their_own_id(make_server, tmp_path):
    write_probe(tmp_path, "slow", max_batch_size=4, batch_ms=100, dynamic=URGENT)
    srv = make_server(tmp_path, frontends=1)
    dispatcher = srv.registry.get("slow").dispatcher
    with srv.client() as c, ThreadPoolExecutor(40) as pool:
        load = load_ahead(pool, c, 40)
        assert wait_for(lambda: dispatcher.queue.queued_rows >= 30, 10)
        requests = [build_request("slow", row(2.0), request_id="tight", timeout_us=200_000),
                    build_request("slow", row(3.0), request_id="loose", timeout_us=60_000_000)]
        answers = {m.infer_response.id: m for m in c.stub.ModelStreamInfer(iter(requests), timeout=60)}
        assert all(f.result() is not None for f in load)
    assert answers["tight"].infer_response.parameters["error_code"].string_param == "RESOURCE_EXHAUSTED"
    assert "overloaded: predicted queue wait" in answers["tight"].error_message
    assert not answers["loose"].error_message


@pytest.mark.parametrize("frontends", ["1", "2"])  # in process (LocalEngine), and the process tree
def test_trtserve_serve_applies_the_automatic_bound(tmp_path, frontends):
    # Each front end bounds its requests in progress (2 queued + 1 running) once the models load.
    write_probe(tmp_path, "slow", max_batch_size=1, batch_ms=500, dynamic="default_queue_policy { max_queue_size: 2 }")
    metrics = free_port()
    with (ServerProcess(tmp_path, "--frontends", frontends, "--metrics-port", str(metrics)) as srv,
          Client(srv.url) as c, ThreadPoolExecutor(3) as pool):
        # The first call runs before the others queue: three arriving together would find the
        # queue (max_queue_size 2) full before the first had left it.
        held = [pool.submit(c.infer, "slow", row(1.0), timeout=60)]
        assert wait_for(lambda: sample(scrape(metrics), "trtserve_slots_busy", model="slow", version="1") == 1, 30)
        held += [pool.submit(c.infer, "slow", row(2.0 + i), timeout=60) for i in range(2)]
        assert wait_for(lambda: sample(scrape(metrics), "trtserve_inflight_requests") == 3, 30)
        # One connection stays with one front end: a fourth call exceeds its bound.
        code, details = details_of(c.infer, "slow", row(9.0), timeout=60)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "already has 3 requests in progress" in details, details
        assert all(f.result() is not None for f in held)


def test_a_bad_inflight_bound_is_refused_at_start(engines):
    done = subprocess.run([sys.executable, "-m", "trtserve", "serve", "--model-repository", str(engines),
                           "--max-inflight-rpcs", "many"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "--max-inflight-rpcs must be 'auto' or a whole number >= 0 (0: no bound), got 'many'" in done.stderr
