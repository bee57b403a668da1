"""C35: every failure is in the metrics and in ModelStatistics, once, under its own model and
code: failures before the backend (bad input, expired, queue full, unknown model) and errors
the model raises; unknown model names share one label value.

A ``trtserve serve --metrics-port`` child process with ``identity_fp32`` (ONNX Runtime), ``py``
(the probe Python model; it raises on rows whose id is 13) and ``q2`` (the gate model, one row
per batch, a queue of 2). The client sends:

* to ``identity_fp32``: 10 good requests, 5 whose byte length does not match the shape, and 3
  with a ``timeout`` of 1 µs;
* over one stream: 10 good messages and 5 with the wrong datatype;
* to ``py``: 4 good requests and 3 that make it raise;
* to ``q2``: one runs and is held at the gate; one with a 1 s ``timeout`` parameter (and a
  60 s gRPC deadline) queues behind it and is dropped from the queue at its deadline, never run;
  then 9 at once (two queue; the other seven find the queue full; then the gate opens);
* 42 requests to unknown model names, one with a quote and a newline, one of 300 characters.

Then the deltas of ``trtserve_requests_total`` and ``trtserve_request_duration_seconds_count``
(model, code), of ``trtserve_rejected_total`` and ``trtserve_deadline_exceeded_total`` (the
reasons), and ModelStatistics' success/fail counts must equal what the clients saw; the odd
names add no label value; ``trtserve_inflight_requests`` is 0 at rest.

A second test takes the queue-full refusals alone, through every refuser and door: the
dispatcher, the engine core's refusal over ZeroMQ and the front ends' refusals from its queue
hint (``--frontends`` 1 and 2), the in-flight gate (``--max-inflight-rpcs auto``), unary calls on
connections of their own, a stream whose refused messages are followed by an OK one, HTTP 429,
and clients retrying once the queue drained.
"""

from __future__ import annotations

import json
import queue
import socket
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from casekit import (
    EXPIRED_IN_QUEUE,
    error_code,
    gate_batches,
    raw_request,
    row,
    scrape,
    timed_call,
    wait_for,
    with_timeout,
    write_gate,
    write_identity,
    write_probe,
)

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import build_request
from trtserve.engine.metrics import REFUSALS
from trtserve.testing import ServerProcess

MODELS = ("identity_fp32", "py", "q2")
HELD_ID = 99.0  # the q2 row that holds its only slot (the gate model) while the others arrive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def series(metrics: dict, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in metrics.items() if n == name}


def delta(after: dict, before: dict, name: str) -> Counter:
    """(model, code) → increase of counter ``name`` (labels model and code), zeros left out."""
    out: Counter = Counter()
    for labels, value in series(after, name).items():
        d = dict(labels)
        change = value - series(before, name).get(labels, 0.0)
        if change:
            out[d.get("model"), d.get("code")] += int(change)
    return out


def statistics(stub) -> dict[str, tuple[int, int]]:
    response = stub.ModelStatistics(pb.ModelStatisticsRequest(), timeout=30)
    return {m.name: (m.inference_stats.success.count, m.inference_stats.fail.count) for m in response.model_stats}


def unary(stub, request, timeout: float = 60) -> str:
    try:
        stub.ModelInfer(request, timeout=timeout)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def test_every_failure_is_counted_once_under_its_model_and_code_in_metrics_and_statistics(tmp_path):
    """C35: the client-side tally of (model, code) equals the metric deltas and ModelStatistics."""
    log, gate = tmp_path / "q2.log", tmp_path / "q2.gate"
    models = tmp_path / "models"
    write_identity(models, "identity_fp32", "FP32", (-1,), max_batch_size=8)
    write_probe(models, "py", max_batch_size=4, fast_warmup="true", raise_on=13)
    write_gate(models, "q2", log, gate, max_batch_size=1, dynamic="default_queue_policy { max_queue_size: 2 }")
    port = free_port()
    seen: Counter = Counter()  # (model label, code) as the clients saw them
    with ServerProcess(models, "--metrics-port", str(port)) as srv, grpc.insecure_channel(srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        before, stats_before = scrape(port), statistics(stub)
        x = np.arange(8, dtype=np.float32).reshape(1, 8)

        # identity_fp32, unary: good, wrong byte length, 1 µs timeout.
        for _ in range(10):
            seen["identity_fp32", unary(stub, build_request("identity_fp32", {"INPUT0": x}))] += 1
        for k in range(5):
            seen["identity_fp32", unary(stub, raw_request("identity_fp32", "FP32", [1, 8], x.tobytes()[: 28 - k]))] += 1
        for _ in range(3):
            seen["identity_fp32", unary(stub, build_request("identity_fp32", {"INPUT0": x}, timeout_us=1))] += 1

        # identity_fp32, one stream: good and wrong-datatype messages interleaved.
        messages = []
        for i in range(15):
            if i % 3 == 2:
                wrong = x.astype(np.int32).tobytes()
                messages.append(raw_request("identity_fp32", "INT32", [1, 8], wrong, request_id=str(i)))
            else:
                messages.append(build_request("identity_fp32", {"INPUT0": x}, request_id=str(i)))
        answers = list(stub.ModelStreamInfer(iter(messages), timeout=60))
        assert sorted(int(m.infer_response.id) for m in answers) == list(range(15))
        for m in answers:
            seen["identity_fp32", error_code(m)] += 1

        # py: one at a time (a raising row fails its whole batch, so nothing shares one).
        for rid in (1.0, 13.0, 2.0, 13.0, 3.0, 13.0, 4.0):
            seen["py", unary(stub, build_request("py", row(rid)))] += 1

        # q2: the held row keeps the slot, two queue behind it, seven find the queue full; then
        # the gate opens and the three run.
        with ThreadPoolExecutor(10) as pool:
            held = pool.submit(unary, stub, build_request("q2", row(HELD_ID)))
            assert wait_for(lambda: gate_batches(log) == [[HELD_ID]], 30)
            code, details, _ = timed_call(stub, with_timeout(build_request("q2", row(50.0)), 1.0), 60)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_IN_QUEUE in details, (code, details)
            seen["q2", code.name] += 1
            queued = [pool.submit(unary, stub, build_request("q2", row(float(i)))) for i in (1, 2)]
            depth = ("trtserve_queue_depth", (("model", "q2"), ("version", "1")))
            assert wait_for(lambda: scrape(port).get(depth) == 2, 30)
            refused = [unary(stub, build_request("q2", row(float(i)))) for i in range(3, 10)]
            gate.touch()
            for code in [held.result(), *(f.result() for f in queued), *refused]:
                seen["q2", code] += 1
        assert refused == ["RESOURCE_EXHAUSTED"] * 7

        # Unknown names, odd ones included.
        names = [f"nosuch{i}" for i in range(40)] + ['quo"te\nnewline', "m" * 300]
        for name in names:
            code = unary(stub, build_request(name, {"INPUT0": x}))
            assert code == "NOT_FOUND"
            seen["unknown", code] += 1

        # At rest: nothing in flight (the last bookkeeping may trail the last answer a moment).
        assert wait_for(lambda: scrape(port).get(("trtserve_inflight_requests", ())) == 0, 30)
        after, stats_after = scrape(port), statistics(stub)

    print(f"\nC35: clients saw {dict(sorted(seen.items()))}")
    # What the clients saw: every kind of failure happened.
    assert seen["identity_fp32", "OK"] == 20 and seen["identity_fp32", "INVALID_ARGUMENT"] == 10
    assert seen["identity_fp32", "DEADLINE_EXCEEDED"] == 3
    assert seen["py", "OK"] == 4 and sum(n for (m, c), n in seen.items() if m == "py" and c != "OK") == 3
    assert seen["q2", "OK"] == 3 and seen["q2", "RESOURCE_EXHAUSTED"] == 7 and seen["q2", "DEADLINE_EXCEEDED"] == 1
    assert 50.0 not in {i for batch in gate_batches(log) for i in batch}  # expired in the queue: never run

    # Prometheus: each request once, under its own model and code; unknown names share one label.
    counted = delta(after, before, "trtserve_requests_total")
    unknown_labels = {m for m, _ in counted if m not in MODELS}
    assert len(unknown_labels) == 1, unknown_labels
    (unknown,) = unknown_labels
    expected = Counter({(unknown if m == "unknown" else m, c): n for (m, c), n in seen.items()})
    assert counted == expected
    assert delta(after, before, "trtserve_request_duration_seconds_count") == expected
    models_labelled = {dict(labels).get("model") for (_, labels) in after if dict(labels).get("model")}
    assert models_labelled <= {*MODELS, unknown}  # 42 odd names, no new label values
    # The reasons: queue full, and expired before running (1 µs cannot fit any batch; the q2
    # request's 1 s passed in the queue).
    def grew(name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        return series(after, name).get(key, 0.0) - series(before, name).get(key, 0.0)

    assert grew("trtserve_rejected_total", model="q2", reason="queue_full") == 7
    assert grew("trtserve_deadline_exceeded_total", model="identity_fp32", when="before_run") == 3
    assert grew("trtserve_deadline_exceeded_total", model="q2", when="before_run") == 1
    whens = ("before_run", "finished_late")
    assert sum(grew("trtserve_deadline_exceeded_total", model=m, when=w) for m in MODELS for w in whens) == 4

    # ModelStatistics: the same requests, success and fail.
    for model in MODELS:
        ok = seen[model, "OK"]
        failed = sum(n for (m, c), n in seen.items() if m == model and c != "OK")
        got = tuple(a - b for a, b in zip(stats_after[model], stats_before.get(model, (0, 0))))
        assert got == (ok, failed), (model, got, ok, failed)


def http_infer(url: str, model: str, rid: float) -> tuple[str, str]:
    """One KServe v2 REST infer of one row ``rid``: ("OK", ""), or the status name its HTTP status
    means (429 is RESOURCE_EXHAUSTED) and the error's text."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [rid] * 4}]})
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60).read()
        return "OK", ""
    except urllib.error.HTTPError as exc:
        return {429: "RESOURCE_EXHAUSTED"}.get(exc.code, f"HTTP {exc.code}"), exc.read().decode()


def refusal(stub, request) -> tuple[str, str]:
    """One ModelInfer: (status name, details)."""
    code, details, _ = timed_call(stub, request, 60)
    return code.name, details if isinstance(details, str) else ""


# Who refused a queue-full request, by its message: the dispatcher (it had the rows in hand), a
# front end from the queue hint of the engine core's last answer, the front end's in-flight gate.
BY_DISPATCHER, BY_HINT, BY_GATE = "the queue is full (", "is full at priority", "requests in progress, its bound"


@pytest.mark.parametrize("frontends, inflight, reason", [
    (1, "0", "queue_full"), (2, "0", "queue_full"), (1, "auto", "inflight_bound")])
def test_queue_full_refusals_count_once_over_every_door_and_after_a_retry(tmp_path, frontends, inflight, reason):
    """C35, the queue-full refusals as clients meet them: while ``q2``'s slot is held and its queue
    of 2 is full, unary calls each on a new connection (with two front ends, spread over both: the
    engine core's refusal crosses over ZeroMQ, then a front end refuses from the queue hint it
    got), two messages on one stream and two HTTP requests (429) are refused; once the gate opens
    and the queue drains, each refused unary client retries on its connection and the stream sends
    one more message, all answered OK. ``trtserve_rejected_total`` rises by the refusals the
    clients saw, no more (a retry's refused attempt counts once, its OK not at all), under the
    reason of what refused them, and the request counters and ModelStatistics agree.

    With ``--max-inflight-rpcs 0`` the queue refuses (``queue_full``). With ``auto`` and ``q2``
    the only model, the front end's bound is q2's queue plus its running batch (3), the very
    requests the queue would hold, so the front end's gate refuses the fourth before the queue
    sees it (``inflight_bound``)."""
    log, gate = tmp_path / "q2.log", tmp_path / "q2.gate"
    models = tmp_path / "models"
    # A warm-up batch takes 3 s, so the server predicts the held batch to run 3 s at least: its
    # queue hints say "full" that long, and a front end refuses from them meanwhile.
    write_gate(models, "q2", log, gate, max_batch_size=1, dynamic="default_queue_policy { max_queue_size: 2 }",
               warmup_ms=3000)
    port = free_port()
    args = ("--frontends", str(frontends), "--max-inflight-rpcs", inflight, "--metrics-port", str(port),
            "--allow-http", "true", "--http-port", "0")
    with ServerProcess(models, *args) as srv, grpc.insecure_channel(srv.url) as channel, ThreadPoolExecutor(4) as pool:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        before, stats_before = scrape(port), statistics(stub)
        held = pool.submit(unary, stub, build_request("q2", row(HELD_ID)))
        assert wait_for(lambda: gate_batches(log) == [[HELD_ID]], 30)
        queued = [pool.submit(unary, stub, build_request("q2", row(float(i)))) for i in (1, 2)]
        depth = ("trtserve_queue_depth", (("model", "q2"), ("version", "1")))
        assert wait_for(lambda: scrape(port).get(depth) == 2, 30)

        clients = [grpc.insecure_channel(srv.url) for _ in range(6)]  # a connection each
        try:
            stubs = [pb_grpc.GRPCInferenceServiceStub(c) for c in clients]
            refused = [refusal(s, build_request("q2", row(10.0 + k))) for k, s in enumerate(stubs)]
            outbox: queue.Queue = queue.Queue()
            answers = stub.ModelStreamInfer(iter(outbox.get, None), timeout=60)
            for i in (20, 21):
                outbox.put(build_request("q2", row(float(i)), request_id=str(i)))
            streamed = [next(answers), next(answers)]
            refused += [http_infer(srv.http_url, "q2", 30.0), http_infer(srv.http_url, "q2", 31.0)]
            refused += [("RESOURCE_EXHAUSTED" if error_code(m) == "RESOURCE_EXHAUSTED" else error_code(m),
                         m.error_message) for m in streamed]
            assert [code for code, _ in refused] == ["RESOURCE_EXHAUSTED"] * 10, refused

            gate.touch()
            answered = [held.result(), *(f.result() for f in queued)]
            retried = [unary(s, build_request("q2", row(10.0 + k))) for k, s in enumerate(stubs)]  # the same again
            outbox.put(build_request("q2", row(22.0), request_id="22"))
            streamed.append(next(answers))
            outbox.put(None)
            assert list(answers) == [] and answers.code() == grpc.StatusCode.OK
        finally:
            for c in clients:
                c.close()
        assert answered == ["OK"] * 3 and retried == ["OK"] * 6 and error_code(streamed[2]) == "OK"
        seen = Counter([*(code for code, _ in refused), "OK", *answered, *retried])
        # Every refuser had its turn: the gate alone, or the dispatcher (over ZeroMQ with two
        # front ends) and then the front ends from their hints.
        refusers = {who for _, details in refused for who in (BY_DISPATCHER, BY_HINT, BY_GATE) if who in details}
        expected_refusers = {BY_GATE} if reason == "inflight_bound" else {BY_HINT} if frontends == 1 else {
            BY_DISPATCHER, BY_HINT}  # one process: the front end reads the dispatcher's hint itself
        assert refusers == expected_refusers, refused
        assert wait_for(lambda: scrape(port).get(("trtserve_inflight_requests", ())) == 0, 30)
        after, stats_after = scrape(port), statistics(stub)

    def grew(name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        return series(after, name).get(key, 0.0) - series(before, name).get(key, 0.0)

    assert seen == Counter(OK=10, RESOURCE_EXHAUSTED=10), seen  # 6 unary, 2 streamed, 2 HTTP refused
    assert grew("trtserve_rejected_total", model="q2", reason=reason) == 10
    assert sum(grew("trtserve_rejected_total", model="q2", reason=r) for r in REFUSALS) == 10
    expected = Counter({("q2", "OK"): 10, ("q2", "RESOURCE_EXHAUSTED"): 10})
    assert delta(after, before, "trtserve_requests_total") == expected
    got = tuple(a - b for a, b in zip(stats_after["q2"], stats_before.get("q2", (0, 0))))
    assert got == (10, 10)
