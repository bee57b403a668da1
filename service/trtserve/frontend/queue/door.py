"""The queue door: requests read from Redis Streams through one consumer group, run on the same
contract as the gRPC and HTTP doors (:class:`~trtserve.frontend.state.FrontendState`: the same
in-flight gate, admission, dispatchers and outcome records), answered once into a result key
and, when the message names one, a reply stream.

Per served model, two tasks on the front end's loop:

* **the reader**: ``XREADGROUP ... >`` for as many entries as the model can take now (its
  *credit*: two batches per execution slot, less the entries this door holds, within the front
  end's in-flight bound), so the backlog stays in Redis; nothing is trimmed.
* **the reclaimer**: every half claim-idle time, ``XAUTOCLAIM`` takes entries another consumer
  (or this one, before a restart: the consumer name is stable per host and front end) has held
  longer than the claim-idle time; one already delivered ``max_deliveries`` times goes to the
  dead-letter stream instead. It also reads the group's lag and pending count for the metrics.

A request's deadline counts from its entry id's time on Redis's clock (the door keeps the offset
between Redis's ``TIME`` and its own), so the time it waited in Redis counts and a producer's
clock does not. Outcomes:

==========================================  ===================================================
the attempt ends with                       the door
==========================================  ===================================================
an answer, or a permanent error             writes the result (HSET + PEXPIRE), the reply
(INVALID_ARGUMENT, NOT_FOUND,               (XADD) and the ack (XACK) in one MULTI/EXEC,
DEADLINE_EXCEEDED, ...)                     unless a result of that id exists: then the reply
                                            repeats it (answered once)
a retryable refusal (RESOURCE_EXHAUSTED,    tries again after a backoff (10 ms doubling to 1 s)
UNAVAILABLE)                                until its deadline; while draining, leaves it pending
INTERNAL (the model failed)                 leaves it pending: redelivered after the claim-idle
                                            time, dead-lettered after ``max_deliveries``
an unreadable message                       dead-letters it at once (and answers
                                            INVALID_ARGUMENT when its id is readable)
==========================================  ===================================================

Redis failures: redis-py's own retry with exponential backoff reconnects; a call that still fails
marks the door unhealthy (health ``trtserve.queue`` NOT_SERVING) and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from trtserve.clock import wall_time_ns
from trtserve.errors import BackendError, RequestTimeout, Retryable, TrtServeError
from trtserve.frontend.queue.metrics import QueueMetrics
from trtserve.frontend.state import FrontendState
from trtserve.frontend.status import status_name
from trtserve.ipc.messages import ModelState
from trtserve.protocol import rest
from trtserve.protocol.queue import (
    GROUP,
    Garbage,
    QueueRequest,
    dead_key,
    entry_ms,
    parse,
    request_id,
    result_fields,
    result_key,
    stream_key,
)

log = logging.getLogger(__name__)

HEALTH_NAME = "trtserve.queue"
"""The gRPC health service name of the queue door (SERVING while it reads Redis and the server serves)."""
REDIS_RETRIES = 10
"""Tries redis-py makes of one command on a dropped connection, with exponential backoff."""
CLOCK_SYNC_S = 10.0
"""How often the door measures the offset between Redis's clock and its own (seconds)."""
CLOCK_SAMPLES = 5
"""``TIME`` calls per measurement of the offset; the one with the shortest round trip counts."""
RETRY_FIRST_S, RETRY_MAX_S = 0.01, 1.0
"""The backoff of a retryable refusal: first wait and longest wait (seconds)."""


@dataclass(frozen=True)
class QueueSettings:
    """The queue door's settings (``trtserve serve --redis-*``).

    Attributes:
        url: the Redis URL (``redis://[:password@]host:port/db``, ``rediss://`` for TLS).
        consumer: this front end's consumer name (default: ``<hostname>-<front end number>``,
            stable across restarts, so a restarted front end reclaims its own pending entries).
        prefix: the key prefix (:mod:`trtserve.protocol.queue`).
        claim_idle: seconds an entry may stay pending with a consumer before another reclaims it.
        max_deliveries: deliveries after which an entry goes to the dead-letter stream.
        result_ttl: seconds a result key lives unless the message says otherwise.
        block: seconds one read waits for new entries (a drain waits for it at most).

    Raises:
        ValueError: a value out of range (the message names it).
    """

    url: str
    consumer: str = ""
    prefix: str = "trtserve"
    claim_idle: float = 30.0
    max_deliveries: int = 5
    result_ttl: float = 3600.0
    block: float = 0.5

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"--redis-url must be redis://, rediss:// or unix://, got '{self.redact()}'")
        for name in ("claim_idle", "result_ttl", "block"):
            if not getattr(self, name) > 0:
                raise ValueError(f"queue door: {name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_deliveries < 1:
            raise ValueError(f"queue door: max_deliveries must be >= 1, got {self.max_deliveries}")

    def redact(self) -> str:
        """The URL without its password (for logs and the start-up line)."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))


class _Reader:
    """One model's stream as this door reads it. Touched only from the loop."""

    def __init__(self, model: str, prefix: str) -> None:
        self.model = model
        self.stream = stream_key(prefix, model)
        self.held = 0  # entries taken and not yet acked or left
        self.room = asyncio.Event()  # set when held goes down (or the door stops)
        self.stopped = False
        self.tasks: list[asyncio.Task[None]] = []


class QueueDoor:
    """The queue door of one front end (see the module docstring).

    Args:
        state: the front end's served models, gate and request path.
        settings: the Redis URL and the door's settings.
        index: the front end's number (the default consumer name's suffix).

    Attributes:
        metrics: the door's Prometheus collector.
        healthy: the last Redis call succeeded.
        health_hooks: awaited with :attr:`healthy` whenever it changes.

    Raises:
        ValueError: the URL cannot be parsed by redis-py.
    """

    def __init__(self, state: FrontendState, settings: QueueSettings, index: int = 0) -> None:
        self.state = state
        self.settings = settings
        self.consumer = settings.consumer or f"{socket.gethostname()}-{index}"
        self.redis = aioredis.Redis.from_url(
            settings.url, retry=Retry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), REDIS_RETRIES),
            retry_on_error=[RedisConnectionError, RedisTimeoutError], health_check_interval=10,
        )
        self.metrics = QueueMetrics()
        self.healthy = False
        self.health_hooks: list[Callable[[bool], Awaitable[None]]] = []
        self.stopping = False
        self._readers: dict[str, _Reader] = {}
        self._work: set[asyncio.Task[None]] = set()
        self._running: dict[tuple[str, str], asyncio.Future[None]] = {}  # (model, id) computing here
        self._offset_ms = 0.0  # Redis's clock minus this host's wall clock
        self._synced = -math.inf
        state.health_hooks.append(self._follow)
        state.drain_hooks.append(self._stop_reading)

    # -- lifecycle --------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Read the stream of every model the front end serves now; stop reading the others."""
        if self.stopping:
            return
        served = {name for name, info in self.state.engine.models.items()
                  if info.state is ModelState.READY and self.state.table.ready(name, "")}
        for name in served - set(self._readers):
            reader = self._readers[name] = _Reader(name, self.settings.prefix)
            reader.tasks = [asyncio.ensure_future(self._read(reader)), asyncio.ensure_future(self._reclaim(reader))]
        for name in set(self._readers) - served:
            self._end(self._readers.pop(name))
        await self._set_health(self.healthy)

    def _end(self, reader: _Reader) -> None:
        reader.stopped = True
        reader.room.set()

    async def _stop_reading(self) -> None:
        """A drain began: read nothing more (what is held is answered and acked)."""
        self.stopping = True
        for reader in self._readers.values():
            self._end(reader)
        await self._set_health(False)

    async def stop(self, grace: float | None) -> None:
        """Stop (after the front end's drain): wait for the readers' last reads and the work
        they started (``grace`` seconds at most), then close the connection pool."""
        self.stopping = True
        tasks = [task for reader in self._readers.values() for task in reader.tasks]
        for reader in self._readers.values():
            self._end(reader)
        if tasks or self._work:
            _, late = await asyncio.wait([*tasks, *self._work], timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.redis.aclose()

    async def _set_health(self, healthy: bool) -> None:
        changed = healthy != self.healthy
        self.healthy = healthy
        for hook in list(self.health_hooks):
            await hook(healthy and not self.stopping)
        if changed and not healthy and not self.stopping:
            log.warning("queue door: Redis at %s is unreachable; retrying with backoff", self.settings.redact())
        elif changed and healthy:
            log.info("queue door: reading Redis at %s as consumer %s", self.settings.redact(), self.consumer)

    async def _trouble(self, reader: _Reader, exc: RedisError) -> None:
        """A Redis call failed after redis-py's retries: a stream deleted under the door gets
        its group back; anything else marks the door unhealthy (the next call retries)."""
        if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
            await self._ensure_group(reader)
            return
        if not isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            log.error("queue door: model %s: %s: %s", reader.model, type(exc).__name__, exc)
        await self._set_health(False)

    async def _ensure_group(self, reader: _Reader) -> None:
        """Create the stream and the group (from the stream's start: work sent before any
        trtserve ran is read too) unless they exist."""
        try:
            await self.redis.xgroup_create(reader.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- reading ----------------------------------------------------------------------------

    def credit(self, model: str) -> int:
        """Entries of ``model`` the door may take now: two batches per execution slot (a batch at
        the batch cap in force, as the engine core's last answer gave it; ``max_batch_size``
        before one), less those it holds, and no more than the front end's in-flight bound has
        room for."""
        reader = self._readers.get(model)
        info = self.state.engine.models.get(model)
        if reader is None or info is None or info.spec is None:
            return 0
        spec = info.spec
        hint = self.state.engine.hint(model)
        batch = hint.cap if hint is not None else max(1, spec.policy.max_batch_size)
        room = max(1, spec.instances) * batch * 2 - reader.held
        gate = self.state.inflight
        if gate.limit is not None:
            room = min(room, gate.limit - gate.active)
        return max(0, room)

    async def _read(self, reader: _Reader) -> None:
        """The reader: new entries, as many as the credit allows, until stopped."""
        block_ms = max(1, round(self.settings.block * 1e3))
        try:
            await self._ensure_group(reader)
            await self._sync_clock()
            await self._set_health(True)
        except RedisError as exc:
            await self._trouble(reader, exc)
        while not reader.stopped:
            credit = self.credit(reader.model)
            if credit <= 0:
                reader.room.clear()
                await reader.room.wait()
                continue
            try:
                reply = await self.redis.xreadgroup(GROUP, self.consumer, {reader.stream: ">"}, count=credit,
                                                    block=block_ms)
                if not self.healthy:
                    await self._set_health(True)
                if reply:
                    await self._take(reader, reply[0][1], {})
            except RedisError as exc:
                await self._trouble(reader, exc)

    async def _reclaim(self, reader: _Reader) -> None:
        """The reclaimer: entries idle past the claim-idle time, the clock offset, the gauges."""
        interval = min(max(self.settings.claim_idle / 2, 0.05), 5.0)
        idle_ms = max(1, round(self.settings.claim_idle * 1e3))
        while not reader.stopped:
            await asyncio.sleep(interval)
            if reader.stopped:
                return
            try:
                await self._sync_clock()
                await self._gauges(reader)
                credit = self.credit(reader.model)
                if credit <= 0:
                    continue
                _next, claimed, _deleted = await self.redis.xautoclaim(
                    reader.stream, GROUP, self.consumer, idle_ms, "0-0", count=credit)
                if not claimed:
                    continue
                async with self.redis.pipeline(transaction=False) as pipe:
                    for entry_id, _fields in claimed:
                        pipe.xpending_range(reader.stream, GROUP, entry_id, entry_id, 1)
                    pending = await pipe.execute()
                deliveries = {e[0]["message_id"]: e[0]["times_delivered"] for e in pending if e}
                self.metrics.redelivered.labels(reader.model).inc(len(claimed))
                await self._take(reader, claimed, deliveries)
            except RedisError as exc:
                await self._trouble(reader, exc)

    async def _gauges(self, reader: _Reader) -> None:
        for group in await self.redis.xinfo_groups(reader.stream):
            if group["name"] in (GROUP, GROUP.encode()):
                self.metrics.pending.labels(reader.model).set(group["pending"])
                if group.get("lag") is not None:
                    self.metrics.lag.labels(reader.model).set(group["lag"])
        self.metrics.held.labels(reader.model).set(reader.held)

    async def _sync_clock(self) -> None:
        """Measure Redis's clock against this host's wall clock (every :data:`CLOCK_SYNC_S`): of
        :data:`CLOCK_SAMPLES` ``TIME`` calls, the one with the shortest round trip, its reading
        taken at the trip's midpoint (NTP's rule: the shortest trip bounds the error best; one call
        on a loaded host put the offset a few ms off, and pickup delays below zero)."""
        if self.state.clock.now() - self._synced < CLOCK_SYNC_S:
            return
        best = (math.inf, 0.0)
        for _ in range(CLOCK_SAMPLES):
            before = wall_time_ns()
            seconds, micros = await self.redis.time()
            after = wall_time_ns()
            best = min(best, (after - before, seconds * 1e3 + micros / 1e3 - (before + after) / 2e6))
        self._offset_ms = best[1]
        self._synced = self.state.clock.now()

    def redis_ms(self) -> float:
        """Now on Redis's clock (milliseconds since the epoch), as the door estimates it."""
        return wall_time_ns() / 1e6 + self._offset_ms

    async def _take(self, reader: _Reader, entries: list[Any], deliveries: dict[bytes, int]) -> None:
        """Start the work of ``entries`` (id, fields) read for ``reader``; ``deliveries``: how many
        times each reclaimed entry has been delivered, this time included (a new entry: once)."""
        now_ms = self.redis_ms()
        parsed: list[tuple[bytes, dict[bytes, bytes], QueueRequest | Garbage]] = []
        for entry_id, fields in entries:
            if entry_id not in deliveries:
                self.metrics.pickup_delay.labels(reader.model).observe(max(0.0, now_ms - entry_ms(entry_id)) / 1e3)
            try:
                item: QueueRequest | Garbage = parse(reader.model, entry_id, fields or {}, self.settings.result_ttl)
            except Garbage as exc:
                item = exc
            parsed.append((entry_id, fields or {}, item))
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, _, item in parsed:
                if isinstance(item, QueueRequest):
                    pipe.exists(result_key(self.settings.prefix, reader.model, item.id))
            exists = iter(await pipe.execute())
        for entry_id, fields, item in parsed:
            done = bool(next(exists)) if isinstance(item, QueueRequest) else False
            reader.held += 1
            task = asyncio.ensure_future(
                self._handle(reader, entry_id, fields, item, done, deliveries.get(entry_id, 1), now_ms))
            self._work.add(task)
            task.add_done_callback(self._work.discard)

    # -- one entry --------------------------------------------------------------------------

    async def _handle(self, reader: _Reader, entry_id: bytes, fields: dict[bytes, bytes],
                      item: QueueRequest | Garbage, done: bool, deliveries: int, picked_ms: float) -> None:
        model, settings = reader.model, self.settings
        try:
            if isinstance(item, Garbage):
                await self._dead(reader, entry_id, fields, "garbage", str(item), deliveries - 1, "INVALID_ARGUMENT")
                return
            if deliveries - 1 >= settings.max_deliveries:
                why = f"delivered {deliveries - 1} times without an answer"
                await self._dead(reader, entry_id, fields, "deliveries", why, deliveries - 1, "INTERNAL")
                return
            key = (model, item.id)
            earlier = self._running.get(key)
            if earlier is not None:  # the same id is computing here: answer from its result
                await asyncio.shield(earlier)
                done = True
            if done and await self._publish(reader, entry_id, item, None):
                return
            mine = self._running[key] = asyncio.get_running_loop().create_future()
            try:
                await self._run(reader, entry_id, item, picked_ms)
            finally:
                mine.set_result(None)
                if self._running.get(key) is mine:
                    del self._running[key]
        except RedisError as exc:  # left pending: reclaimed after the claim-idle time
            await self._trouble(reader, exc)
        finally:
            reader.held -= 1
            reader.room.set()

    async def _run(self, reader: _Reader, entry_id: bytes, item: QueueRequest, picked_ms: float) -> None:
        """Answer ``item`` through the front end's request path and publish it; retry a
        retryable refusal; leave it pending (no ack) while draining or when the model failed."""
        gate, clock = self.state.inflight, self.state.clock
        enqueued = entry_ms(entry_id)
        received = clock.now() - max(0.0, self.redis_ms() - enqueued) / 1e3
        task = asyncio.current_task()
        wait = RETRY_FIRST_S
        while True:
            with gate.held(task) as refusal:
                version, body, header_length = "", b"", None
                try:
                    response = await self.state.answer(item.request, math.inf, refusal, received=received)
                    status, message, version = "OK", "", response.model_version
                    if item.rest is not None:
                        body, header_length = rest.infer_body(response, item.rest)
                    else:
                        body = response.SerializeToString()
                except Retryable:
                    if reader.stopped or self.stopping:
                        return
                    status = ""
                except BackendError as exc:
                    log.warning("queue door: model %s entry %s failed (%s); left for redelivery",
                                reader.model, entry_id.decode(), exc)
                    return
                except TrtServeError as exc:
                    status, message = status_name(exc), str(exc)
                    if isinstance(exc, RequestTimeout):
                        self.metrics.expired.labels(reader.model).inc()
                if status:
                    now_ms = self.redis_ms()
                    timings = {"enqueued_ms": enqueued, "queue_ms": picked_ms - enqueued, "total_ms": now_ms - enqueued}
                    out = result_fields(item.id, reader.model, version, status, message, body=body,
                                        header_length=header_length, form="json" if item.rest else "proto",
                                        timings=timings)
                    await self._publish(reader, entry_id, item, out)
                    return
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)

    async def _publish(self, reader: _Reader, entry_id: bytes, item: QueueRequest,
                       fields: dict[bytes, bytes] | None) -> bool:
        """Write the result (unless one exists for the id), the reply and the ack in one
        MULTI/EXEC, watching the result key. ``fields`` None: answer only from an existing
        result; returns False (nothing written) when there is none."""
        key = result_key(self.settings.prefix, reader.model, item.id)
        written = True

        async def transaction(pipe: Any) -> None:
            nonlocal written
            stored = await pipe.hgetall(key)
            if not stored and fields is None:
                written = False
                await pipe.unwatch()
                return
            pipe.multi()
            if not stored:
                pipe.hset(key, mapping=fields)
                pipe.pexpire(key, item.ttl_ms)
            if item.reply_to:
                pipe.xadd(item.reply_to, stored or fields)
            pipe.xack(reader.stream, GROUP, entry_id)

        await self.redis.transaction(transaction, key)
        return written

    async def _dead(self, reader: _Reader, entry_id: bytes, fields: dict[bytes, bytes], kind: str, why: str,
                    deliveries: int, status: str) -> None:
        """Move an entry to the dead-letter stream with ``why``, answer its id (``status``, unless
        a result exists) and ack it, in one MULTI/EXEC."""
        rid = request_id(fields, entry_id)
        key = result_key(self.settings.prefix, reader.model, rid)
        letter = {**fields, b"reason": why.encode(), b"deliveries": str(deliveries).encode(), b"entry": entry_id}
        answer = result_fields(rid, reader.model, "", status, why)

        async def transaction(pipe: Any) -> None:
            stored = await pipe.exists(key)
            pipe.multi()
            pipe.xadd(dead_key(self.settings.prefix, reader.model), letter)
            if not stored:
                pipe.hset(key, mapping=answer)
                pipe.pexpire(key, max(1, round(self.settings.result_ttl * 1e3)))
            pipe.xack(reader.stream, GROUP, entry_id)

        await self.redis.transaction(transaction, key)
        self.metrics.dead_lettered.labels(reader.model, kind).inc()
        log.warning("queue door: model %s entry %s dead-lettered: %s", reader.model, entry_id.decode(), why)


__all__ = ["HEALTH_NAME", "QueueDoor", "QueueSettings"]
