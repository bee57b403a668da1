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
from collections.abc import AsyncIterator
from typing import Any, Protocol

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import ShuttingDown, TrtServeError
from trtserve.frontend.grpc.status import stream_error
from trtserve.frontend.inflight import GRACE_EXPIRED, InflightGate
from trtserve.frontend.state import FrontendState


class StreamOwner(Protocol):
    """What a stream needs of its inference service
    (:class:`~trtserve.frontend.grpc.service.InferenceService`)."""

    inflight: InflightGate
    stream_inflight: int
    wake_streams: set[asyncio.Queue[Any]]

    @property
    def state(self) -> FrontendState:
        """The front end's request path (:meth:`FrontendState.answer
        <trtserve.frontend.state.FrontendState.answer>` answers each message)."""
        ...

    def transport_deadline(self, context: Any) -> float:
        """The call's gRPC deadline, monotonic seconds (shared by every message of the stream)."""
        ...


async def serve_stream(
    service: StreamOwner, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
) -> None:
    """Answer one ``ModelStreamInfer`` call (see the module docstring), each response written
    with ``context.write`` (grpc.aio's writer API: no async generator between the outbox and
    the transport); returns when the stream is done."""
    admission = service.inflight
    answer_one = service.state.answer
    # None: the reader is done, or a drain began (look again at draining).
    outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
    slots = asyncio.Semaphore(service.stream_inflight)
    pending: set[asyncio.Task[None]] = set()
    unanswered = 0
    reading = True

    transport_deadline = service.transport_deadline(context)

    async def answer(request: pb.ModelInferRequest, refusal: TrtServeError | None) -> None:
        nonlocal unanswered
        try:
            response = await answer_one(request, transport_deadline, refusal)
            message = pb.ModelStreamInferResponse(infer_response=response)
        except TrtServeError as exc:
            message = stream_error(request, exc)
        except asyncio.CancelledError:
            if not admission.expired:
                raise
            message = stream_error(request, ShuttingDown(GRACE_EXPIRED))
        unanswered -= 1
        outbox.put_nowait(message)  # its in-flight slot is released once it is written

    def finished_refused(task: asyncio.Task[None]) -> None:
        pending.discard(task)

    def finished_admitted(task: asyncio.Task[None]) -> None:
        pending.discard(task)
        admission.release(task)

    loop = asyncio.get_running_loop()

    async def read() -> None:
        nonlocal unanswered, reading
        try:
            async for request in request_iterator:
                await slots.acquire()
                unanswered += 1
                refusal = admission.admit()
                task = loop.create_task(answer(request, refusal))
                pending.add(task)
                if refusal is None:
                    admission.track(task)
                    task.add_done_callback(finished_admitted)
                else:
                    task.add_done_callback(finished_refused)
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
                await context.write(message)
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
