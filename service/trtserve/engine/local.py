"""The engine core's request interface, in process: for tools that run a model without a
server (``trtserve check``, the Ray bulk actors) and for tests of a runtime.

:class:`LocalEngine` has the ``infer`` of :class:`~trtserve.frontend.engine_client.EngineClient`
but calls the repository's dispatcher directly, so a
:class:`~trtserve.frontend.pipeline.FrontendModel` over it runs exactly the handler and
batching path that ``trtserve serve`` runs, without the IPC.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Executor

from ..batching.queue import Segment
from ..frontend.pipeline import FrontendModel
from ..repository import Repository
from .model import EngineModel


class LocalEngine:
    """Requests straight into the dispatchers of the models that ``get(name, version)``
    returns (``Repository.get``), on the running event loop."""

    def __init__(self, get: Callable[[str, str], EngineModel]) -> None:
        self.get = get

    async def infer(
        self, model: str, version: str, segments: list[Segment], *, priority: int = 0,
        timeout: float | None = None, deadline: float = math.inf,
    ) -> tuple[list[Segment], float]:
        """See :meth:`EngineClient.infer <trtserve.frontend.engine_client.EngineClient.infer>`."""
        future, resolved = self.get(model, version).submit(
            segments, priority=priority, timeout=timeout, deadline=deadline
        )
        return await future, resolved


def local_model(repository: Repository, name: str, pool: Executor) -> FrontendModel:
    """Model ``name`` of a loaded ``repository`` with its handler, served in process.

    Raises:
        ModelNotFound, ModelNotReady: see :meth:`Repository.get`.
    """
    return FrontendModel(repository.get(name).spec, LocalEngine(repository.get), pool=pool)  # type: ignore[arg-type]
