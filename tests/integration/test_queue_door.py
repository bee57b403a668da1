"""The queue door against a real redis-server (Debian's 7.0, started here on 127.0.0.1 at a free
port) and a real trtserve (``ServerThread``, one front end, the queue door on): both body forms,
the same id answered once, deadlines counted from the entry id, dead letters (too many deliveries,
garbage), the credit bound, and the drain leaving unread work for the next consumer.

No timed assertions: every wait is for a state (a result, a count), with a generous ceiling.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from servers import ServerThread
from trtserve.client.redis_queue import QueueClient, QueueResult
from trtserve.frontend.queue.door import QueueSettings
from trtserve.protocol.queue import GROUP, dead_key, result_key, stream_key
from trtserve.testing.redis_server import RedisServer, missing_reason

CEILING_S = 60.0


@pytest.fixture
def redis_server(tmp_path: Path):
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def repository(engines: Path, root: Path, *names: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).symlink_to(engines / name, target_is_directory=True)
    return root


def start(make_server, engines: Path, tmp_path: Path, redis_server: RedisServer, *models: str,
          **settings) -> ServerThread:
    root = tmp_path / "repo"
    if not root.exists():
        repository(engines, root, *models)
    queue = QueueSettings(redis_server.url, consumer=settings.pop("consumer", "test-0"),
                          **{"claim_idle": 0.5, **settings})
    return make_server(root, frontends=1, queue=queue)


def wait_for(predicate, what: str):
    end = time.monotonic() + CEILING_S
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {CEILING_S:.0f} s: {what}")


def result_of(r, model: str, rid: str) -> dict[bytes, bytes]:
    return wait_for(lambda: r.hgetall(result_key("trtserve", model, rid)), f"the result of {rid}")


def sample(srv: ServerThread, name: str, **labels: str) -> float | None:
    """A metric of the server's queue door, as a scrape would read it."""
    registry = CollectorRegistry()
    registry.register(srv.doors[0].queue.metrics)
    return registry.get_sample_value(name, labels)


def identity_json(rid: str, values: list[float]) -> dict[str, str]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}]}
    return {"id": rid, "body": json.dumps(doc)}


def test_json_body_answered_in_result_key_and_reply_stream(make_server, engines, tmp_path, redis_server):
    start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    r.xadd(stream_key("trtserve", "identity_fp32"), {**identity_json("a1", [1.0, 2.0, 3.0]), "reply_to": "replies"})
    fields = result_of(r, "identity_fp32", "a1")
    assert fields[b"status"] == b"OK", fields
    body = json.loads(fields[b"body"])
    assert body["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    assert float(fields[b"total_ms"]) >= float(fields[b"queue_ms"]) >= 0
    assert 0 < r.ttl(result_key("trtserve", "identity_fp32", "a1")) <= 3600
    (_, reply), = r.xrange("replies")
    assert reply == fields
    assert r.xpending(stream_key("trtserve", "identity_fp32"), GROUP)["pending"] == 0


def test_json_binary_extension_body(make_server, engines, tmp_path, redis_server):
    start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    values = np.array([4.0, 5.0], np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                                     "parameters": {"binary_data_size": 8}}],
                         "parameters": {"binary_data_output": True}}).encode()
    r.xadd(stream_key("trtserve", "identity_fp32"),
           {"id": "b1", "body": header + values.tobytes(), "header_length": len(header)})
    fields = result_of(r, "identity_fp32", "b1")
    assert fields[b"status"] == b"OK", fields
    length = int(fields[b"header_length"])
    doc = json.loads(fields[b"body"][:length])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert struct.unpack("<2f", fields[b"body"][length:]) == (4.0, 5.0)


def test_proto_body_through_the_python_client(make_server, engines, tmp_path, redis_server):
    start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    with QueueClient(redis_server.url) as queue:
        rows = [np.arange(n, dtype=np.float32)[None] + 1 for n in (1, 3, 5)]
        ids = [queue.enqueue("identity_fp32", {"INPUT0": row}) for row in rows]
        results = queue.collect(ids, timeout=CEILING_S)
        assert set(results) == set(ids)
        for rid, row in zip(ids, rows):
            assert results[rid].status == "OK"
            np.testing.assert_array_equal(results[rid].outputs["OUTPUT0"], row)
        assert queue.result("identity_fp32", ids[0]).status == "OK"


def test_same_id_twice_computes_once(make_server, engines, tmp_path, redis_server):
    start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    stream = stream_key("trtserve", "identity_fp32")
    r.xadd(stream, {**identity_json("same", [1.0]), "reply_to": "replies"})
    first = result_of(r, "identity_fp32", "same")
    r.xadd(stream, {**identity_json("same", [9.0]), "reply_to": "replies"})
    wait_for(lambda: r.xlen("replies") == 2, "the second reply")
    (_, one), (_, two) = r.xrange("replies")
    assert one == two == first  # the second answered from the first's result
    assert json.loads(two[b"body"])["outputs"][0]["data"] == [1.0]  # not computed from [9.0]
    assert r.xpending(stream, GROUP)["pending"] == 0


def test_expired_message_never_runs_and_deadline_follows_the_entry_id(make_server, engines, tmp_path, redis_server):
    srv = start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    stream = stream_key("trtserve", "identity_fp32")
    # The entry id says Redis took it 10 s ago: a 5 s timeout has passed, whatever the producer thinks.
    old = int(r.time()[0] * 1000) - 10_000
    r.xadd(stream, {**identity_json("old", [1.0]), "timeout_us": 5_000_000}, id=f"{old}-0")
    r.xadd(stream, {**identity_json("fresh", [1.0]), "timeout_us": 5_000_000})
    expired = result_of(r, "identity_fp32", "old")
    assert expired[b"status"] == b"DEADLINE_EXCEEDED", expired
    assert b"body" not in expired
    assert float(expired[b"queue_ms"]) >= 10_000
    assert result_of(r, "identity_fp32", "fresh")[b"status"] == b"OK"
    assert r.xpending(stream, GROUP)["pending"] == 0  # acked, never retried
    assert sample(srv, "trtserve_queue_expired_total", model="identity_fp32") == 1
    assert sample(srv, "trtserve_queue_pickup_delay_seconds_count", model="identity_fp32") == 2
    assert sample(srv, "trtserve_queue_pickup_delay_seconds_bucket", model="identity_fp32", le="5.0") == 1


def test_poison_goes_to_dead_letter_after_n_deliveries(make_server, engines, tmp_path, redis_server):
    r = redis_server.client()
    stream = stream_key("trtserve", "identity_fp32")
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    entry = r.xadd(stream, identity_json("poison", [1.0]))
    # A consumer that died holding it three times (the delivery count Redis keeps).
    r.xreadgroup(GROUP, "ghost", {stream: ">"})
    r.xclaim(stream, GROUP, "ghost", 0, [entry], retrycount=3)
    srv = start(make_server, engines, tmp_path, redis_server, "identity_fp32", max_deliveries=3)
    wait_for(lambda: r.xlen(dead_key("trtserve", "identity_fp32")), "the dead letter")
    assert sample(srv, "trtserve_queue_redelivered_total", model="identity_fp32") == 1
    assert sample(srv, "trtserve_queue_dead_lettered_total", model="identity_fp32", reason="deliveries") == 1
    (_, letter), = r.xrange(dead_key("trtserve", "identity_fp32"))
    assert letter[b"deliveries"] == b"3"
    assert letter[b"entry"] == entry
    assert b"delivered 3 times" in letter[b"reason"]
    assert result_of(r, "identity_fp32", "poison")[b"status"] == b"INTERNAL"
    assert r.xpending(stream, GROUP)["pending"] == 0


def test_garbage_goes_to_dead_letter_at_once(make_server, engines, tmp_path, redis_server):
    start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    stream = stream_key("trtserve", "identity_fp32")
    r.xadd(stream, {"id": "g1", "body": "{not json"})
    r.xadd(stream, {"id": "g2", "body": "{}", "colour": "blue"})
    r.xadd(stream, {"id": "g3", "body": b"\xff\x00", "format": "proto"})
    r.xadd(stream, identity_json("good", [2.0]))
    assert result_of(r, "identity_fp32", "good")[b"status"] == b"OK"  # bad messages never stop the loop
    dead = dead_key("trtserve", "identity_fp32")
    wait_for(lambda: r.xlen(dead) == 3, "three dead letters")
    reasons = {f[b"id"]: f[b"reason"].decode() for _, f in r.xrange(dead)}
    assert "not valid JSON" in reasons[b"g1"]
    assert "unknown field(s) colour" in reasons[b"g2"]
    assert "ModelInferRequest" in reasons[b"g3"]
    assert all(f[b"deliveries"] == b"0" for _, f in r.xrange(dead))
    assert result_of(r, "identity_fp32", "g1")[b"status"] == b"INVALID_ARGUMENT"


def test_consumer_never_holds_more_than_its_credit(make_server, engines, tmp_path, redis_server):
    srv = start(make_server, engines, tmp_path, redis_server, "slow")
    r = redis_server.client()
    stream = stream_key("trtserve", "slow")
    door = srv.doors[0].queue
    credit = 1 * 8 * 2  # one slot x max_batch_size 8 x two batches
    total = 200
    pipe = r.pipeline()
    for i in range(total):
        pipe.xadd(stream, {"id": f"c{i}", "body": json.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}]})})
    pipe.execute()
    most = 0
    end = time.monotonic() + CEILING_S
    while time.monotonic() < end:
        info = {c["name"]: c["pending"] for c in r.xinfo_consumers(stream, GROUP)}
        most = max(most, info.get(b"test-0", info.get("test-0", 0)))
        if r.xinfo_groups(stream)[0]["lag"] == 0 and info.get(b"test-0", info.get("test-0", 0)) == 0:
            break
        time.sleep(0.005)
    assert 0 < most <= credit
    wait_for(lambda: door.credit("slow") == credit, "the whole credit back once nothing is held")
    wait_for(lambda: all(r.exists(result_key("trtserve", "slow", f"c{i}")) for i in range(total)), "every result")


def test_drain_leaves_unread_work_for_the_next_consumer(make_server, engines, tmp_path, redis_server):
    srv = start(make_server, engines, tmp_path, redis_server, "slow")
    r = redis_server.client()
    stream = stream_key("trtserve", "slow")
    total = 300
    pipe = r.pipeline()
    for i in range(total):
        pipe.xadd(stream, {"id": f"d{i}", "body": json.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}]})})
    pipe.execute()
    done = lambda: sum(r.exists(result_key("trtserve", "slow", f"d{i}")) for i in range(total))  # noqa: E731
    wait_for(lambda: done() >= 10, "some answers")
    srv.stop()
    answered = done()
    group = r.xinfo_groups(stream)[0]
    assert group["lag"] > 0  # unread work stays in the stream
    assert answered + group["lag"] + group["pending"] == total
    # The next consumer picks up the rest (and anything left pending, after the claim-idle time).
    start(make_server, engines, tmp_path, redis_server, "slow", consumer="test-1")
    wait_for(lambda: done() == total, "every result after the restart")
    results = [QueueResult.of(r.hgetall(result_key("trtserve", "slow", f"d{i}"))) for i in range(total)]
    assert {res.status for res in results} == {"OK"}


def test_redis_restarted_mid_run_loses_nothing_acked(make_server, engines, tmp_path, redis_server):
    srv = start(make_server, engines, tmp_path, redis_server, "identity_fp32")
    r = redis_server.client()
    stream = stream_key("trtserve", "identity_fp32")
    for i in range(20):
        r.xadd(stream, identity_json(f"r{i}", [float(i)]))
    wait_for(lambda: all(r.exists(result_key("trtserve", "identity_fp32", f"r{i}")) for i in range(20)), "20 results")
    redis_server.restart()  # the append-only file keeps what Redis acknowledged
    r = redis_server.client()
    for i in range(20, 40):
        r.xadd(stream, identity_json(f"r{i}", [float(i)]))
    wait_for(lambda: all(r.exists(result_key("trtserve", "identity_fp32", f"r{i}")) for i in range(40)),
             "40 results across the restart")
    assert {r.hget(result_key("trtserve", "identity_fp32", f"r{i}"), "status") for i in range(40)} == {b"OK"}
    wait_for(lambda: r.xpending(stream, GROUP)["pending"] == 0, "every entry acked")
    assert srv.doors[0].queue.healthy


def serve(root: Path, redis_url: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``trtserve serve`` with the queue door from the environment (TRTSERVE_REDIS_URL), once it
    says it listens; returns the process and its output lines so far."""
    env = {**os.environ, "TRTSERVE_REDIS_URL": redis_url, "TRTSERVE_REDIS_CLAIM_IDLE": "0.5",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "trtserve", "serve", "--model-repository", str(root), "--port", "0",
                             "--frontends", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "listening on" in line:
            return proc, lines
    raise AssertionError("trtserve serve exited before listening:\n" + "".join(lines))


def test_sigkill_after_reading_then_restart_answers_every_id_once(engines, tmp_path, redis_server):
    root = repository(engines, tmp_path / "repo", "slow")
    r = redis_server.client()
    stream, total = stream_key("trtserve", "slow"), 120
    proc, lines = serve(root, redis_server.url)
    assert any(f"trtserve queue door on {redis_server.url}" in line for line in lines), lines
    pipe = r.pipeline()
    for i in range(total):
        pipe.xadd(stream, {"id": f"k{i}", "reply_to": "replies", "body": json.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}]})})
    pipe.execute()
    # Killed while it holds entries it has read and not answered.
    wait_for(lambda: r.xlen("replies") >= 10 and r.xpending(stream, GROUP)["pending"] > 0, "read, not yet answered")
    proc.kill()
    proc.wait(30)
    assert r.xpending(stream, GROUP)["pending"] > 0
    proc, _ = serve(root, redis_server.url)  # the same consumer name: it reclaims its own pending entries
    try:
        wait_for(lambda: r.xlen("replies") >= total, "every reply")
        ids = [fields[b"id"] for _, fields in r.xrange("replies")]
        assert sorted(ids) == sorted(f"k{i}".encode() for i in range(total))  # each exactly once
        assert r.xpending(stream, GROUP)["pending"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_readme_queue_example_runs_verbatim(make_server, engines, tmp_path, redis_server, capsys):
    start(make_server, engines, tmp_path, redis_server, "tiny")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### The queue door, with Redis", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code.replace("redis://127.0.0.1:6379/0", redis_server.url), "README.md", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out.count("'OK'") == 3
