"""``inference.GRPCInferenceService`` in a front end (``grpc.aio``).

An adapter: protobuf in → codec → :class:`~trtserve.pipeline.FrontendModel` (handler,
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
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from contextlib import aclosing
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from trtserve import __version__
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.clock import Clock
from trtserve.errors import ResponseTooLarge, TrtServeError
from trtserve.frontend.grpc.status import status_for
from trtserve.frontend.grpc.stream import serve_stream
from trtserve.frontend.inflight import GRACE_EXPIRED, InflightGate
from trtserve.frontend.models import ModelTable
from trtserve.ipc.admission import deadline_of
from trtserve.ipc.engine import Engine
from trtserve.ipc.messages import UNKNOWN_MODEL
from trtserve.logs import REQUEST_LOGGER
from trtserve.protocol import codec
from trtserve.protocol.parameters import request_parameters

log = logging.getLogger(__name__)

AUTO = "auto"
"""``max_inflight``: derive the bound from the served models' measured capacity."""
_requests_log = logging.getLogger(REQUEST_LOGGER)

DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest request or response message, in bytes (``--max-message-bytes``)."""
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
    """The KServe v2 / Triton inference service of one front end.

    Args:
        engine: the connection to the engine core (connected).
        clock: the monotonic clock (deadlines cross to the engine core as its times).
        pool: executor for the handlers' pre/post-processing.
        max_send_bytes: a response larger than this fails with RESOURCE_EXHAUSTED, alone.
        stream_inflight: requests of one stream being processed at once; beyond it the
            front end stops reading the stream (HTTP/2 flow control pushes back on the client).
        max_request_elements: most tensor elements one request may declare, over all its
            inputs; checked from the shapes before anything is allocated.
        max_inflight: most inference requests (unary calls and stream messages) in progress
            at once; one more is refused RESOURCE_EXHAUSTED (InflightFull) before its tensors
            are decoded. ``"auto"``: measured capacity × useful wait of the models served
            (:func:`~trtserve.batching.capacity.inflight_bound`, from the engine core),
            recomputed whenever the models served change; ``None``: no bound.

    Until :meth:`loaded` it is not ready, health says NOT_SERVING, and requests are
    UNAVAILABLE ("still loading").
    """

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        pool: Executor,
        *,
        max_send_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
        max_request_elements: int = codec.MAX_ELEMENTS,
        max_inflight: int | str | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.pool = pool
        self.max_send_bytes = max_send_bytes
        self.stream_inflight = stream_inflight
        self.max_request_elements = max_request_elements
        self.inflight = InflightGate(on_change=engine.set_active)
        self.auto_bound = max_inflight == AUTO
        self._bound_logged = False
        if isinstance(max_inflight, int) and max_inflight > 0:
            self.inflight.limit = max_inflight
            self.inflight.limit_source = f"--max-inflight-rpcs {max_inflight}"
        self.health = health.aio.HealthServicer()
        self.table = ModelTable(engine, pool, self._models_changed)
        self.wake_streams: set[asyncio.Queue[Any]] = set()  # outboxes of the open streams

    # -- readiness, admission and drain ---------------------------------------------------

    @property
    def serving(self) -> bool:
        """Not draining, started, and ready as the engine core counts it (``--strict-readiness``:
        strict, every model asked for is ready, and every handler loaded here) (health SERVING)."""
        return (not self.inflight.draining and self.engine.loaded.is_set() and self.engine.ready
                and not (self.engine.strict and self.table.unavailable))

    async def update_health(self) -> None:
        """Publish :attr:`serving` to the health service (for the server and the inference service)."""
        status = health_pb2.HealthCheckResponse.SERVING if self.serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _models_changed(self) -> None:
        """The models served changed: recompute an ``auto`` bound (a failed query keeps the
        bound in force, and says so), publish health."""
        try:
            if self.auto_bound:
                await self._recompute_bound()
        except Exception:
            log.exception("front end: the in-flight bound could not be recomputed; %s stays in force",
                          self.inflight.limit)
        finally:
            await self.update_health()

    async def _recompute_bound(self) -> None:
        limit = await self.engine.inflight_bound()
        if limit != self.inflight.limit or not self._bound_logged:
            if limit is None:
                log.info("front end: no bound on requests in progress (a model admits requests without a deadline "
                         "into an unbounded queue: set default_timeout or max_queue_size, or --max-inflight-rpcs)")
            else:
                log.info("front end: at most %d requests in progress (the models' measured capacity x longest "
                         "default timeout, or their queue sizes, plus a batch per slot)", limit)
            self._bound_logged = True
        self.inflight.limit = limit
        self.inflight.limit_source = (
            f"--max-inflight-rpcs auto: {limit}, from the models' capacity and deadlines or queue sizes"
        )

    async def loaded(self) -> None:
        """Wait for the engine core's model table, load each served version's handler (off
        the loop), then follow the table (models loaded, reloaded, unloaded) in the models
        served, readiness and health."""
        await self.engine.loaded.wait()
        self.table.follow()
        await self.table.refresh()

    async def begin_drain(self) -> None:
        """Stop admitting (new requests: UNAVAILABLE), not ready, health NOT_SERVING; streams
        end OK once everything they had admitted is answered."""
        self.inflight.begin_drain()
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
        return pb.ServerReadyResponse(ready=await self.engine.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        """Ready: loaded, not draining, and not every execution slot hung, so a load balancer
        polling it routes away from a wedged model."""
        if self.inflight.draining or not self.table.ready(request.name, request.version):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=await self.engine.model_ready(request.name, request.version))

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
        data = await self._call(context, self.engine.statistics, request.name, request.version)
        return pb.ModelStatisticsResponse.FromString(data)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        """Every model of the repository or the table with its state, from the engine core."""
        data = await self._call(context, self.engine.repository_index, request.ready)
        return pb.RepositoryIndexResponse.FromString(data)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a model: answered once it serves, and this front end serves it
        (see :meth:`~trtserve.engine.lifecycle.ModelLifecycle.load`)."""
        await self._call(context, self.engine.load, request.model_name, repository_parameters(request.parameters))
        await self.table.refresh()
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload a model: answered once what was queued on it is answered and it is closed."""
        await self._call(context, self.engine.unload, request.model_name, repository_parameters(request.parameters))
        await self.table.refresh()
        return pb.RepositoryModelUnloadResponse()

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """One request (:meth:`answer`), counted by the in-flight gate; a call still running
        when the drain's grace runs out is answered UNAVAILABLE."""
        task = asyncio.current_task()
        refusal = self.inflight.admit()
        admitted = refusal is None
        if admitted and task is not None:
            self.inflight.track(task)
        try:
            return await self._call(context, self.answer, request, self.deadline_of(context), refusal)
        except asyncio.CancelledError:
            if not self.inflight.expired:
                raise
            await context.abort(grpc.StatusCode.UNAVAILABLE, GRACE_EXPIRED)
            raise  # not reached: abort raises
        finally:
            if admitted:
                self.inflight.release(task)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Many requests over one call, answered in completion order
        (:func:`~trtserve.frontend.grpc.stream.serve_stream`)."""
        # grpc.aio wants an async generator function here; the pump is its own module.
        async with aclosing(serve_stream(self, request_iterator, context)) as stream:
            async for message in stream:
                yield message

    def deadline_of(self, context: Any) -> float:
        """The call's gRPC deadline as monotonic seconds (``math.inf`` for none), taken once
        per call: every message of a stream shares it, so they queue in arrival order."""
        return deadline_of(context.time_remaining(), self.clock.now())

    async def answer(self, request: pb.ModelInferRequest, deadline: float,
                     refusal: TrtServeError | None) -> pb.ModelInferResponse:
        """Answer one request (unary, or one stream message) by ``deadline`` (the gRPC
        deadline, monotonic seconds) and record its outcome once.

        Raises:
            TrtServeError: its status is the answer (``refusal``, when admission refused it:
                ShuttingDown or InflightFull,
                :meth:`InflightGate.admit <trtserve.frontend.inflight.InflightGate.admit>`).
        """
        start = self.clock.now()
        code, error, late = "OK", None, False
        try:
            if refusal is not None:
                raise refusal
            response, late = await self._infer(request, deadline)
            return response
        except TrtServeError as exc:
            code, error = status_for(exc).name, exc
            raise
        except asyncio.CancelledError:
            code = "UNAVAILABLE" if self.inflight.expired else "CANCELLED"
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            seconds = self.clock.now() - start
            name = request.model_name
            self.engine.record(
                name if name in self.engine.models else UNKNOWN_MODEL, code, seconds,
                refusal=error.refusal if error is not None else None, late=late,
            )
            if _requests_log.isEnabledFor(logging.DEBUG):
                _requests_log.debug(
                    "%s %s id=%s %.3f ms",
                    code, name, request.id, seconds * 1e3,
                    extra={"request_id": request.id, "model": name, "status": code,
                           "duration_ms": round(seconds * 1e3, 3)},
                )

    async def _infer(self, request: pb.ModelInferRequest, deadline: float) -> tuple[pb.ModelInferResponse, bool]:
        model = await self.table.get(request.model_name, request.model_version)
        spec = model.spec
        priority, timeout, final = request_parameters(request)
        # Shed before decoding: what cannot finish in time costs no more work here.
        self.engine.shed(spec.name, priority, timeout, deadline, self.clock.now())
        inputs, _rows = codec.decode_inputs(request, spec, max_elements=self.max_request_elements)
        chosen = codec.requested_outputs(request, spec)
        outputs, resolved, version = await model.infer(
            inputs, version=request.model_version, priority=priority, timeout=timeout, deadline=deadline)
        late = self.clock.now() > resolved
        response = codec.encode_response(spec, request.id, outputs, chosen)
        response.model_version = version  # the version that answered (across a reload, maybe a newer one)
        if final:  # each request of a model that is not decoupled gets one response: the final one
            response.parameters["triton_final_response"].bool_param = True
        size = response.ByteSize()
        if size > self.max_send_bytes:
            raise ResponseTooLarge(
                f"the response is {size} bytes, more than the server's maximum send size of {self.max_send_bytes} bytes"
            )
        return response, late

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
