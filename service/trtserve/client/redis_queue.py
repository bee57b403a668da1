"""Python client of trtserve's queue door (Redis Streams): enqueue requests now, collect the
results later, from any process.

Example::

    from trtserve.client.redis_queue import QueueClient

    with QueueClient("redis://127.0.0.1:6379/0") as queue:
        ids = [queue.enqueue("tiny", {"INPUT": row[None]}) for row in rows]
        for request_id, result in queue.collect(ids, timeout=60).items():
            print(request_id, result.status, result.outputs)

Each request is a serialized ``ModelInferRequest`` (the message's ``proto`` format), so the
outputs come back as numpy arrays. The results come on this client's reply stream (one per
client, deleted by :meth:`QueueClient.close`) and stay in their result keys for the result TTL;
:meth:`QueueClient.result` reads one key. The message and result fields:
:mod:`trtserve.protocol.queue` (``docs/guide/queue.md``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import redis

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import build_request, parse_response
from trtserve.protocol.queue import result_key, stream_key


@dataclass(frozen=True)
class QueueResult:
    """One request's result.

    Attributes:
        id: the request id; ``status``: ``OK`` or the gRPC status name; ``message``: the error's
            sentence (empty for OK).
        outputs: output name → array (OK only; None otherwise).
        timings: ``enqueued_ms``, ``queue_ms``, ``total_ms`` (milliseconds, Redis's clock).
    """

    id: str
    status: str
    message: str
    outputs: dict[str, np.ndarray] | None
    timings: dict[str, float]

    @classmethod
    def of(cls, fields: Mapping[bytes, bytes]) -> QueueResult:
        """A result from its hash or reply-stream fields (the ``proto`` format's body)."""
        text = {k.decode(): v for k, v in fields.items()}
        status = text["status"].decode()
        outputs = None
        if status == "OK" and text.get("format", b"proto") == b"proto":
            outputs = parse_response(pb.ModelInferResponse.FromString(text.get("body", b"")))
        timings = {k: float(text[k]) for k in ("enqueued_ms", "queue_ms", "total_ms") if k in text}
        return cls(text["id"].decode(), status, text.get("message", b"").decode(), outputs, timings)


class QueueClient:
    """Enqueue requests to the queue door and collect their results (blocking; redis-py).

    Args:
        url: the Redis URL the server reads (``--redis-url``).
        prefix: the server's key prefix.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "trtserve") -> None:
        self.redis = redis.Redis.from_url(url)
        self.prefix = prefix
        self.reply_to = f"{prefix}:replies:{uuid.uuid4().hex}"
        self._seen = "0-0"
        self._results: dict[str, QueueResult] = {}

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete this client's reply stream and close the connections."""
        self.redis.delete(self.reply_to)
        self.redis.close()

    def enqueue(self, model: str, inputs: Mapping[str, np.ndarray], *, request_id: str | None = None,
                outputs: Iterable[str] = (), priority: int | None = None, timeout_us: int | None = None,
                result_ttl_s: float | None = None, version: str = "") -> str:
        """Append one request to ``model``'s stream; returns its request id (a new UUID unless
        given: the same id twice is computed once).

        Args:
            inputs: input name → array (the batch dimension included where the model has one).
            priority: 1 is the most urgent; ``timeout_us``: microseconds from the time Redis
                takes the message (the time it waits in the queue counts).
        """
        rid = request_id or uuid.uuid4().hex
        body = build_request(model, inputs, request_id=rid, outputs=outputs).SerializeToString()
        fields: dict[str, str | bytes] = {"format": "proto", "body": body, "id": rid, "reply_to": self.reply_to}
        for name, value in (("version", version), ("priority", priority), ("timeout_us", timeout_us),
                            ("result_ttl_s", result_ttl_s)):
            if value:
                fields[name] = str(value)
        self.redis.xadd(stream_key(self.prefix, model), fields)
        return rid

    def result(self, model: str, request_id: str) -> QueueResult | None:
        """The result of ``request_id`` from its key, or None (not answered yet, or expired)."""
        fields = self.redis.hgetall(result_key(self.prefix, model, request_id))
        return QueueResult.of(fields) if fields else None

    def collect(self, ids: Iterable[str], timeout: float = 60.0) -> dict[str, QueueResult]:
        """Wait for the results of ``ids`` (enqueued by this client) on its reply stream, at most
        ``timeout`` seconds; returns those that came (any missing: not answered in time)."""
        wanted = set(ids)
        end = time.monotonic() + timeout
        while not wanted <= self._results.keys():
            left = end - time.monotonic()
            if left <= 0:
                break
            reply = self.redis.xread({self.reply_to: self._seen}, count=1000, block=max(1, int(min(left, 1.0) * 1e3)))
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    self._seen = entry_id
                    result = QueueResult.of(fields)
                    self._results[result.id] = result
        return {rid: self._results[rid] for rid in wanted if rid in self._results}


__all__ = ["QueueClient", "QueueResult"]
