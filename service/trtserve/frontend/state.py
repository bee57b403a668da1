"""What one front-end process serves, whichever door a request came in by: the models it serves
(their handlers loaded), its in-flight gate and bound, its readiness, and the request path from
a decoded ``ModelInferRequest`` to its response.

Both doors hand this the protobuf request: the gRPC door as it came, the HTTP door after
translating its body (:mod:`trtserve.protocol.rest`), so a request is validated, shed, run and
counted the same way whatever its transport. A request's deadline is the earliest of its
transport deadline, its ``timeout`` parameter and the model's default (the admission rule,
:mod:`trtserve.ipc.admission`); every outcome is recorded once and shipped to the engine core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.clock import Clock
from trtserve.errors import InvalidRequest, ModelNotFound, ResponseTooLarge, TrtServeError
from trtserve.frontend.inflight import InflightGate
from trtserve.frontend.models import ModelTable
from trtserve.frontend.status import status_name
from trtserve.ipc.admission import Ask
from trtserve.ipc.engine import Engine
from trtserve.ipc.messages import UNKNOWN_MODEL
from trtserve.ipc.queries import InflightBound
from trtserve.logs import REQUEST_LOGGER
from trtserve.protocol import codec
from trtserve.protocol.parameters import request_parameters
from trtserve.protocol.tokenize import Token

log = logging.getLogger(__name__)
_requests_log = logging.getLogger(REQUEST_LOGGER)

AUTO = "auto"
"""``max_inflight``: derive the bound from the served models' measured capacity."""
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest request or response message, in bytes (``--max-message-bytes``)."""


class FrontendState:
    """One front end's served models, gate and request path, shared by its doors.

    Args:
        engine: the connection to the engine core (connected).
        clock: the monotonic clock (deadlines cross to the engine core as its times).
        pool: executor for the handlers' pre/post-processing.
        max_send_bytes: a response larger than this fails with RESOURCE_EXHAUSTED, alone.
        max_request_elements: most tensor elements one request may declare, over all its
            inputs; checked from the shapes before anything is allocated.
        max_inflight: most inference requests (unary calls, stream messages, HTTP infer
            requests) in progress at once; one more is refused RESOURCE_EXHAUSTED (InflightFull)
            before its tensors are decoded. ``"auto"``: measured capacity × useful wait of the
            models served (:func:`~trtserve.batching.capacity.inflight_bound`, from the engine
            core), recomputed whenever the models served change; ``None``: no bound.

    Attributes:
        health_hooks: awaited whenever :attr:`serving` may have changed (each door publishes it).
        drain_hooks: awaited when a drain begins (a door ends its idle streams).

    Until :meth:`loaded` it is not ready and requests are UNAVAILABLE ("still loading").
    """

    def __init__(self, engine: Engine, clock: Clock, pool: Executor, *,
                 max_send_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_request_elements: int = codec.MAX_ELEMENTS,
                 max_inflight: int | str | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.pool = pool
        self.max_send_bytes = max_send_bytes
        self.max_request_elements = max_request_elements
        self.inflight = InflightGate(on_change=engine.set_active)
        self.auto_bound = max_inflight == AUTO
        self._bound_logged = False
        if isinstance(max_inflight, int) and max_inflight > 0:
            self.inflight.limit = max_inflight
            self.inflight.limit_source = f"--max-inflight-rpcs {max_inflight}"
        self.table = ModelTable(engine, pool, self._models_changed)
        self.health_hooks: list[Callable[[], Awaitable[None]]] = []
        self.drain_hooks: list[Callable[[], Awaitable[None]]] = []

    # -- readiness, bound and drain -------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Not draining, started, and ready as the engine core counts it (``--strict-readiness``:
        strict, every model asked for is ready, and every handler loaded here)."""
        return (not self.inflight.draining and self.engine.loaded.is_set() and self.engine.ready
                and not (self.engine.strict and self.table.unavailable))

    async def publish_health(self) -> None:
        """Tell every door that :attr:`serving` may have changed."""
        for hook in list(self.health_hooks):
            await hook()

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
            await self.publish_health()

    async def _recompute_bound(self) -> None:
        limit = await self.engine.query(InflightBound())
        if limit != self.inflight.limit or not self._bound_logged:
            if limit is None:
                log.info("front end: no bound on requests in progress, as --max-inflight-rpcs auto gives while a model "
                         "has neither default_timeout nor max_queue_size (set one of them, or --max-inflight-rpcs N, "
                         "to bound it)")
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
        """Stop admitting (new requests: UNAVAILABLE), not ready; then each door's drain hook."""
        self.inflight.begin_drain()
        for hook in list(self.drain_hooks):
            await hook()

    # -- tokenization -----------------------------------------------------------------------

    async def tokenize(self, name: str, version: str, texts: list[str],
                       add_special_tokens: bool = True) -> list[list[Token]]:
        """The tokens of each text by the tokenizer of model ``name`` (empty: the one model
        served here that has a tokenizer) at ``version`` (empty: the highest served): ``POST
        /tokenize`` and ``trtserve.v1.Tokenizer/Tokenize``. Runs on the CPU pool, in the front end.

        Raises:
            InvalidRequest (INVALID_ARGUMENT): no model named while several (or none) have a
                tokenizer; a text over the model's bound.
            ModelNotFound (NOT_FOUND): no such model, or one without a tokenizer (the message names
                those that have one).
            ModelNotReady (UNAVAILABLE): see :meth:`ModelTable.get <trtserve.frontend.models.ModelTable.get>`.
        """
        have = sorted(n for n, built in self.table.versions.items() if any(m.tokenizes for m in built.values()))
        if not name:
            if len(have) != 1:
                raise InvalidRequest(f"name the model whose tokenizer to use: the models with one are "
                                     f"{', '.join(have) or 'none'}")
            name = have[0]
        model = await self.table.get(name, version)
        if not model.tokenizes:
            raise ModelNotFound(f"model '{name}' has no tokenizer (no handler with a tokenize stage); the models with "
                                f"one: {', '.join(have) or 'none'}")
        return await model.tokenize(texts, add_special_tokens=add_special_tokens)

    # -- the request path -------------------------------------------------------------------

    async def answer(self, request: pb.ModelInferRequest, transport_deadline: float,
                     refusal: TrtServeError | None, received: float | None = None) -> pb.ModelInferResponse:
        """Answer one request (a unary call, a stream message, an HTTP infer request or a queue
        message) by ``transport_deadline`` (monotonic seconds, ``math.inf`` for none) and record its
        outcome once. The request's timing is read here, once, into an
        :class:`~trtserve.ipc.admission.Ask`; its ``timeout`` and the model's default timeout count
        from ``received`` (monotonic seconds: the queue door gives when Redis took the message),
        or from now.

        Raises:
            TrtServeError: its status is the answer (``refusal``, when the in-flight gate refused
                it: ShuttingDown or InflightFull,
                :meth:`InflightGate.admit <trtserve.frontend.inflight.InflightGate.admit>`).
        """
        start = self.clock.now()
        code, error, late = "OK", None, False
        try:
            if refusal is not None:
                raise refusal
            response, late = await self._infer(request, transport_deadline, start if received is None else received)
            return response
        except TrtServeError as exc:
            code, error = status_name(exc), exc
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
            self.record(name, code, seconds, refusal=error.refusal if error is not None else None, late=late)
            if _requests_log.isEnabledFor(logging.DEBUG):
                _requests_log.debug(
                    "%s %s id=%s %.3f ms",
                    code, name, request.id, seconds * 1e3,
                    extra={"request_id": request.id, "model": name, "status": code,
                           "duration_ms": round(seconds * 1e3, 3)},
                )

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None = None,
               late: bool = False) -> None:
        """Count one request's outcome in the engine core's statistics and metrics: its model
        (one not served counts under the unknown model), status name, seconds in the front end,
        the refusal reason if it was refused, and whether it was answered OK past its deadline."""
        self.engine.record(model if model in self.engine.models else UNKNOWN_MODEL, code, seconds,
                           refusal=refusal, late=late)

    async def _infer(self, request: pb.ModelInferRequest, transport_deadline: float,
                     received: float) -> tuple[pb.ModelInferResponse, bool]:
        model = await self.table.get(request.model_name, request.model_version)
        spec = model.spec
        params = request_parameters(request)
        ask = Ask(params.priority, params.timeout, transport_deadline, received)
        # Shed before decoding: what cannot finish in time costs no more work here.
        self.engine.shed(spec.name, ask, self.clock.now())
        inputs, _rows = codec.decode_inputs(request, spec, max_elements=self.max_request_elements)
        chosen = codec.requested_outputs(request, spec)
        outputs, deadline, version = await model.infer(inputs, ask, version=request.model_version,
                                                       long_text=params.long_text)
        late = self.clock.now() > deadline
        response = codec.encode_response(spec, request.id, outputs, chosen)
        response.model_version = version  # the version that answered (across a reload, maybe a newer one)
        if params.final:  # each request of a model that is not decoupled gets one response: the final one
            response.parameters["triton_final_response"].bool_param = True
        size = response.ByteSize()
        if size > self.max_send_bytes:
            raise ResponseTooLarge(
                f"the response is {size} bytes, more than the server's maximum send size of {self.max_send_bytes} bytes"
            )
        return response, late


__all__ = ["AUTO", "DEFAULT_MAX_MESSAGE_BYTES", "FrontendState"]
