"""The engine core's interface in process: no ZeroMQ between the front end and the dispatchers.

:class:`LocalEngine` offers what :class:`~trtserve.frontend.engine_client.EngineClient` offers
— ``infer``, the model table, ``query``, ``record``, ``set_active`` — by calling an
:class:`~trtserve.engine.core.EngineCore` of this process directly. ``trtserve serve
--frontends 1`` runs this way (measured faster for one caller than the two processes of
``--frontends 2`` on 2 cores: README, "Process model"), and so do the tools that run a model
without a server (``trtserve check``, the Ray bulk actors), with only ``infer``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..batching import drain
from ..batching.queue import Segment
from ..errors import RequestTimeout
from ..engine.model import EngineModel
from ..repository import Repository
from .engine_client import EngineView, ModelInfo
from .pipeline import FrontendModel

if TYPE_CHECKING:
    from ..engine.core import EngineCore


class LocalEngine(EngineView):
    """Requests straight into the dispatchers of the models that ``get(name, version)``
    returns (``Repository.get``), on the running event loop; with ``core``, the rest of the
    front end's interface too (see :meth:`of`)."""

    def __init__(self, get: Callable[[str, str], EngineModel], core: EngineCore | None = None) -> None:
        super().__init__()
        self.get = get
        self.core = core

    @classmethod
    def of(cls, core: EngineCore) -> LocalEngine:
        """The whole interface over ``core``; its table follows the core's (from :meth:`refresh`,
        called by the core after it loaded and after each change)."""
        engine = cls(core.repository.get, core)
        core.table_listeners.append(engine.refresh)
        return engine

    def refresh(self) -> None:
        """Take the model table from the engine core."""
        assert self.core is not None
        self.set_table(self.core.loaded, self.core.lifecycle.ready, self.core.lifecycle.config.strict_readiness,
                       {name: ModelInfo(name, state, reason, specs) for name, state, reason, specs in self.core.table()})

    async def infer(
        self, model: str, version: str, segments: list[Segment], *, priority: int = 0,
        timeout: float | None = None, deadline: float = math.inf,
    ) -> tuple[list[Segment], float, str]:
        """See :meth:`EngineClient.infer <trtserve.frontend.engine_client.EngineClient.infer>`."""
        served = self.get(model, version)
        future, resolved = served.submit(segments, priority=priority, timeout=timeout, deadline=deadline)
        return await future, resolved, served.spec.version

    async def query(self, what: str, arg: Any = None) -> Any:
        """See :meth:`EngineCore.query <trtserve.engine.core.EngineCore.query>`."""
        assert self.core is not None
        value = self.core.query(what, arg)
        return await value if asyncio.iscoroutine(value) else value

    def shed(self, model: str, priority: int, timeout: float | None, deadline: float, now: float) -> None:
        """See :meth:`EngineClient.shed <trtserve.frontend.engine_client.EngineClient.shed>`;
        here the model's queue is read directly (the dispatcher's :meth:`hint`)."""
        refusal = drain.shed(self.get(model, "").dispatcher.hint(), model, priority, timeout, deadline, now)
        if refusal is not None:
            if isinstance(refusal, RequestTimeout) and self.core is not None:
                self.core.record([], {model: 1})
            raise refusal

    def record(self, model: str, code: str, seconds: float, *, refusal: str | None, late: bool) -> None:
        """See :meth:`EngineClient.record <trtserve.frontend.engine_client.EngineClient.record>`."""
        assert self.core is not None
        self.core.record([(model, code, seconds, refusal, late)], {})

    def set_active(self, active: int) -> None:
        """Requests in flight at this front end now."""
        assert self.core is not None
        self.core.local_active = active

    async def aclose(self) -> None:
        """Nothing to close: the engine core is this process's."""


def local_model(repository: Repository, name: str, pool: Executor) -> FrontendModel:
    """Model ``name`` of a loaded ``repository`` with its handler, served in process.

    Raises:
        ModelNotFound, ModelNotReady: see :meth:`Repository.get`.
    """
    return FrontendModel(repository.get(name).spec, LocalEngine(repository.get), pool=pool)
