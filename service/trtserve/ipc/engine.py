"""The engine core as every front end sees it, whatever its transport: the model table,
``infer``, the admission refusal before a request crosses, outcome records, and the queries as
methods.

Two implementations: :class:`~trtserve.ipc.client.EngineClient` (a front-end process, over
ZeroMQ) and :class:`~trtserve.engine.local.LocalEngine` (the engine core in the same process).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trtserve.datatypes import Tensors
from trtserve.errors import ModelNotFound, ModelNotReady
from trtserve.ipc.admission import Ask
from trtserve.ipc.messages import QueryKind
from trtserve.spec import ModelSpec


class ModelState(enum.Enum):
    """Where a model is in its life: the strings Triton's RepositoryIndex uses."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True)
class ModelInfo:
    """One model as the engine core reported it: state (a :class:`ModelState` value), the
    reason it is not ready, and when READY the specs of its served versions, ascending."""

    name: str
    state: str
    reason: str
    specs: tuple[ModelSpec, ...] = ()

    @property
    def spec(self) -> ModelSpec | None:
        """The highest version's spec (where a request without ``model_version`` goes)."""
        return self.specs[-1] if self.specs else None


class EngineQueries:
    """The engine core's questions, one method each (a :class:`~trtserve.ipc.messages.QueryKind`
    per method, of the same name). A subclass supplies :meth:`ask`, the transport. The engine
    core answers them with :class:`~trtserve.engine.queries.CoreQueries`.

    Every method raises the engine core's error for it: ModelNotFound (NOT_FOUND),
    ModelNotReady or ModelControlDisabled (UNAVAILABLE), InvalidRequest (INVALID_ARGUMENT).
    """

    async def ask(self, what: QueryKind, *args: Any) -> Any:
        """Send query ``what`` with ``args`` and return the engine core's answer."""
        raise NotImplementedError

    async def server_ready(self) -> bool:
        """Whether the engine core counts the server ready (its models loaded, by
        ``--strict-readiness``)."""
        return bool(await self.ask(QueryKind.SERVER_READY))

    async def model_ready(self, name: str, version: str) -> bool:
        """Whether ``name`` at ``version`` (empty: the highest) is served and not every slot
        hung."""
        return bool(await self.ask(QueryKind.MODEL_READY, name, version))

    async def statistics(self, name: str, version: str) -> bytes:
        """A serialized ``ModelStatisticsResponse`` for ``name`` (empty: every model) at
        ``version``."""
        return bytes(await self.ask(QueryKind.STATISTICS, name, version))

    async def repository_index(self, ready_only: bool) -> bytes:
        """A serialized ``RepositoryIndexResponse`` (only READY models if ``ready_only``)."""
        return bytes(await self.ask(QueryKind.REPOSITORY_INDEX, ready_only))

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        """RepositoryModelLoad: answered once ``name`` serves (``parameters``: ``config``, JSON)."""
        await self.ask(QueryKind.LOAD, name, parameters)

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        """RepositoryModelUnload: answered once what was queued on ``name`` is answered."""
        await self.ask(QueryKind.UNLOAD, name, parameters)

    async def get_policy(self, request: bytes) -> bytes:
        """ModelControl GetPolicy: a serialized ``trtserve.v1.BatchingPolicy`` for a serialized
        request."""
        return bytes(await self.ask(QueryKind.GET_POLICY, request))

    async def set_policy(self, request: bytes) -> bytes:
        """ModelControl SetPolicy: the policy in force after the change, serialized."""
        return bytes(await self.ask(QueryKind.SET_POLICY, request))

    async def inflight_bound(self) -> int | None:
        """The automatic in-flight request bound of a front end (None: no bound)."""
        value = await self.ask(QueryKind.INFLIGHT_BOUND)
        return None if value is None else int(value)


class EngineView(EngineQueries):
    """What a front end knows of the engine core's models (both kinds of connection).

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


class Engine(Protocol):
    """The engine core as a front end uses it (:class:`EngineView` and its queries, plus
    the request path)."""

    models: dict[str, ModelInfo]
    loaded: asyncio.Event
    ready: bool
    strict: bool
    listeners: list[Callable[[], None]]

    def model(self, name: str) -> ModelInfo:
        """The table entry of ``name`` (see :meth:`EngineView.model`)."""
        ...

    async def infer(
        self, model: str, version: str, segments: list[Tensors], ask: Ask,
    ) -> tuple[list[Tensors], float, str]:
        """Run one request's engine rows; returns (outputs per segment, the resolved deadline,
        the version that answered). See :meth:`EngineClient.infer <trtserve.ipc.client.EngineClient.infer>`."""
        ...

    def shed(self, model: str, ask: Ask, now: float) -> None:
        """Refuse a request that cannot finish in time before it crosses (the admission rule's
        front-end side, :func:`~trtserve.ipc.admission.shed`); call once per request, before
        decoding."""
        ...

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """Count one answered request for the engine core's statistics and metrics (see
        :meth:`EngineClient.record <trtserve.ipc.client.EngineClient.record>`)."""
        ...

    def set_active(self, active: int) -> None:
        """Report the requests in flight at this front end now."""
        ...

    async def aclose(self) -> None:
        """Close the connection to the engine core."""
        ...

    async def server_ready(self) -> bool:
        """See :meth:`EngineQueries.server_ready`."""
        ...

    async def model_ready(self, name: str, version: str) -> bool:
        """See :meth:`EngineQueries.model_ready`."""
        ...

    async def statistics(self, name: str, version: str) -> bytes:
        """See :meth:`EngineQueries.statistics`."""
        ...

    async def repository_index(self, ready_only: bool) -> bytes:
        """See :meth:`EngineQueries.repository_index`."""
        ...

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        """See :meth:`EngineQueries.load`."""
        ...

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        """See :meth:`EngineQueries.unload`."""
        ...

    async def get_policy(self, request: bytes) -> bytes:
        """See :meth:`EngineQueries.get_policy`."""
        ...

    async def set_policy(self, request: bytes) -> bytes:
        """See :meth:`EngineQueries.set_policy`."""
        ...

    async def inflight_bound(self) -> int | None:
        """See :meth:`EngineQueries.inflight_bound`."""
        ...


__all__ = ["Engine", "EngineQueries", "EngineView", "ModelInfo", "ModelState"]
