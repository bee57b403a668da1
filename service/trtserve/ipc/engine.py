"""The engine core as every front end sees it, whatever its transport: the model table,
``infer``, the admission refusal before a request crosses, outcome records, and the queries
(:mod:`trtserve.ipc.queries`, asked with :meth:`Engine.query`).

Two implementations: :class:`~trtserve.ipc.client.EngineClient` (a front-end process, over
ZeroMQ) and :class:`~trtserve.engine.local.LocalEngine` (the engine core in the same process).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trtserve.datatypes import Tensors
from trtserve.errors import ModelNotFound, ModelNotReady
from trtserve.ipc.admission import Ask, QueueHint
from trtserve.ipc.messages import ModelState
from trtserve.ipc.queries import EngineQuery
from trtserve.spec import ModelSpec

T = TypeVar("T")


@dataclass(frozen=True)
class ModelInfo:
    """One model as the engine core reported it: its state, the reason it is not ready, and
    when READY the specs of its served versions, ascending."""

    name: str
    state: ModelState
    reason: str
    specs: tuple[ModelSpec, ...] = ()

    @property
    def spec(self) -> ModelSpec | None:
        """The highest version's spec (where a request without ``model_version`` goes)."""
        return self.specs[-1] if self.specs else None


class Engine(abc.ABC):
    """The engine core as a front end uses it: its model table, the request path, outcome
    records and the queries.

    Attributes:
        models: the model table (empty until :attr:`loaded` is set); replaced as a whole
            whenever the engine core sends a new one (a model loaded, reloaded, unloaded).
        loaded: set once the engine core has loaded its models and the table is here.
        ready: the engine core counts the server ready (``--strict-readiness``).
        strict: strict readiness: a model this front end cannot serve makes it not ready.
        listeners: called on the loop after each new table.
    """

    def __init__(self) -> None:
        self.models: dict[str, ModelInfo] = {}
        self.loaded = asyncio.Event()
        self.ready = False
        self.strict = True
        self.listeners: list[Callable[[], None]] = []

    def set_table(self, loaded: bool, ready: bool, strict: bool, models: dict[str, ModelInfo]) -> None:
        """Take a new model table from the engine core and tell the listeners."""
        self.models, self.ready, self.strict = models, ready, strict
        if loaded:
            self.loaded.set()
        for listener in list(self.listeners):
            listener()

    def model(self, name: str) -> ModelInfo:
        """The table entry of ``name``.

        Raises:
            ModelNotReady (UNAVAILABLE): the engine core has not sent its table yet.
            ModelNotFound (NOT_FOUND): no such model.
        """
        if not self.loaded.is_set():
            raise ModelNotReady("the server is still loading its models")
        info = self.models.get(name)
        if info is None:
            raise ModelNotFound(
                f"unknown model '{name}': the server serves no such model now (RepositoryIndex, or "
                "POST /v2/repository/index over HTTP, lists the repository's models with their state)"
            )
        return info


    @abc.abstractmethod
    async def infer(
        self, model: str, version: str, segments: list[Tensors], ask: Ask,
    ) -> tuple[list[Tensors], float, str]:
        """Run one request's engine rows.

        Args:
            model, version: the model, and the version asked for (empty: the highest the
                engine core serves when the rows arrive).
            segments: engine-input name → array with rows on axis 0, one dict per segment.
            ask: the request's timing; the front end has run :meth:`shed` on it already
                (before decoding the request).

        Returns:
            (one output dict per segment; the deadline the engine core resolved, monotonic
            seconds; the version that answered).

        Raises:
            InvalidRequest, QueueFull, Overloaded, RequestTimeout, ShuttingDown, BackendError,
            ModelNotReady, ModelNotFound: as the engine core answered.
        """

    @abc.abstractmethod
    def hint(self, model: str) -> QueueHint | None:
        """The model's queue as the engine core last described it
        (:class:`~trtserve.ipc.admission.QueueHint`); ``None`` before any answer of it."""

    @abc.abstractmethod
    def shed(self, model: str, ask: Ask, now: float) -> None:
        """Refuse, without sending it, a request that cannot finish in time (the admission
        rule's front-end side, :func:`~trtserve.ipc.admission.shed`); call once per request,
        before decoding. Cheap: no tensor is decoded for it.

        Raises:
            DeadlineUnmeetable (DEADLINE_EXCEEDED): even a batch of one started now would finish
                late.
            QueueFull (RESOURCE_EXHAUSTED): the model's queue at that level is full.
            Overloaded (RESOURCE_EXHAUSTED): the predicted queue wait exceeds the deadline.
            InvalidRequest (INVALID_ARGUMENT): a priority outside the model's levels.
        """

    @abc.abstractmethod
    async def query(self, query: EngineQuery[T]) -> T:
        """The engine core's answer to ``query`` (:mod:`trtserve.ipc.queries`: the answer's type
        and the errors of each).

        Raises:
            TrtServeError: the engine core's error for it (ModelNotFound: NOT_FOUND; ModelNotReady,
                ModelControlDisabled: UNAVAILABLE; InvalidRequest: INVALID_ARGUMENT; anything else
                BackendError: INTERNAL).
        """

    @abc.abstractmethod
    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """Count one answered request for the engine core's statistics and metrics.

        Args:
            model: its model name (or :data:`~trtserve.ipc.messages.UNKNOWN_MODEL`); ``code``:
                the gRPC status name.
            seconds: from decoding to the encoded answer.
            refusal: the reason it was refused at admission (``TrtServeError.refusal``), or None;
                ``late``: answered OK after its deadline.
        """

    @abc.abstractmethod
    def set_active(self, active: int) -> None:
        """Report the requests in flight at this front end now."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the connection to the engine core."""


__all__ = ["Engine", "ModelInfo"]
