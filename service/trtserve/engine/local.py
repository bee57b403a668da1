"""The engine core's interface in process: no ZeroMQ between a front end and the dispatchers.

:class:`LocalEngine` offers what :class:`~trtserve.ipc.client.EngineClient` offers (``infer``,
the model table, the queries, ``record``, ``set_active``) by calling an
:class:`~trtserve.engine.core.EngineCore` of this process directly. ``trtserve serve
--frontends 1`` runs this way, and so do the tools that run a model without a server
(``trtserve check``, the Ray bulk actors), with only ``infer``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from trtserve.datatypes import Tensors
from trtserve.engine.model import EngineModel
from trtserve.errors import BackendError, RequestTimeout, TrtServeError
from trtserve.ipc.admission import Ask, QueueHint, shed
from trtserve.ipc.engine import Engine, ModelInfo
from trtserve.ipc.messages import Outcome
from trtserve.ipc.queries import EngineQuery

if TYPE_CHECKING:
    from trtserve.engine.core import EngineCore

log = logging.getLogger(__name__)
T = TypeVar("T")


class LocalEngine(Engine):
    """Requests straight into the dispatchers of the models that ``get(name, version)``
    returns (:meth:`ModelRegistry.get <trtserve.engine.registry.ModelRegistry.get>`), on the
    running event loop; with ``core``, the rest of the
    front end's interface too (see :meth:`of`)."""

    def __init__(self, get: Callable[[str, str], EngineModel], core: EngineCore | None = None) -> None:
        super().__init__()
        self.get = get
        self.core = core

    @classmethod
    def of(cls, core: EngineCore) -> LocalEngine:
        """The whole interface over ``core``; its table follows the core's (from :meth:`refresh`,
        called by the core after it loaded and after each change)."""
        engine = cls(core.registry.get, core)
        core.table_listeners.append(engine.refresh)
        return engine

    def refresh(self) -> None:
        """Take the model table from the engine core."""
        assert self.core is not None
        core = self.core
        self.set_table(core.loaded, core.lifecycle.ready, core.lifecycle.config.strict_readiness,
                       {name: ModelInfo(name, state, reason, specs) for name, state, reason, specs in core.table()})

    async def infer(
        self, model: str, version: str, segments: list[Tensors], ask: Ask,
    ) -> tuple[list[Tensors], float, str]:
        """See :meth:`EngineClient.infer <trtserve.ipc.client.EngineClient.infer>`."""
        served = self.get(model, version)
        future, deadline = served.submit(segments, ask)
        return await future, deadline, served.spec.version

    async def query(self, query: EngineQuery[T]) -> T:
        """The engine core's answer (:meth:`CoreQueries.answer
        <trtserve.engine.queries.CoreQueries.answer>`, awaiting ``Load`` and ``Unload``)."""
        assert self.core is not None
        try:
            value = self.core.queries.answer(query)
            return await value if asyncio.iscoroutine(value) else value
        except TrtServeError:
            raise
        except Exception as exc:  # as the engine core answers a failed query over ZeroMQ: INTERNAL
            log.error("engine core: query failed", exc_info=exc)
            raise BackendError(str(exc)) from exc

    def hint(self, model: str) -> QueueHint | None:
        """:meth:`Engine.hint <trtserve.ipc.engine.Engine.hint>`: read from the model's dispatcher
        (``None`` where no version serves)."""
        try:
            return self.get(model, "").dispatcher.hint()
        except TrtServeError:
            return None

    def shed(self, model: str, ask: Ask, now: float) -> None:
        """See :meth:`EngineClient.shed <trtserve.ipc.client.EngineClient.shed>`; here the
        model's queue is read directly
        (:meth:`Dispatcher.hint <trtserve.batching.dispatcher.Dispatcher.hint>`)."""
        refusal = shed(self.get(model, "").dispatcher.hint(), model, ask, now)
        if refusal is not None:
            if isinstance(refusal, RequestTimeout) and self.core is not None:
                self.core.record((), {model: 1})
            raise refusal

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """See :meth:`EngineClient.record <trtserve.ipc.client.EngineClient.record>`."""
        assert self.core is not None
        self.core.record((Outcome(model, code, seconds, refusal, late),), {})

    def set_active(self, active: int) -> None:
        """Requests in flight at this front end now."""
        assert self.core is not None
        self.core.local_active = active

    async def aclose(self) -> None:
        """Nothing to close: the engine core is this process's."""



__all__ = ["LocalEngine"]
