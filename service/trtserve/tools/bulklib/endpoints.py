"""The servers a bulk job sends to: per endpoint one ``grpc.aio`` channel, one ModelStreamInfer
stream at a time and the messages it holds unanswered; picking the endpoint for the next
message; the model's description read from the first server that answers; and the
ModelStatistics counters the summary's mean batch size comes from.

An endpoint whose stream broke, or that answered ``UNAVAILABLE``, is *down* until its backoff
(:func:`backoff`, growing with its consecutive failures) has passed, then takes one probe
message before its full ``max_inflight`` again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import CHANNEL_OPTIONS, Credentials
from trtserve.datatypes import DATATYPES
from trtserve.spec import TensorSpec
from trtserve.tools.bulklib.source import Row

log = logging.getLogger("trtserve.bulk")

# Refusals that no retry can cure: the job stops.
FATAL_CODES = frozenset({"NOT_FOUND", "UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED"})
BULK_CHANNEL_OPTIONS = CHANNEL_OPTIONS + [
    # reconnect to a restarted server within seconds, not grpc's default of up to 2 minutes
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


class BulkError(RuntimeError):
    """The job cannot go on (no server, unknown model, stalled); committed rows stay committed."""


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Exponential backoff with full jitter: up to ``base * 2**(attempt-1)`` seconds, capped."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2 ** max(attempt - 1, 0))


@dataclass
class Message:
    """Rows sharing one request: resent whole on a broken stream, split on a per-row error."""

    rows: list[Row]
    inputs: dict[str, np.ndarray]
    attempts: int = 0
    sent_at: float = 0.0


class Endpoint:
    """One server: its channel, stream state and what it holds unanswered."""

    def __init__(self, url: str, credentials: Credentials) -> None:
        self.url = url
        tls = credentials.channel_credentials()
        self.channel = (grpc.aio.secure_channel(url, tls, options=BULK_CHANNEL_OPTIONS) if tls
                        else grpc.aio.insecure_channel(url, options=BULK_CHANNEL_OPTIONS))
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.metadata = credentials.metadata
        self.inflight: dict[str, Message] = {}
        self.outstanding_rows = 0
        self.send_q: asyncio.Queue[pb.ModelInferRequest] = asyncio.Queue()
        self.failures = 0
        self.down_until = 0.0
        self.down_since: float | None = None  # monotonic time of the first failure since it last answered
        self.last_error = ""
        self.sent = 0
        self.rows_done = 0
        self.task: asyncio.Task | None = None

    def capacity(self, max_inflight: int) -> int:
        """Messages it may hold: one probe while recovering from a failure."""
        return 1 if self.failures else max_inflight

    def send(self, request_id: str, msg: Message, request: pb.ModelInferRequest) -> None:
        """Queue ``request`` (``msg``'s rows, id ``request_id``) on this endpoint's stream."""
        self.inflight[request_id] = msg
        self.outstanding_rows += len(msg.rows)
        self.sent += 1
        msg.sent_at = time.perf_counter()
        self.send_q.put_nowait(request)

    def answered(self, request_id: str) -> Message | None:
        """The message answered by ``request_id``, no longer held; ``None`` if it is not held
        (an answer from before a re-send)."""
        msg = self.inflight.pop(request_id, None)
        if msg is not None:
            self.outstanding_rows -= len(msg.rows)
        return msg

    def fail(self, why: str) -> float:
        """Count one more failure and mark the endpoint down for its backoff; returns that
        backoff in seconds."""
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
        delay = backoff(self.failures)
        self.down_until = time.monotonic() + delay
        self.last_error = why
        return delay

    def recovered(self) -> None:
        """It answered: no longer down."""
        self.failures = 0
        self.down_since = None

    def drop_inflight(self) -> list[Message]:
        """Forget every unanswered and unsent message (the stream is gone); returns the
        unanswered ones, to be sent again."""
        lost = list(self.inflight.values())
        self.inflight.clear()
        self.outstanding_rows = 0
        while not self.send_q.empty():
            self.send_q.get_nowait()
        return lost

    async def serve(self, on_response: Callable[[pb.ModelStreamInferResponse], None],
                    on_broken: Callable[[BaseException | None], None]) -> None:
        """Open a stream when there is something to send, write the queued requests and hand
        every answer to ``on_response``; when the stream breaks, call ``on_broken`` with the
        error (``None``: the server ended the stream) and wait for the next request."""
        while True:
            first = await self.send_q.get()
            call = self.stub.ModelStreamInfer(metadata=self.metadata)
            reader = asyncio.ensure_future(self._read_stream(call, on_response))
            writer = asyncio.ensure_future(self._write_stream(call, first))
            try:
                done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                reader.cancel()
                writer.cancel()
                call.cancel()
            exc = next((t.exception() for t in (reader, writer) if t in done and not t.cancelled() and t.exception()),
                       None)
            on_broken(exc)

    async def _write_stream(self, call, first: pb.ModelInferRequest) -> None:
        await call.write(first)
        while True:
            await call.write(await self.send_q.get())

    async def _read_stream(self, call, on_response: Callable[[pb.ModelStreamInferResponse], None]) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            on_response(message)


async def pick(endpoints: Sequence[Endpoint], max_inflight: int, capacity_changed: asyncio.Event) -> Endpoint:
    """The live endpoint with a free slot and the least outstanding rows (ties: the one sent
    fewer messages). Waits for one: until ``capacity_changed`` is set or the first endpoint
    that is down is due back."""
    while True:
        now = time.monotonic()
        best = None
        for ep in endpoints:
            if now < ep.down_until or len(ep.inflight) >= ep.capacity(max_inflight):
                continue
            if best is None or (ep.outstanding_rows, ep.sent) < (best.outstanding_rows, best.sent):
                best = ep
        if best is not None:
            return best
        capacity_changed.clear()
        waits = [ep.down_until - now for ep in endpoints if ep.down_until > now]
        try:
            await asyncio.wait_for(capacity_changed.wait(), timeout=min(waits) if waits else None)
        except asyncio.TimeoutError:
            pass


@dataclass(frozen=True)
class RemoteModel:
    """The model as a server describes it: inputs and outputs without the batch axis, its
    ``max_batch_size`` (0: unbatched) and the version that answered ("?" if none is named)."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    version: str

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0


async def discover(endpoints: Sequence[Endpoint], model: str, timeout_s: float) -> RemoteModel:
    """Read ``model``'s metadata and config from the first endpoint that answers, trying them
    all again (with backoff) until one does.

    Raises:
        BulkError: an endpoint answered with a :data:`FATAL_CODES` status (unknown model, bad
            token, ...), or none answered within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        errors = []
        for ep in endpoints:
            try:
                meta = await ep.stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=10,
                                                   metadata=ep.metadata)
                config = (await ep.stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=10,
                                                    metadata=ep.metadata)).config
            except grpc.aio.AioRpcError as exc:
                if exc.code().name in FATAL_CODES:  # retrying cannot help (unknown model, bad token, ...)
                    raise BulkError(f"{ep.url}: {exc.code().name}: {exc.details()}") from None
                errors.append(f"{ep.url}: {exc.code().name}: {exc.details()}")
                continue
            cut = 1 if config.max_batch_size > 0 else 0
            return RemoteModel(
                inputs=[TensorSpec(t.name, DATATYPES[t.datatype], tuple(t.shape[cut:])) for t in meta.inputs],
                outputs=[TensorSpec(t.name, DATATYPES[t.datatype], tuple(t.shape[cut:])) for t in meta.outputs],
                max_batch_size=config.max_batch_size,
                version=meta.versions[0] if meta.versions else "?",
            )
        attempt += 1
        if time.monotonic() > deadline:
            raise BulkError("no endpoint answered: " + "; ".join(errors))
        log.warning("no endpoint answered yet (%s); retrying", "; ".join(errors))
        await asyncio.sleep(backoff(attempt, 0.5, 5.0))


Counts = dict[str, tuple[int, int] | None]


async def model_statistics(endpoints: Sequence[Endpoint], model: str) -> Counts:
    """Endpoint URL → (rows, engine runs) of ``model`` from ModelStatistics (``None`` if down)."""

    async def one(ep: Endpoint) -> tuple[int, int] | None:
        try:
            r = await ep.stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=5, metadata=ep.metadata)
        except grpc.aio.AioRpcError:
            return None
        s = r.model_stats[0] if r.model_stats else None
        return (s.inference_count, s.execution_count) if s else None

    values = await asyncio.gather(*(one(ep) for ep in endpoints))
    return dict(zip((ep.url for ep in endpoints), values))


def mean_batch_size(before: Counts, after: Counts) -> float:
    """Rows per engine run over all endpoints between two :func:`model_statistics` readings
    (NaN when no run is counted); a server that restarted in between counts from zero."""
    rows = runs = 0
    for url, a in after.items():
        b = before.get(url)
        if a is None:
            continue
        if b is None or a[0] < b[0]:  # the server restarted during the run: its counts are since then
            b = (0, 0)
        rows += a[0] - b[0]
        runs += a[1] - b[1]
    return rows / runs if runs else math.nan
