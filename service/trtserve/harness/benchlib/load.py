"""Load generators on ``grpc.aio``, in the bench process, against the server subprocess.

Requests travel as bytes serialized before the clock starts (the channel's unary method
has no serializer, and unary answers are not parsed: only their status is kept). Stream
answers are parsed for their ``id`` and error code.

Every point runs ``warmup_s`` unmeasured, then a window of ``duration_s``; the requests
*sent* (closed loop) or *scheduled* (open loop) inside the window are the point's sample,
each followed to its answer after the window closes. Times are ``time.perf_counter()``
seconds; latency runs from sending a request to its answer.

A unary call carries a gRPC deadline: by default only :data:`CALL_TIMEOUT_S`, a safety net;
the open loop's ``grpc_deadline`` gives each call its request's own deadline instead (as a
client with an SLO would), so an answer that cannot come in time ends the call at that
deadline on the client's side, DEADLINE_EXCEEDED.

Doors: every call goes to the gRPC door unless :meth:`LoadGenerator.over_http` sends the unary
calls to the HTTP door (KServe v2 REST): the closed loop's by the bench's aiohttp client, the
open loop's by the Go binary (its ``-http``; there a request's deadline travels as the
``trtserve-timeout-us`` header and the client's own deadline, and statuses are recorded as the
gRPC names they stand for).
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.harness.benchlib.protocols import GRPC, HTTP
from trtserve.harness.benchlib.records import Recorder
from trtserve.harness.benchlib.report import Snapshot

if TYPE_CHECKING:
    from trtserve.harness.benchlib.goclient import GoLoadgen
    from trtserve.harness.benchlib.httpclient import RestClient, RestRequest

METHOD = "/inference.GRPCInferenceService/"
CALL_TIMEOUT_S = 300.0
"""gRPC deadline of each unary call: a safety net against a hung server, never reached in a
healthy run (a request's own deadline, where it has one, is its ``timeout`` parameter)."""

Drive = Callable[[Recorder, asyncio.Event], Awaitable[None]]


@dataclass(frozen=True)
class Window:
    """The measured part of a point.

    Attributes:
        seconds: window length.
        keys: per request, the index of the message it sent in the point's ``messages``
            (open-loop unary: arrival k sends message k mod len(messages), so with one
            message per arrival the key is the arrival), in the order of the other arrays.
        latency_us: per request, send → answer in microseconds.
        codes: per request, gRPC status name.
        late_mask: per request, True for an OK answer after its deadline.
        send_lag_us: per request, send − scheduled arrival in microseconds.
        before, after: counters at the window's start and after its last answer.
        door: the door the requests went to: ``grpc`` or ``http``.
    """

    seconds: float
    keys: np.ndarray
    latency_us: np.ndarray
    codes: tuple[str, ...]
    late_mask: np.ndarray
    send_lag_us: np.ndarray
    before: Snapshot
    after: Snapshot
    door: str = GRPC

    @property
    def late(self) -> int:
        """OK answers after their deadline."""
        return int(self.late_mask.sum())


def open_channels(url: str, count: int, options: Sequence[tuple[str, object]]) -> list[grpc.aio.Channel]:
    """``count`` insecure ``grpc.aio`` channels to ``url``, each on its own TCP connection.

    gRPC shares one connection among channels to the same target with the same arguments
    (its global subchannel pool); ``grpc.use_local_subchannel_pool`` gives each channel a
    pool of its own, so the server sees ``count`` connections (which SO_REUSEPORT spreads
    over front-end processes). Close them with ``await channel.close()``.
    """
    opts = [*options, ("grpc.use_local_subchannel_pool", 1)]
    return [grpc.aio.insecure_channel(url, options=opts) for _ in range(count)]


def json_bodies(requests: Sequence[RestRequest]) -> tuple[str, list[bytes]]:
    """The one path and the bodies of REST infer ``requests``, as the Go binary sends them over
    HTTP (``-http PATH``, each body as JSON).

    Raises:
        ValueError: no requests, more than one path, or a request that needs a header (the
            binary tensor extension's ``Inference-Header-Content-Length``): the binary sends
            none.
    """
    paths = {r.path for r in requests}
    if len(paths) != 1:
        raise ValueError(f"the Go load generator sends to one path over HTTP, got {sorted(paths)}")
    if any(r.headers for r in requests):
        raise ValueError("the Go load generator sends JSON bodies without headers over HTTP: build the requests with "
                         "binary=False (no binary tensor extension)")
    return paths.pop(), [r.body for r in requests]


def _stream_code(response: pb.ModelStreamInferResponse) -> str:
    if not response.error_message:
        return "OK"
    params = response.infer_response.parameters
    return params["error_code"].string_param if "error_code" in params else "UNKNOWN"


async def _on_schedule(
    arrivals: np.ndarray, stop: asyncio.Event, recorder: Recorder
) -> AsyncIterator[tuple[int, float]]:
    """Yield ``(k, scheduled time)`` at each of ``arrivals`` (seconds from now), until ``stop``
    is set; then still every arrival scheduled before ``recorder.window_end``. A generator that
    has fallen behind its schedule (the client's CPU is the limit) so still sends the whole
    window's sample, late, and its send lag shows by how much, instead of a window with the
    requests it did not reach left out."""
    base = time.perf_counter()
    for k, offset in enumerate(arrivals):
        # Behind schedule the sleep is 0, which still lets the loop run the calls already sent
        # (and the window's clock): a generator that never yielded would queue the whole trace.
        await asyncio.sleep(max(base + offset - time.perf_counter(), 0.0))
        if stop.is_set() and base + offset >= recorder.window_end:
            return
        yield k, base + offset


class LoadGenerator:
    """Drives one server over one or more channels (client connections).

    Unary calls are spread over the channels: caller k of a closed loop (request k of an
    open loop) uses channel ``k mod len(channels)``, as many clients, or a client's channel
    pool, would spread them. The stream, ModelStatistics and ModelReady use the first channel.
    :meth:`over_http` gives a generator whose unary calls go to the HTTP door instead.

    Args:
        channels: ``grpc.aio`` channels to the server, each its own connection (see
            :func:`open_channels`).
        server_cpu_s: reads the server's CPU seconds (its whole process tree).
        server_rss_mib: reads the server's resident memory in MiB (its whole process tree);
            None: not read (snapshots carry None).
        warmup_s: unmeasured seconds at the start of each point.
        duration_s: seconds of each point's measuring window.
        go: when given, :meth:`open_unary` runs the Go binary (:mod:`.goclient`) over as many
            connections of its own as this generator has channels, instead of ``grpc.aio``;
            the client CPU of its points is then the bench process's plus the binary's.
    """

    def __init__(self, channels: Sequence[grpc.aio.Channel], server_cpu_s: Callable[[], float], warmup_s: float,
                 duration_s: float, server_rss_mib: Callable[[], float] | None = None,
                 go: GoLoadgen | None = None) -> None:
        if not channels:
            raise ValueError("a load generator needs at least one channel")
        channel = channels[0]
        self._infers = [c.unary_unary(METHOD + "ModelInfer") for c in channels]
        self._stream = channel.stream_stream(
            METHOD + "ModelStreamInfer", response_deserializer=pb.ModelStreamInferResponse.FromString
        )
        self._statistics = channel.unary_unary(
            METHOD + "ModelStatistics",
            request_serializer=pb.ModelStatisticsRequest.SerializeToString,
            response_deserializer=pb.ModelStatisticsResponse.FromString,
        )
        self._ready = channel.unary_unary(
            METHOD + "ModelReady",
            request_serializer=pb.ModelReadyRequest.SerializeToString,
            response_deserializer=pb.ModelReadyResponse.FromString,
        )
        self._config = channel.unary_unary(
            METHOD + "ModelConfig",
            request_serializer=pb.ModelConfigRequest.SerializeToString,
            response_deserializer=pb.ModelConfigResponse.FromString,
        )
        self._server_cpu_s = server_cpu_s
        self._server_rss_mib = server_rss_mib
        self.warmup_s = warmup_s
        self.duration_s = duration_s
        self._go = go
        self._rest: RestClient | None = None

    @property
    def connections(self) -> int:
        """Connections the unary calls are spread over: channels, or at most this many HTTP
        connections over HTTP (one per caller in flight)."""
        return len(self._infers) if self._rest is None else self._rest.connections

    @property
    def protocol(self) -> str:
        """The door of the unary calls: ``grpc`` or ``http``."""
        return GRPC if self._rest is None else HTTP

    def over_http(self, rest: RestClient, go: GoLoadgen | None = None) -> LoadGenerator:
        """The same generator (its channels still read the counters and ModelReady) with its
        unary calls sent to the HTTP door: the closed loop's by ``rest``, the open loop's by
        ``go`` (the Go binary at the HTTP door's address; without it :meth:`open_unary`
        refuses). Their messages are then :class:`~.httpclient.RestRequest` bodies, not
        serialized ModelInferRequests; the open loop's must be JSON alone, one path for all."""
        other = copy.copy(self)
        other._rest = rest
        other._go = go
        return other

    def with_duration(self, duration_s: float) -> LoadGenerator:
        """The same generator (channels, counters, warm-up) with another window length."""
        other = copy.copy(self)
        other.duration_s = duration_s
        return other

    def with_connections(self, count: int) -> LoadGenerator:
        """The same generator over only its first ``count`` channels."""
        if not 1 <= count <= len(self._infers):
            raise ValueError(f"expected 1 to {len(self._infers)} connections, got {count}")
        other = copy.copy(self)
        other._infers = self._infers[:count]
        return other

    async def model_ready(self, model: str) -> bool:
        """Whether the server serves ``model`` (ModelReady)."""
        response = await self._ready(pb.ModelReadyRequest(name=model))
        return response.ready

    async def max_batch_size(self, model: str) -> int:
        """The ``max_batch_size`` the server serves ``model`` with (ModelConfig): the config's,
        or the one it chose at load where the config leaves it to the server."""
        response = await self._config(pb.ModelConfigRequest(name=model))
        return response.config.max_batch_size

    @property
    def open_loop_client(self) -> str:
        """The client of :meth:`open_unary`: ``go`` or ``python``."""
        return "python" if self._go is None else "go"

    async def snapshot(self, model: str, client_cpu_s: Callable[[], float] | None = None) -> Snapshot:
        """CPU seconds of both processes and the server's resident memory, now, then the model's
        ModelStatistics counters (as soon as the server answers: a server swamped by an open
        loop may take seconds); ``client_cpu_s`` adds the CPU seconds of another client process
        (the Go binary) to the bench's."""
        own = os.times()
        server_cpu_s = self._server_cpu_s()
        client = own.user + own.system + (client_cpu_s() if client_cpu_s is not None else 0.0)
        rss = self._server_rss_mib() if self._server_rss_mib is not None else None
        response = await self._statistics(pb.ModelStatisticsRequest(name=model))
        stats = response.model_stats[0]
        return Snapshot(
            server_cpu_s=server_cpu_s,
            client_cpu_s=client,
            inference_count=stats.inference_count,
            execution_count=stats.execution_count,
            batches={b.batch_size: b.compute_infer.count for b in stats.batch_stats},
            server_rss_mib=rss,
        )

    async def _unary(self, message: bytes | RestRequest, k: int, timeout_s: float = CALL_TIMEOUT_S) -> str:
        """Send ``message`` on channel ``k mod connections`` with a gRPC deadline of
        ``timeout_s`` seconds (over HTTP: on a free kept-alive connection, given up after
        ``timeout_s``); its status name."""
        if self._rest is not None:
            return await self._rest.infer(message, timeout_s)
        try:
            await self._infers[k % len(self._infers)](message, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return "OK"

    async def measure(self, model: str, drive: Drive, client_cpu_s: Callable[[], float] | None = None) -> Window:
        """One point: ``drive(recorder, stop)`` sends and records requests (``recorder.add`` per
        answer) until ``stop`` is set, then follows what it sent to its answers and returns; it runs
        ``warmup_s`` unmeasured, then a window of ``duration_s`` from the first of two
        :meth:`snapshot` of ``model`` (the second after the last answer).
        The requests scheduled inside the window are the sample (module docstring). A drive that
        raises ends the point with its exception."""
        recorder = Recorder()
        stop = asyncio.Event()
        task = asyncio.ensure_future(drive(recorder, stop))
        try:
            await asyncio.sleep(self.warmup_s)
            # The window opens when the warm-up ends and lasts duration_s, however long the
            # server's counters take: a door swamped by an open loop can hold ModelStatistics up
            # for seconds, past the end of a pre-drawn schedule (its batch counts are then read
            # late; the CPU and memory figures are read at once).
            start = time.perf_counter()
            end = start + self.duration_s
            before = await self.snapshot(model, client_cpu_s)
            await asyncio.sleep(max(end - time.perf_counter(), 0.0))
            recorder.window_end = end
            stop.set()
            await task
        finally:
            task.cancel()
        after = await self.snapshot(model, client_cpu_s)
        scheduled = np.asarray(recorder.scheduled)
        keep = (scheduled >= start) & (scheduled < end)
        sent, done = np.asarray(recorder.sent)[keep], np.asarray(recorder.done)[keep]
        return Window(
            seconds=end - start,
            keys=np.asarray(recorder.keys, dtype=np.int64)[keep],
            latency_us=(done - sent) * 1e6,
            codes=tuple(np.asarray(recorder.codes, dtype=object)[keep]),
            late_mask=np.asarray(recorder.late, dtype=bool)[keep],
            send_lag_us=(sent - scheduled[keep]) * 1e6,
            before=before,
            after=after,
            door=self.protocol,
        )

    async def closed_unary(self, model: str, messages: Sequence[bytes] | Sequence[RestRequest],
                           concurrency: int) -> Window:
        """``concurrency`` callers, each sending its next ModelInfer (over HTTP: REST infer
        request) when the last is answered."""

        async def caller(first: int, recorder: Recorder, stop: asyncio.Event) -> None:
            i = first
            while not stop.is_set():
                key = i % len(messages)
                i += concurrency
                sent = time.perf_counter()
                code = await self._unary(messages[key], first)
                recorder.add(key, sent, sent, time.perf_counter(), code, None)

        async def drive(recorder: Recorder, stop: asyncio.Event) -> None:
            await asyncio.gather(*(caller(k, recorder, stop) for k in range(concurrency)))

        return await self.measure(model, drive)

    async def closed_stream(self, model: str, messages: Sequence[bytes], concurrency: int) -> Window:
        """One ModelStreamInfer stream with ``concurrency`` requests in flight: each answer
        sends the next. ``messages[i]`` must carry id ``str(i)``; more messages than
        ``concurrency``, so that the ids in flight are distinct."""
        if len(messages) <= concurrency:
            raise ValueError(f"a stream at concurrency {concurrency} needs more than {len(messages)} messages")

        async def drive(recorder: Recorder, stop: asyncio.Event) -> None:
            call = self._stream()
            free = deque(range(len(messages)))
            sent_at = [0.0] * len(messages)

            async def send() -> None:
                i = free.popleft()
                sent_at[i] = time.perf_counter()
                await call.write(messages[i])

            for _ in range(concurrency):
                await send()
            inflight = concurrency
            while inflight:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the server closed the stream with requests unanswered")
                i = int(response.infer_response.id)
                recorder.add(i, sent_at[i], sent_at[i], time.perf_counter(), _stream_code(response), None)
                free.append(i)
                inflight -= 1
                if not stop.is_set():
                    await send()
                    inflight += 1
            await call.done_writing()
            await call.read()  # EOF: the server has finished the call

        return await self.measure(model, drive)

    async def open_unary(self, model: str, messages: Sequence[bytes] | Sequence[RestRequest], arrivals: np.ndarray,
                         deadline_s: float | Sequence[float], *, grpc_deadline: bool = False) -> Window:
        """A ModelInfer at each of ``arrivals`` (seconds from the start, Poisson), each its
        own call, whether or not earlier ones were answered. Arrival k sends message
        ``k mod len(messages)``, whose deadline is ``deadline_s`` (seconds; one for all, or one
        per message, in the order of ``messages``); with ``grpc_deadline`` the call's gRPC
        deadline is that deadline too. With the Go client (``go``) the same schedule, window and
        records, sent by the binary; over HTTP (:meth:`over_http`) the binary POSTs each
        message's JSON body, its call deadline sent as the ``trtserve-timeout-us`` header.

        Raises:
            RuntimeError: the binary fails.
            ValueError: over HTTP without the Go binary, or with bodies it cannot send (see
                :func:`json_bodies`).
        """
        if self._rest is not None and self._go is None:
            raise ValueError("the open loop drives the HTTP door with the Go load generator only")
        if isinstance(deadline_s, (int, float)):
            deadlines = [float(deadline_s)] * len(messages)
        else:
            deadlines = [float(d) for d in deadline_s]
        if len(deadlines) != len(messages):
            raise ValueError(f"{len(messages)} messages need as many deadlines, got {len(deadlines)}")
        if self._go is not None:
            keys = np.arange(len(arrivals)) % len(messages)
            if grpc_deadline:
                call_us: np.ndarray | int = np.round(np.asarray(deadlines) * 1e6).astype(np.int64)[keys]
            else:
                call_us = round(CALL_TIMEOUT_S * 1e6)
            schedule = (arrivals, keys, call_us)
            path, bodies = json_bodies(messages) if self._rest is not None else (None, messages)
            async with self._go.started(bodies, schedule=schedule, connections=self.connections,
                                        http_path=path) as run:
                return await self.measure(model, lambda recorder, stop: run.drive(recorder, stop, deadlines),
                                           run.cpu_s)

        async def one(k: int, scheduled: float, recorder: Recorder) -> None:
            key = k % len(messages)
            sent = time.perf_counter()
            code = await self._unary(messages[key], k, deadlines[key] if grpc_deadline else CALL_TIMEOUT_S)
            recorder.add(key, scheduled, sent, time.perf_counter(), code, deadlines[key])

        async def drive(recorder: Recorder, stop: asyncio.Event) -> None:
            calls = [
                asyncio.ensure_future(one(k, at, recorder))
                async for k, at in _on_schedule(arrivals, stop, recorder)
            ]
            await asyncio.gather(*calls)

        return await self.measure(model, drive)

    async def open_stream(self, model: str, messages: Sequence[bytes], arrivals: np.ndarray,
                          deadline_s: float) -> Window:
        """One ModelStreamInfer stream, message k written at ``arrivals[k]`` (seconds from
        the start, Poisson). ``messages[k]`` must carry id ``str(k)``, one per arrival."""
        if len(messages) < len(arrivals):
            raise ValueError(f"{len(arrivals)} arrivals need as many messages, got {len(messages)}")

        async def drive(recorder: Recorder, stop: asyncio.Event) -> None:
            call = self._stream()
            scheduled = [0.0] * len(arrivals)
            sent = [0.0] * len(arrivals)

            async def read() -> None:
                while (response := await call.read()) is not grpc.aio.EOF:
                    k = int(response.infer_response.id)
                    recorder.add(k, scheduled[k], sent[k], time.perf_counter(), _stream_code(response), deadline_s)

            reader = asyncio.ensure_future(read())
            try:
                async for k, at in _on_schedule(arrivals, stop, recorder):
                    scheduled[k], sent[k] = at, time.perf_counter()
                    await call.write(messages[k])
                await call.done_writing()
                await reader
            finally:
                reader.cancel()

        return await self.measure(model, drive)
