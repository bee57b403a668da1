"""``inference.GRPCInferenceService`` in a front end (``grpc.aio``).

An adapter: protobuf in → codec → :class:`~trtserve.frontend.pipeline.FrontendModel` (handler,
then the engine core) → codec → protobuf out. Errors from the layers below are mapped to gRPC
status codes once (:mod:`trtserve.frontend.grpc.status`). Whole-server answers (ServerReady,
ModelReady, ModelStatistics, RepositoryIndex) come from the engine core, so every front end
gives the same ones.

A request's deadline is the earliest of its gRPC deadline, its ``timeout`` parameter
(:mod:`trtserve.protocol.parameters`) and the model's default (the admission rule,
:func:`trtserve.ipc.admission.admit`, applied in the engine core). Stream responses come
back in completion order, each carrying its request ``id``; an error for one message is sent as
that message's ``error_message`` and the stream goes on (:mod:`trtserve.frontend.grpc.stream`).

Beside it the front end runs ``grpc.health.v1.Health`` (NOT_SERVING while models load and
while draining, SERVING otherwise when ready by ``--strict-readiness``) and server reflection.
RepositoryModelLoad/Unload go to the engine core (:mod:`trtserve.engine.lifecycle`). Every
request's outcome and duration is recorded once and shipped to the engine core
(:meth:`EngineClient.record <trtserve.ipc.client.EngineClient.record>`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from trtserve import __version__
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.errors import TrtServeError
from trtserve.frontend.grpc.status import status_for
from trtserve.frontend.grpc.stream import serve_stream
from trtserve.frontend.inflight import GRACE_EXPIRED
from trtserve.frontend.state import FrontendState
from trtserve.ipc.admission import transport_deadline_of
from trtserve.ipc.queries import Load, ModelReady, RepositoryIndex, ServerReady, Statistics, Unload

DEFAULT_STREAM_INFLIGHT = 256
"""Requests of one stream processed at once before reading pauses (``--stream-inflight``)."""
EXTENSIONS = ["model_configuration", "parameters", "schedule_policy", "statistics"]
"""The protocol extensions ServerMetadata lists."""
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


# The Triton RPCs trtserve does not implement, and what it offers instead: answered
# UNIMPLEMENTED with that sentence (not the generated servicer's NotImplementedError, which
# grpc logs with a traceback as an application error).
_SHARED_MEMORY = ("trtserve does not implement the shared-memory extension (it is not among ServerMetadata's "
                  "extensions): send tensors in the request, as raw_input_contents")
NOT_IMPLEMENTED = {
    "SystemSharedMemoryStatus": _SHARED_MEMORY,
    "SystemSharedMemoryRegister": _SHARED_MEMORY,
    "SystemSharedMemoryUnregister": _SHARED_MEMORY,
    "CudaSharedMemoryStatus": _SHARED_MEMORY,
    "CudaSharedMemoryRegister": _SHARED_MEMORY,
    "CudaSharedMemoryUnregister": _SHARED_MEMORY,
    "TraceSetting": "trtserve does not implement request tracing; 'trtserve serve --log-requests' logs one line "
                    "per request (id, model, status, duration) and the metrics endpoint has the latency histograms",
    "LogSettings": "trtserve's log settings are fixed at start: --log-level, --log-format, --log-requests",
}


def _unimplemented(rpc: str, sentence: str) -> Any:
    async def refuse(self: InferenceService, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is not implemented: {sentence}")

    refuse.__name__ = refuse.__qualname__ = rpc
    refuse.__doc__ = f"UNIMPLEMENTED: {sentence}."
    return refuse


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 / Triton inference service of one front end: an adapter over its
    :class:`~trtserve.frontend.state.FrontendState`.

    Args:
        state: the front end's served models, gate and request path (shared with its other doors).
        stream_inflight: requests of one stream being processed at once; beyond it the
            front end stops reading the stream (HTTP/2 flow control pushes back on the client).

    Until the state has loaded, health says NOT_SERVING and requests are UNAVAILABLE
    ("still loading").
    """

    def __init__(self, state: FrontendState, *, stream_inflight: int = DEFAULT_STREAM_INFLIGHT) -> None:
        self.state = state
        self.engine = state.engine
        self.clock = state.clock
        self.inflight = state.inflight
        self.table = state.table
        self.stream_inflight = stream_inflight
        self.health = health.aio.HealthServicer()
        self.wake_streams: set[asyncio.Queue[Any]] = set()  # outboxes of the open streams
        state.health_hooks.append(self.update_health)
        state.drain_hooks.append(self._drain_streams)

    @property
    def serving(self) -> bool:
        """See :attr:`FrontendState.serving <trtserve.frontend.state.FrontendState.serving>` (health SERVING)."""
        return self.state.serving

    async def update_health(self) -> None:
        """Publish :attr:`serving` to the health service (for the server and the inference service)."""
        status = health_pb2.HealthCheckResponse.SERVING if self.serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _drain_streams(self) -> None:
        """A drain began: health NOT_SERVING; streams end OK once everything they had admitted is answered."""
        await self.health.enter_graceful_shutdown()
        for outbox in list(self.wake_streams):
            outbox.put_nowait(None)

    # -- health and metadata --------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        """Live whenever the process answers, draining included."""
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        """Ready when :attr:`serving` here and the engine core counts the server ready."""
        if not self.serving:
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=await self.engine.query(ServerReady()))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        """Ready: loaded, not draining, and not every execution slot hung, so a load balancer
        polling it routes away from a wedged model."""
        if self.inflight.draining or not self.table.ready(request.name, request.version):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=await self.engine.query(ModelReady(request.name, request.version)))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        """The server's name, version and :data:`EXTENSIONS`."""
        return pb.ServerMetadataResponse(name="trtserve", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        """A served version's client-facing tensors (batch axis as -1), platform and the
        versions served; NOT_FOUND or UNAVAILABLE as
        :meth:`~trtserve.frontend.models.ModelTable.get` raises."""
        spec = (await self._call(context, self.table.get, request.name, request.version)).spec
        versions = [s.version for s in self.table.info(spec.name).specs]
        response = pb.ModelMetadataResponse(name=spec.name, versions=versions, platform=spec.platform)
        for tensors, field in ((spec.inputs, response.inputs), (spec.outputs, response.outputs)):
            for t in tensors:
                field.add(name=t.name, datatype=t.datatype.name, shape=t.shape(spec.batched))
        return response

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        """A served version's parsed ``config.pbtxt`` (as the engine core loaded it)."""
        spec = (await self._call(context, self.table.get, request.name, request.version)).spec
        return pb.ModelConfigResponse(config=spec.config)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        """Triton's statistics, from the engine core
        (:func:`~trtserve.engine.statistics.model_statistics`)."""
        data = await self._call(context, self.engine.query, Statistics(request.name, request.version))
        return pb.ModelStatisticsResponse.FromString(data)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        """Every model of the repository or the table with its state, from the engine core."""
        data = await self._call(context, self.engine.query, RepositoryIndex(request.ready))
        return pb.RepositoryIndexResponse.FromString(data)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a model: answered once it serves, and this front end serves it
        (see :meth:`~trtserve.engine.lifecycle.ModelLifecycle.load`)."""
        await self._call(context, self.engine.query,
                         Load(request.model_name, repository_parameters(request.parameters)))
        await self.table.refresh()
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload a model: answered once what was queued on it is answered and it is closed."""
        await self._call(context, self.engine.query,
                         Unload(request.model_name, repository_parameters(request.parameters)))
        await self.table.refresh()
        return pb.RepositoryModelUnloadResponse()

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse | None:
        """One request (:meth:`FrontendState.answer <trtserve.frontend.state.FrontendState.answer>`),
        counted by the in-flight gate; a call still running when the drain's grace runs out is
        answered UNAVAILABLE. A refusal or failure (TrtServeError) is answered with its status
        (:func:`~trtserve.frontend.grpc.status.status_for`) and its sentence as the details; the
        handler then returns ``None``, which grpc discards under a non-OK status."""
        # The request path is awaited here directly, not through _call: two coroutine frames fewer per call.
        with self.inflight.held(asyncio.current_task()) as refusal:
            try:
                return await self.state.answer(request, self.transport_deadline(context), refusal)
            except TrtServeError as exc:
                # The status goes out with grpc's final batch (the response is discarded on a non-OK
                # code), not through abort's own batch and AbortError: a refused call cost the server
                # 295-335 µs of CPU against 302-379 with abort, lower in each of four interleaved
                # pairs (tiny, queue held full, 64 callers; docs/benchmarks.md).
                context.set_code(status_for(exc))
                context.set_details(str(exc))
                return None
            except asyncio.CancelledError:
                if not self.inflight.expired:
                    raise
                await context.abort(grpc.StatusCode.UNAVAILABLE, GRACE_EXPIRED)
                raise  # not reached: abort raises

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any) -> None:
        """Many requests over one call, answered in completion order
        (:func:`~trtserve.frontend.grpc.stream.serve_stream`, which writes the responses)."""
        await serve_stream(self, request_iterator, context)

    def transport_deadline(self, context: Any) -> float:
        """The call's gRPC deadline as monotonic seconds (``math.inf`` for none), taken once
        per call: every message of a stream shares it, so they queue in arrival order."""
        return transport_deadline_of(context.time_remaining(), self.clock.now())

    async def _call(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except TrtServeError as exc:
            await context.abort(status_for(exc), str(exc))


def repository_parameters(parameters: Any) -> dict[str, Any]:
    """A RepositoryModelLoad/Unload request's ``parameters`` map as plain values (bool, int,
    str or bytes, whichever of ``ModelRepositoryParameter`` is set)."""
    return {key: getattr(p, p.WhichOneof("parameter_choice")) if p.WhichOneof("parameter_choice") else None
            for key, p in parameters.items()}


for _rpc, _sentence in NOT_IMPLEMENTED.items():
    setattr(InferenceService, _rpc, _unimplemented(_rpc, _sentence))
