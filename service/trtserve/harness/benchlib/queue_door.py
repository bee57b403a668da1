"""The queue door's benchmark (mode ``queue``): minilm captions through Redis Streams against the
same captions over one gRPC ModelStreamInfer stream, in the same run, against the same server.

The mode starts a redis-server of its own (:class:`~trtserve.testing.redis_server.RedisServer`,
127.0.0.1 at a free port, no persistence: the door is measured, not the disk) and a server of its
own, ``trtserve serve --redis-url <that server>`` (with ``--frontends`` and ``--serve-args`` as the
other modes'). Without the ``redis-server`` binary the mode is skipped with a printed sentence.

For each number of requests outstanding (``--concurrency``) it measures, in turn:

* ``stream``: :meth:`~.load.LoadGenerator.closed_stream`, one stream with that many requests in
  flight, each answer sending the next;
* ``queue``: a producer that ``XADD``s one request per message to ``trtserve:requests:minilm``
  with that many outstanding (each reply sends the next: one pipelined ``XADD`` round trip per
  batch of replies read) and a collector that reads the replies (``XREAD`` on a reply stream of
  the point's own, named by every message's ``reply_to``).

Both send the same bodies: the bench's caption workload (:mod:`.workload`, one caption a request)
as serialized ``ModelInferRequest`` messages (the queue's ``proto`` format). Each queue message
has an id of its own (``<point>-<n>``: an id seen before would be answered from its result
without running) and a result TTL of :data:`RESULT_TTL_S`. Both run under the same window as
every other mode (:meth:`~.load.LoadGenerator.measure`: ``--warmup`` unmeasured, then
``--duration``; the requests sent inside it are the sample, followed to their answers).

Figures per point (:class:`QueuePoint`): texts/s, latency p50/p99 (send → answer, the bench's
clock), for the queue the pickup delay p50/p99 (the result's ``queue_ms``: the entry id's time to
the door's read, Redis's clock, millisecond resolution), the model's mean batch, trtserve's CPU
per request (its whole process tree, :mod:`.proctree`, between the window's snapshots ÷ the
window's requests) and, for the queue, redis-server's CPU per request (its process over the whole
point ÷ every request of the point: Redis's share of the door's cost). Target
(:func:`queue_targets`): the queue's texts/s ≥ :data:`THROUGHPUT_RATIO` × the stream's at the
largest number outstanding.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from trtserve.client import CHANNEL_OPTIONS
from trtserve.harness.benchlib.load import CALL_TIMEOUT_S, LoadGenerator, Window, open_channels
from trtserve.harness.benchlib.proctree import tree_cpu_seconds
from trtserve.harness.benchlib.records import Recorder
from trtserve.harness.benchlib.report import Target, fmt, percentiles_ms
from trtserve.harness.benchlib.workload import Workload
from trtserve.protocol.queue import stream_key
from trtserve.testing import ServerProcess
from trtserve.testing.redis_server import RedisServer, missing_reason

QUEUE_MODE = "queue"
"""The ``--modes`` item of this comparison."""
QUEUE_MODEL = "minilm"
"""The model driven: its requests are captions of the bench's corpus."""
THROUGHPUT_RATIO = 0.9
"""Target: the queue's texts/s over the stream's, at the largest number outstanding."""
RESULT_TTL_S = 300
"""Seconds each result key of the bench lives (the run's keys expire soon after it)."""
QUEUE, STREAM = "queue", "stream"
READ_COUNT = 1000
"""Most replies one collector read takes."""


@dataclass(frozen=True)
class QueuePoint:
    """One point of the queue comparison.

    Attributes:
        door: ``queue`` (Redis Streams) or ``stream`` (gRPC ModelStreamInfer).
        model: the model driven.
        outstanding: requests in flight (closed loop: each answer sends the next).
        window_s: the measuring window in seconds.
        requests: requests sent inside the window (each followed to its answer).
        texts_per_s: OK answers of those per second of window (one caption a request).
        p50_ms, p99_ms: send → answer of the OK ones, ms (None without one).
        pickup_p50_ms, pickup_p99_ms: queue only: the results' ``queue_ms`` (entry id's time to
            the door's read, Redis's clock), ms; None for the stream.
        mean_batch: rows per engine run in the window (ModelStatistics; None without a run).
        server_cpu_us_per_request: trtserve's process tree, CPU µs in the window per request.
        redis_cpu_us_per_request: queue only: redis-server's CPU µs over the whole point per
            request of the point; None for the stream.
        errors: answers other than OK by status name.
    """

    door: str
    model: str
    outstanding: int
    window_s: float
    requests: int
    texts_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    pickup_p50_ms: float | None
    pickup_p99_ms: float | None
    mean_batch: float | None
    server_cpu_us_per_request: float | None
    redis_cpu_us_per_request: float | None = None
    errors: dict[str, int] = field(default_factory=dict)


def summarize(door: str, model: str, outstanding: int, window: Window, pickup_ms: np.ndarray | None = None,
              redis_cpu_us: float | None = None) -> QueuePoint:
    """A point from its window; ``pickup_ms`` per request of the window (queue only)."""
    ok = np.asarray(window.codes, dtype=object) == "OK"
    pct = percentiles_ms(window.latency_us[ok], (50, 99))
    pickup = percentiles_ms(pickup_ms * 1e3, (50, 99)) if pickup_ms is not None else {50: None, 99: None}
    runs = window.after.execution_count - window.before.execution_count
    rows = window.after.inference_count - window.before.inference_count
    requests = len(window.codes)
    cpu = window.after.server_cpu_s - window.before.server_cpu_s
    return QueuePoint(
        door=door, model=model, outstanding=outstanding, window_s=window.seconds, requests=requests,
        texts_per_s=int(ok.sum()) / window.seconds if window.seconds > 0 else 0.0, p50_ms=pct[50], p99_ms=pct[99],
        pickup_p50_ms=pickup[50], pickup_p99_ms=pickup[99], mean_batch=rows / runs if runs > 0 else None,
        server_cpu_us_per_request=cpu * 1e6 / requests if requests else None, redis_cpu_us_per_request=redis_cpu_us,
        errors=dict(sorted(Counter(c for c in window.codes if c != "OK").items())),
    )


async def closed_queue(gen: LoadGenerator, client: aioredis.Redis, model: str, bodies: Sequence[bytes],
                       outstanding: int, redis_pid: int) -> QueuePoint:
    """One queue point: ``outstanding`` requests through ``model``'s request stream, each reply
    sending the next (module docstring).

    Raises:
        RuntimeError: no reply came within :data:`~.load.CALL_TIMEOUT_S` while requests were out.
    """
    tag = uuid.uuid4().hex[:12]
    reply_to = f"trtserve-bench:replies:{tag}"
    stream = stream_key("trtserve", model)
    pickups: dict[int, float] = {}  # request number -> queue_ms (the recorder's key is the number)
    answered = 0

    async def drive(recorder: Recorder, stop: asyncio.Event) -> None:
        nonlocal answered
        numbers = itertools.count()
        out: dict[bytes, tuple[int, float]] = {}  # id -> (number, sent)

        async def send(count: int) -> None:
            pipe = client.pipeline(transaction=False)
            for _ in range(count):
                n = next(numbers)
                rid = f"{tag}-{n}".encode()
                pipe.xadd(stream, {"format": "proto", "body": bodies[n % len(bodies)], "id": rid,
                                   "reply_to": reply_to, "result_ttl_s": RESULT_TTL_S})
                out[rid] = (n, time.perf_counter())
            await pipe.execute()

        await send(outstanding)
        last = "0-0"
        while out:
            reply = await client.xread({reply_to: last}, count=READ_COUNT, block=int(CALL_TIMEOUT_S * 1e3))
            if not reply:
                raise RuntimeError(f"no reply on {reply_to} within {CALL_TIMEOUT_S:.0f} s with {len(out)} "
                                   "requests outstanding")
            entries = reply[0][1]
            done = time.perf_counter()
            for entry_id, fields in entries:
                last = entry_id
                n, sent = out.pop(fields[b"id"])
                pickups[n] = float(fields.get(b"queue_ms", b"nan"))
                recorder.add(n, sent, sent, done, fields[b"status"].decode(), None)
            answered += len(entries)
            if not stop.is_set():
                await send(len(entries))

    redis_before = tree_cpu_seconds(redis_pid)
    try:
        window = await gen.measure(model, drive)
    finally:
        await client.delete(reply_to)
    redis_cpu = tree_cpu_seconds(redis_pid) - redis_before
    pickup_ms = np.asarray([pickups[int(k)] for k in window.keys], dtype=np.float64)
    return summarize(QUEUE, model, outstanding, window, pickup_ms[~np.isnan(pickup_ms)],
                     redis_cpu * 1e6 / answered if answered else None)


async def compare(gen: LoadGenerator, client: aioredis.Redis, workload: Workload, concurrency: Sequence[int],
                  redis_pid: int) -> list[QueuePoint]:
    """For each number outstanding in ``concurrency``: the stream's point, then the queue's (each
    printed as it ends)."""
    model = workload.spec.name
    points = []
    for outstanding in concurrency:
        # The stream's ids in flight must be distinct: more messages than outstanding.
        messages = workload.messages(max(len(workload.requests), 2 * outstanding), with_ids=True)
        stream = summarize(STREAM, model, outstanding, await gen.closed_stream(model, messages, outstanding))
        queue = await closed_queue(gen, client, model, workload.messages(), outstanding, redis_pid)
        for point in (stream, queue):
            points.append(point)
            print(f"{model:8} {QUEUE_MODE:13} {format_row(point)}", flush=True)
    return points


def queue_points(args: argparse.Namespace, serve_args: Sequence[str], workload: Workload) -> list[QueuePoint]:
    """The mode: a redis-server and ``trtserve serve --redis-url`` of its own, then :func:`compare`
    over ``--concurrency``. Without the redis-server binary: a printed sentence and no points.

    Raises:
        SystemExit: the model is not ready on the server.
    """
    reason = missing_reason()
    if reason is not None:
        print(f"mode '{QUEUE_MODE}' skipped: {reason}", flush=True)
        return []
    with tempfile.TemporaryDirectory(prefix="trtserve-bench-redis-") as directory:
        redis_server = RedisServer(Path(directory), durable=False).start()
        try:
            with ServerProcess(args.model_repository, *serve_args, "--redis-url", redis_server.url) as server:
                print(f"mode '{QUEUE_MODE}': redis-server pid {redis_server.pid} at {redis_server.url}; trtserve pid "
                      f"{server.pid} at {server.url} reading it", flush=True)
                return asyncio.run(_run(args, server, redis_server, workload))
        finally:
            redis_server.stop()


async def _run(args: argparse.Namespace, server: ServerProcess, redis_server: RedisServer,
               workload: Workload) -> list[QueuePoint]:
    channels = open_channels(server.url, 1, CHANNEL_OPTIONS)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(server.pid), args.warmup, args.duration)
        if not await gen.model_ready(workload.spec.name):
            raise SystemExit(f"model '{workload.spec.name}' is not ready on the server:\n" + "".join(server.output))
        print(f"{'model':8} {'mode':13} {format_header()}", flush=True)
        return await compare(gen, client, workload, args.concurrency, redis_server.pid)
    finally:
        await client.aclose()
        for channel in channels:
            await channel.close()


def format_header() -> str:
    return (f"{'door':6} {'outstanding':>11} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'pickup p50':>10} "
            f"{'pickup p99':>10} {'batch':>6} {'server us/req':>13} {'redis us/req':>12}  errors")


def format_row(p: QueuePoint) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in p.errors.items()) or "0"
    return (f"{p.door:6} {p.outstanding:>11} {p.texts_per_s:>9.1f} {fmt(p.p50_ms, '.2f'):>8} "
            f"{fmt(p.p99_ms, '.2f'):>8} {fmt(p.pickup_p50_ms, '.1f'):>10} {fmt(p.pickup_p99_ms, '.1f'):>10} "
            f"{fmt(p.mean_batch, '.1f'):>6} {fmt(p.server_cpu_us_per_request, '.0f'):>13} "
            f"{fmt(p.redis_cpu_us_per_request, '.0f'):>12}  {errors}")


def format_queue_table(points: Sequence[QueuePoint]) -> str:
    """The points as one table (empty string without any), stream then queue per number outstanding."""
    if not points:
        return ""
    return "\n".join([f"queue door ({points[0].model} captions, one a request; Redis Streams against the gRPC "
                      "stream, same server; pickup in ms):", format_header(), *(format_row(p) for p in points), ""])


def queue_targets(points: Sequence[QueuePoint]) -> list[Target]:
    """The queue's texts/s ≥ :data:`THROUGHPUT_RATIO` × the stream's at the largest number
    outstanding both measured (a MISS with errors on either side), and the queue's pickup delay
    there (INFO)."""
    doors = {(p.door, p.outstanding): p for p in points}
    both = [n for door, n in doors if door == QUEUE and (STREAM, n) in doors]
    if not both:
        return []
    n = max(both)
    queue, stream = doors[QUEUE, n], doors[STREAM, n]
    clean = not queue.errors and not stream.errors
    quotient = queue.texts_per_s / stream.texts_per_s if stream.texts_per_s > 0 else None
    passed = clean and quotient is not None and quotient >= THROUGHPUT_RATIO
    name = f"{queue.model} queue door, {n} outstanding"
    return [
        Target(f"{name}: texts/s >= {THROUGHPUT_RATIO} x the gRPC stream's", "PASS" if passed else "MISS",
               f"{queue.texts_per_s:.1f} vs {stream.texts_per_s:.1f} texts/s = {fmt(quotient, '.2f')}x"
               + ("" if clean else f"; errors {queue.errors or 0} vs {stream.errors or 0}")),
        Target(f"{name}: pickup delay", "INFO",
               f"p50 {fmt(queue.pickup_p50_ms, '.1f')} ms, p99 {fmt(queue.pickup_p99_ms, '.1f')} ms; server CPU "
               f"{fmt(queue.server_cpu_us_per_request, '.0f')} us/request (stream "
               f"{fmt(stream.server_cpu_us_per_request, '.0f')}) + redis {fmt(queue.redis_cpu_us_per_request, '.0f')}"),
    ]
