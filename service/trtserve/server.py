"""The gRPC layer: ``inference.GRPCInferenceService`` on ``grpc.aio``.

Only an adapter: protobuf in → codec → :class:`~trtserve.pipeline.ServedModel` → codec →
protobuf out. Errors from the layers below are mapped to gRPC status codes once, in
:data:`STATUS_FOR`; this is the only module that imports grpc.

Request parameters understood (``../shared/notes/protocol.md`` b5):

* ``timeout`` (int64, microseconds): the request's own deadline, also per message in a stream.
* ``priority`` (uint64 or int64): 1 is the most urgent; 0 or absent means the model's default.

A request's deadline is the earliest of its gRPC deadline, its ``timeout`` and the model's
``default_timeout_microseconds``. Stream responses come back in completion order, each carrying
its request ``id``; an error for one message is sent as that message's ``error_message`` (with
the status name in ``infer_response.parameters["error_code"]``) and the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc

from . import __version__
from ._proto.inference import grpc_service_pb2 as pb
from ._proto.inference import grpc_service_pb2_grpc as pb_grpc
from .errors import (
    BackendError,
    InvalidRequest,
    ModelNotFound,
    ModelNotReady,
    QueueFull,
    RequestTimeout,
    ResponseTooLarge,
    ShuttingDown,
    TrtServeError,
    Unsupported,
)
from .protocol import codec
from .repository import ModelState, Repository

log = logging.getLogger(__name__)

STATUS_FOR: dict[type[TrtServeError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    ResponseTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    BackendError: grpc.StatusCode.INTERNAL,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotReady: grpc.StatusCode.UNAVAILABLE,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
}

DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
DEFAULT_STREAM_INFLIGHT = 256
EXTENSIONS = ["model_configuration", "parameters", "schedule_policy", "statistics"]


def status_for(exc: TrtServeError) -> grpc.StatusCode:
    """The gRPC status code of a trtserve error (most specific class first)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]  # type: ignore[index]
    return grpc.StatusCode.INTERNAL


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 / Triton inference service over a :class:`Repository`.

    Args:
        repository: the loaded models.
        max_send_bytes: a response larger than this fails with RESOURCE_EXHAUSTED, alone.
        stream_inflight: requests of one stream being processed at once; beyond it the
            server stops reading the stream (HTTP/2 flow control pushes back on the client).
    """

    def __init__(
        self,
        repository: Repository,
        *,
        max_send_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
    ) -> None:
        self.repository = repository
        self.max_send_bytes = max_send_bytes
        self.stream_inflight = stream_inflight
        self.draining = False

    # -- health and metadata --------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=not self.draining and self.repository.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            self.repository.get(request.name, request.version)
        except TrtServeError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not self.draining)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="trtserve", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        spec = (await self._call(context, self._model, request.name, request.version)).spec
        response = pb.ModelMetadataResponse(name=spec.name, versions=[spec.version], platform=spec.platform)
        for tensors, field in ((spec.inputs, response.inputs), (spec.outputs, response.outputs)):
            for t in tensors:
                field.add(name=t.name, datatype=t.datatype.name, shape=t.shape(spec.batched))
        return response

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        spec = (await self._call(context, self._model, request.name, request.version)).spec
        return pb.ModelConfigResponse(config=spec.config)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        names = [request.name] if request.name else sorted(self.repository.models)
        response = pb.ModelStatisticsResponse()
        for name in names:
            try:
                served = self.repository.get(name, request.version)
            except ModelNotReady:
                continue
            except ModelNotFound as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            stats = served.dispatcher.stats
            model_stats = response.model_stats.add(
                name=name,
                version=served.spec.version,
                inference_count=stats.rows,
                execution_count=stats.batches,
            )
            model_stats.inference_stats.compute_infer.count = stats.batches
            model_stats.inference_stats.compute_infer.ns = int(stats.compute_seconds * 1e9)
            for size, runs in sorted(stats.batch_sizes.items()):
                batch = model_stats.batch_stats.add(batch_size=size)
                batch.compute_infer.count = runs
                batch.compute_infer.ns = int(stats.batch_seconds[size] * 1e9)
        return response

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for name, entry in sorted(self.repository.models.items()):
            if request.ready and entry.state is not ModelState.READY:
                continue
            version = entry.spec.version if entry.spec else ""
            response.models.add(name=name, version=version, state=entry.state.value, reason=entry.reason)
        return response

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._call(context, self._infer, request, context.time_remaining())

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self.stream_inflight)
        pending: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest, remaining: float | None) -> None:
            try:
                message = pb.ModelStreamInferResponse(infer_response=await self._infer(request, remaining))
            except TrtServeError as exc:
                message = pb.ModelStreamInferResponse(error_message=str(exc))
                message.infer_response.id = request.id
                message.infer_response.parameters["error_code"].string_param = status_for(exc).name
            finally:
                slots.release()
            outbox.put_nowait(message)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    task = asyncio.ensure_future(answer(request, context.time_remaining()))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if pending:
                    await asyncio.gather(*pending)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (message := await outbox.get()) is not None:
                yield message
            await reader  # re-raise a read error (a broken stream)
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def _infer(self, request: pb.ModelInferRequest, remaining: float | None) -> pb.ModelInferResponse:
        if self.draining:
            raise ShuttingDown("the server is shutting down and accepts no new requests")
        served = self._model(request.model_name, request.model_version)
        spec = served.spec
        inputs, _rows = codec.decode_inputs(request, spec)
        chosen = codec.requested_outputs(request, spec)
        priority, timeout = _parameters(request, spec.policy.priority_levels)
        now = served.clock.now()
        deadline = now + spec.policy.timeout_for(timeout)
        if remaining is not None:
            deadline = min(deadline, now + remaining)
        outputs = await served.infer(inputs, priority=priority, deadline=deadline)
        response = codec.encode_response(spec, request.id, outputs, chosen)
        size = response.ByteSize()
        if size > self.max_send_bytes:
            raise ResponseTooLarge(
                f"the response is {size} bytes, more than the server's maximum send size of {self.max_send_bytes} bytes"
            )
        return response

    def _model(self, name: str, version: str) -> Any:
        return self.repository.get(name, version)

    async def _call(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except TrtServeError as exc:
            await context.abort(status_for(exc), str(exc))


def _parameters(request: pb.ModelInferRequest, priority_levels: int) -> tuple[int, float | None]:
    """The ``priority`` level and ``timeout`` (seconds, or None) of a request.

    Raises:
        InvalidRequest: a parameter of the wrong type or out of range, or an unknown
            ``triton_``-prefixed key.
    """
    priority, timeout = 0, None
    for key, param in request.parameters.items():
        kind = param.WhichOneof("parameter_choice")
        if key == "priority":
            if kind not in ("int64_param", "uint64_param"):
                raise InvalidRequest(f"parameter 'priority' must be an integer (int64 or uint64), got {kind}")
            priority = int(getattr(param, kind))
            if priority < 0 or (priority_levels and priority > priority_levels):
                raise InvalidRequest(
                    f"parameter 'priority' is {priority}; this model has priority levels 1..{priority_levels}"
                )
        elif key == "timeout":
            if kind != "int64_param":
                raise InvalidRequest(f"parameter 'timeout' must be int64 microseconds, got {kind}")
            if param.int64_param < 0:
                raise InvalidRequest(f"parameter 'timeout' must be >= 0 microseconds, got {param.int64_param}")
            if param.int64_param > 0:
                timeout = param.int64_param / 1e6
        elif key.startswith("triton_") and key != "triton_enable_empty_final_response":
            raise InvalidRequest(f"unknown reserved parameter '{key}'")
    return priority, timeout


async def start_server(
    repository: Repository,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
) -> tuple[grpc.aio.Server, InferenceService, int]:
    """Start a ``grpc.aio`` server for ``repository`` on ``host:port`` (0: an ephemeral port).

    The repository must be loaded already. Returns the server, the service and the bound port.

    Raises:
        RuntimeError: the address cannot be bound.
    """
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    service = InferenceService(repository, max_send_bytes=max_message_bytes, stream_inflight=stream_inflight)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"cannot listen on {host}:{port}")
    await server.start()
    return server, service, bound


async def drain(server: grpc.aio.Server, service: InferenceService, repository: Repository, grace: float) -> None:
    """Graceful shutdown: refuse new requests (UNAVAILABLE), finish every queued and running
    one, then stop the server (in-flight RPCs get ``grace`` seconds to be answered)."""
    service.draining = True
    try:
        await asyncio.wait_for(repository.aclose(), timeout=grace if math.isfinite(grace) else None)
    except asyncio.TimeoutError:
        log.warning("drain did not finish within %.1f s; stopping anyway", grace)
    await server.stop(grace)
