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

Beside it the server runs ``grpc.health.v1.Health`` (NOT_SERVING while models load and while
draining, SERVING otherwise when every model is ready) and server reflection; TLS, mutual TLS
and bearer-token auth come from :mod:`trtserve.security`. Every request's outcome and duration
is recorded once (:class:`~trtserve.metrics.RequestStats`) for ModelStatistics and the
Prometheus endpoint. :func:`drain` is the graceful shutdown (C25).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from . import __version__
from ._proto.inference import grpc_service_pb2 as pb
from ._proto.inference import grpc_service_pb2_grpc as pb_grpc
from ._proto.trtserve.v1 import control_pb2, control_pb2_grpc
from .control import ModelControlService
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
from .logs import REQUEST_LOGGER
from .metrics import UNKNOWN_MODEL, MetricsServer, ModelRequests, RequestStats, TrtServeCollector
from .protocol import codec
from .repository import ModelState, Repository
from .security import BearerTokenInterceptor, TlsConfig

log = logging.getLogger(__name__)
_requests_log = logging.getLogger(REQUEST_LOGGER)

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
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
CONTROL_SERVICE_NAME = control_pb2.DESCRIPTOR.services_by_name["ModelControl"].full_name
REFUSED = "the server is shutting down and accepts no new requests"
GRACE_EXPIRED = "the server's shutdown grace period ran out before this request finished"
_WAKE = pb.ModelStreamInferResponse()  # put in a stream's outbox to make it look at draining


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
        max_request_elements: most tensor elements one request may declare, over all its
            inputs; checked from the shapes before anything is allocated.
        loading: the repository is still loading: not ready, health NOT_SERVING, and
            requests for models not yet discovered are UNAVAILABLE, until :meth:`loaded`.

    Lifecycle of a request: *admitted* (counted in ``active``) unless the server is draining,
    answered, recorded once in ``requests``. Draining refuses admission; :func:`drain` waits
    for ``active`` to reach 0.
    """

    def __init__(
        self,
        repository: Repository,
        *,
        max_send_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
        max_request_elements: int = codec.MAX_ELEMENTS,
        loading: bool = False,
    ) -> None:
        self.repository = repository
        self.clock = repository.clock
        self.max_send_bytes = max_send_bytes
        self.stream_inflight = stream_inflight
        self.max_request_elements = max_request_elements
        self.draining = False
        self.loading = loading
        self.requests = RequestStats(repository.clock)
        self.health = health.aio.HealthServicer()
        self.metrics: MetricsServer | None = None
        self.active = 0  # admitted requests not answered yet
        self._quiet = asyncio.Event()  # set once draining and active == 0
        self._tasks: set[asyncio.Task[Any]] = set()  # tasks answering admitted requests
        self._outboxes: set[asyncio.Queue[Any]] = set()  # of the open streams
        self._expired = False  # the drain's grace ran out: cancelled requests answer UNAVAILABLE

    # -- readiness, admission and drain ---------------------------------------------------

    @property
    def ready(self) -> bool:
        """Loaded, every model ready, and not draining (ServerReady and health SERVING)."""
        return not self.draining and not self.loading and self.repository.ready

    async def update_health(self) -> None:
        """Publish :attr:`ready` to the health service (for the server and the inference service)."""
        status = health_pb2.HealthCheckResponse.SERVING if self.ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def loaded(self) -> None:
        """The repository finished loading: readiness and health follow the models from now on."""
        self.loading = False
        await self.update_health()

    async def begin_drain(self) -> None:
        """Stop admitting (new requests: UNAVAILABLE), not ready, health NOT_SERVING; streams
        end OK once everything they had admitted is answered."""
        self.draining = True
        if self.active == 0:
            self._quiet.set()
        await self.health.enter_graceful_shutdown()
        for outbox in list(self._outboxes):
            outbox.put_nowait(_WAKE)

    async def wait_quiet(self, timeout: float | None) -> bool:
        """Wait (after :meth:`begin_drain`) until every admitted request is answered; False on timeout."""
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def abandon(self) -> int:
        """The grace ran out: answer every admitted request still in progress UNAVAILABLE
        (its queued rows leave the queue). Returns how many there were."""
        self._expired = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)

    def _admit(self) -> bool:
        if self.draining:
            return False
        self.active += 1
        return True

    def _release(self) -> None:
        self.active -= 1
        if self.draining and self.active == 0:
            self._quiet.set()

    # -- health and metadata --------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        """Ready: loaded, not draining, and not every execution slot hung (``Dispatcher.healthy``),
        so a load balancer polling it routes away from a wedged model."""
        try:
            served = self.repository.get(request.name, request.version)
        except TrtServeError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not self.draining and served.dispatcher.healthy)

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
                last_inference=self.requests.last_inference_ms(name),
                inference_count=stats.rows,
                execution_count=stats.batches,
            )
            # Triton's fields: success/fail per request (decode to answer), queue per request,
            # compute_infer per request (each charged its batch's run time), batch_stats per run.
            infer = model_stats.inference_stats
            (ok_n, ok_s), (fail_n, fail_s) = self.requests.models.get(name, ModelRequests()).totals()
            queue_counts, queue_s = stats.queue.snapshot()
            for field, count, seconds in (
                (infer.success, ok_n, ok_s),
                (infer.fail, fail_n, fail_s),
                (infer.queue, sum(queue_counts), queue_s),
                (infer.compute_infer, stats.request_runs, stats.request_compute_seconds),
            ):
                field.count, field.ns = count, int(seconds * 1e9)
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
        admitted = self._admit()
        task = asyncio.current_task()
        if admitted and task is not None:
            self._tasks.add(task)
        try:
            return await self._call(context, self._answer, request, context.time_remaining(), admitted)
        except asyncio.CancelledError:
            if not self._expired:
                raise
            await context.abort(grpc.StatusCode.UNAVAILABLE, GRACE_EXPIRED)
        finally:
            if admitted:
                self._tasks.discard(task)  # type: ignore[arg-type]
                self._release()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        # A message is admitted when it is read (so one read before a drain began is answered
        # even if its work starts later). While draining, new messages are answered
        # UNAVAILABLE, and the stream ends OK as soon as none it admitted is unanswered.
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self.stream_inflight)
        pending: set[asyncio.Task[None]] = set()
        unanswered = 0

        async def answer(request: pb.ModelInferRequest, remaining: float | None, admitted: bool) -> None:
            nonlocal unanswered
            try:
                message = pb.ModelStreamInferResponse(infer_response=await self._answer(request, remaining, admitted))
            except TrtServeError as exc:
                message = _stream_error(request, exc)
            except asyncio.CancelledError:
                if not self._expired:
                    raise
                message = _stream_error(request, ShuttingDown(GRACE_EXPIRED))
            finally:
                if admitted:
                    self._release()
            unanswered -= 1
            outbox.put_nowait(message)  # its in-flight slot is released once it is written

        async def read() -> None:
            nonlocal unanswered
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    admitted = self._admit()
                    unanswered += 1
                    task = asyncio.ensure_future(answer(request, context.time_remaining(), admitted))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    if admitted:
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                if pending:
                    await asyncio.gather(*pending)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        self._outboxes.add(outbox)
        try:
            while (message := await outbox.get()) is not None:
                if message is not _WAKE:
                    yield message
                    # Only now: a client that stops reading stops the server reading its
                    # stream after stream_inflight answers (C08b), instead of answers piling up.
                    slots.release()
                if self.draining and unanswered == 0 and outbox.empty():
                    break  # drained: end the stream OK after its last answer
            else:
                await reader  # re-raise a read error (a broken stream)
        finally:
            self._outboxes.discard(outbox)
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def _answer(self, request: pb.ModelInferRequest, remaining: float | None, admitted: bool) -> pb.ModelInferResponse:
        """Answer one request (unary, or one stream message) and record its outcome once."""
        start = self.clock.now()
        code, error = "OK", None
        try:
            if not admitted:
                raise ShuttingDown(REFUSED)
            return await self._infer(request, remaining)
        except TrtServeError as exc:
            code, error = status_for(exc).name, exc
            raise
        except asyncio.CancelledError:
            code = "UNAVAILABLE" if self._expired else "CANCELLED"
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            seconds = self.clock.now() - start
            name = request.model_name
            self.requests.record(
                name if name in self.repository.models else UNKNOWN_MODEL, code, seconds, queue_full=isinstance(error, QueueFull)
            )
            if _requests_log.isEnabledFor(logging.DEBUG):
                _requests_log.debug(
                    "%s %s id=%s %.3f ms",
                    code, name, request.id, seconds * 1e3,
                    extra={"request_id": request.id, "model": name, "status": code, "duration_ms": round(seconds * 1e3, 3)},
                )

    async def _infer(self, request: pb.ModelInferRequest, remaining: float | None) -> pb.ModelInferResponse:
        served = self._model(request.model_name, request.model_version)
        spec = served.spec
        inputs, _rows = codec.decode_inputs(request, spec, max_elements=self.max_request_elements)
        chosen = codec.requested_outputs(request, spec)
        policy = served.dispatcher.policy
        priority, timeout = _parameters(request, policy.priority_levels)
        now = served.clock.now()
        deadline = now + policy.queue_policy(policy.level(priority)).timeout_for(timeout)
        if remaining is not None:
            deadline = min(deadline, now + remaining)
        outputs = await served.infer(inputs, priority=priority, deadline=deadline)
        if served.clock.now() > deadline:
            self.requests.finished_late(spec.name)
        response = codec.encode_response(spec, request.id, outputs, chosen)
        size = response.ByteSize()
        if size > self.max_send_bytes:
            raise ResponseTooLarge(
                f"the response is {size} bytes, more than the server's maximum send size of {self.max_send_bytes} bytes"
            )
        return response

    def _model(self, name: str, version: str) -> Any:
        if self.loading and name not in self.repository.models:
            raise ModelNotReady("the server is still loading its models")
        return self.repository.get(name, version)

    async def _call(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except TrtServeError as exc:
            await context.abort(status_for(exc), str(exc))


def _stream_error(request: pb.ModelInferRequest, exc: TrtServeError) -> pb.ModelStreamInferResponse:
    """The stream message answering ``request`` with an error (its id and status name kept)."""
    message = pb.ModelStreamInferResponse(error_message=str(exc))
    message.infer_response.id = request.id
    message.infer_response.parameters["error_code"].string_param = status_for(exc).name
    return message


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
    max_receive_bytes: int | None = None,
    stream_inflight: int = DEFAULT_STREAM_INFLIGHT,
    max_request_elements: int | None = None,
    tls: TlsConfig | None = None,
    auth_token: str | None = None,
    auth_health: bool = False,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    loading: bool = False,
) -> tuple[grpc.aio.Server, InferenceService, int]:
    """Start a ``grpc.aio`` server for ``repository`` on ``host:port`` (0: an ephemeral port).

    The repository must be loaded already, unless ``loading`` (then call
    ``service.loaded()`` once it is). Returns the server, the service and the bound port.

    Args:
        max_message_bytes: the largest response (a larger one fails alone with
            RESOURCE_EXHAUSTED) and, unless ``max_receive_bytes``, the largest request.
        max_receive_bytes: the largest request message (gRPC refuses a larger one with
            RESOURCE_EXHAUSTED before it is read); default ``max_message_bytes``.
        max_request_elements: most elements one request may declare over its inputs
            (default: the receive limit, which no valid request can exceed).
        tls: serve TLS (mutual TLS when it has a client CA) instead of plaintext.
        auth_token: require ``authorization: Bearer <token>`` on every call, except health
            checking and reflection unless ``auth_health``.
        metrics_port: serve Prometheus metrics over HTTP on ``metrics_host:metrics_port``
            (0: an ephemeral port, see ``service.metrics.port``); None: no endpoint.

    Raises:
        RuntimeError: the address cannot be bound.
        OSError: the metrics address cannot be bound.
    """
    max_receive_bytes = max_receive_bytes or max_message_bytes
    options = [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    interceptors = [BearerTokenInterceptor(auth_token, protect_health=auth_health)] if auth_token else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    service = InferenceService(
        repository,
        max_send_bytes=max_message_bytes,
        stream_inflight=stream_inflight,
        max_request_elements=max_request_elements or max_receive_bytes,
        loading=loading,
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    control_pb2_grpc.add_ModelControlServicer_to_server(ModelControlService(repository, service._call), server)
    health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, CONTROL_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise RuntimeError(f"cannot listen on {host}:{port}")
    await service.update_health()
    if metrics_port is not None:
        collector = TrtServeCollector(repository, service.requests, lambda: service.active, repository.clock)
        service.metrics = MetricsServer(collector, metrics_host, metrics_port)
    await server.start()
    return server, service, bound


# After the grace ran out, how long the UNAVAILABLE answers get to be written before the
# server stops.
FINAL_WRITE_S = 0.5
# Once all is answered, the longest the server waits for the last writes before it stops.
FINAL_STOP_S = 5.0


async def drain(server: grpc.aio.Server, service: InferenceService, repository: Repository, grace: float) -> None:
    """Graceful shutdown (C25), within ``grace`` seconds:

    1. at once: ServerReady false, health NOT_SERVING, new calls and new stream messages
       UNAVAILABLE (never NOT_FOUND: models stay loaded); ServerLive stays true;
    2. every admitted request, unary or inside a stream, is answered; each stream ends OK
       after its last answer;
    3. if the grace runs out first, the requests still in progress are answered UNAVAILABLE;
    4. then the models unload and the server stops.
    """
    clock = service.clock
    end = clock.now() + grace if math.isfinite(grace) else math.inf

    def left() -> float | None:
        return None if end == math.inf else max(0.0, end - clock.now())

    await service.begin_drain()
    if not await service.wait_quiet(left()):
        log.warning("grace period of %.1f s ran out: %d request(s) answered UNAVAILABLE", grace, service.abandon())
        await service.wait_quiet(FINAL_WRITE_S)
    try:
        await asyncio.wait_for(repository.aclose(), timeout=max(left() or 0.0, FINAL_WRITE_S) if end != math.inf else None)
    except asyncio.TimeoutError:
        log.warning("models did not unload within the grace period; stopping anyway")
    # Everything admitted is answered: what is left is writing the last stream messages
    # (and open health Watch calls, which never end by themselves), so a short stop.
    remaining = left()
    await server.stop(FINAL_STOP_S if remaining is None else min(max(remaining, FINAL_WRITE_S), FINAL_STOP_S))
    if service.metrics is not None:
        service.metrics.close()
