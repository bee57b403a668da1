"""``ModelStreamInfer``: one bidirectional stream, its flow control and its drain.

A reader task takes messages off the stream; each becomes a task answering it (so messages
run concurrently and are answered in completion order, each with its ``id``). At most
``stream_inflight`` messages are unanswered-or-unwritten at once: past that the reader stops
reading and HTTP/2 flow control pushes back on the client, instead of answers piling up.

A message is admitted when it is read (so one read before a drain began is answered even if
its work starts later), and released exactly once when its task ends, however it ends
(answered, failed, or cancelled before it even started: the release is the task's done
callback, not code inside it, which a task cancelled before its first step never runs). While
draining, new messages are answered UNAVAILABLE and the stream ends OK as soon as none it
admitted is unanswered. When the client goes away, every task of the stream is cancelled, and
their rows leave the engine core's queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import Any, Protocol

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import ShuttingDown, TrtServeError
from trtserve.frontend.grpc.status import stream_error
from trtserve.frontend.inflight import GRACE_EXPIRED, InflightGate


class StreamOwner(Protocol):
    """What a stream needs of its inference service
    (:class:`~trtserve.frontend.grpc.service.InferenceService`)."""

    inflight: InflightGate
    stream_inflight: int
    wake_streams: set[asyncio.Queue[Any]]

    def deadline_of(self, context: Any) -> float:
        """The call's gRPC deadline, monotonic seconds (shared by every message of the stream)."""
        ...

    async def answer(self, request: pb.ModelInferRequest, deadline: float,
                     refusal: TrtServeError | None) -> pb.ModelInferResponse:
        """Answer one message, or raise the error its stream message carries."""
        ...


async def serve_stream(
    service: StreamOwner, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
    """The responses of one ``ModelStreamInfer`` call (see the module docstring)."""
    admission = service.inflight
    # None: the reader is done, or a drain began (look again at draining).
    outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
    slots = asyncio.Semaphore(service.stream_inflight)
    pending: set[asyncio.Task[None]] = set()
    unanswered = 0
    reading = True

    deadline = service.deadline_of(context)

    async def answer(request: pb.ModelInferRequest, refusal: TrtServeError | None) -> None:
        nonlocal unanswered
        try:
            response = await service.answer(request, deadline, refusal)
            message = pb.ModelStreamInferResponse(infer_response=response)
        except TrtServeError as exc:
            message = stream_error(request, exc)
        except asyncio.CancelledError:
            if not admission.expired:
                raise
            message = stream_error(request, ShuttingDown(GRACE_EXPIRED))
        unanswered -= 1
        outbox.put_nowait(message)  # its in-flight slot is released once it is written

    def finished(task: asyncio.Task[None], *, admitted: bool) -> None:
        pending.discard(task)
        if admitted:
            admission.release(task)

    async def read() -> None:
        nonlocal unanswered, reading
        try:
            async for request in request_iterator:
                await slots.acquire()
                unanswered += 1
                refusal = admission.admit()
                admitted = refusal is None
                task = asyncio.ensure_future(answer(request, refusal))
                if admitted:
                    admission.track(task)
                pending.add(task)
                task.add_done_callback(partial(finished, admitted=admitted))
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            reading = False
            outbox.put_nowait(None)

    reader = asyncio.ensure_future(read())
    service.wake_streams.add(outbox)
    try:
        while True:
            message = await outbox.get()
            if message is not None:
                yield message
                slots.release()
            elif not reading:
                await reader  # re-raise a read error (a broken stream)
                break
            if admission.draining and unanswered == 0 and outbox.empty():
                break  # drained: end the stream OK after its last answer
    finally:
        service.wake_streams.discard(outbox)
        reader.cancel()
        for task in list(pending):
            task.cancel()
