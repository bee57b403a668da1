"""The models one front end serves: a :class:`~trtserve.frontend.pipeline.FrontendModel` (its
handler loaded) per served version, following the engine core's model table.

The engine core sends a new table whenever a model is loaded, reloaded or unloaded
(:class:`~trtserve.ipc.engine.Engine`); :class:`ModelTable` then builds what is
new (off the loop: a handler may read tokenizer files) and drops what is gone. A model the
table marks LOADING, UNLOADING or UNAVAILABLE is refused at once, UNAVAILABLE with the state
and reason, whatever was built for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from trtserve.errors import ModelNotFound, ModelNotReady
from trtserve.frontend.pipeline import FrontendModel
from trtserve.ipc.engine import Engine, ModelInfo
from trtserve.ipc.messages import ModelState

log = logging.getLogger(__name__)


class ModelTable:
    """A front end's served models, by name and version.

    Args:
        engine: the connection to the engine core (its ``models`` is the table followed).
        pool: executor for the handlers' pre/post-processing.
        on_change: awaited after each refresh (the service recomputes an automatic in-flight
            bound and republishes its health).

    Touched only from the loop. :attr:`versions` is replaced as a whole by each refresh, and
    refreshes run one at a time, each building from the newest table.
    """

    def __init__(self, engine: Engine, pool: Executor, on_change: Callable[[], Awaitable[None]]) -> None:
        self.engine = engine
        self.pool = pool
        self.on_change = on_change
        self.versions: dict[str, dict[str, FrontendModel]] = {}
        self.unavailable: dict[str, str] = {}  # model → why this front end cannot serve it
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def follow(self) -> None:
        """Refresh after every table the engine core sends from now on."""
        self.engine.listeners.append(self._schedule)

    def _schedule(self) -> None:
        task = asyncio.ensure_future(self.refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def refresh(self) -> None:
        """Build a FrontendModel for each served version that is new or whose spec changed,
        keep the others, drop what the table no longer serves. A handler that fails to load
        makes its model unavailable here with the reason; the other models serve."""
        async with self._lock:
            current, versions, unavailable = self.versions, {}, {}
            for name, info in sorted(self.engine.models.items()):
                built: dict[str, FrontendModel] = {}
                for spec in info.specs:
                    model = current.get(name, {}).get(spec.version)
                    if model is None or model.spec != spec:
                        try:
                            model = await asyncio.to_thread(
                                FrontendModel, spec, self.engine, pool=self.pool
                            )
                        except Exception as exc:  # this model is unavailable here; the others serve
                            unavailable[name] = f"its handler failed to load: {type(exc).__name__}: {exc}"
                            log.error("model %s: %s", name, unavailable[name])
                            continue
                    built[spec.version] = model
                if built:
                    versions[name] = built
            self.versions, self.unavailable = versions, unavailable
        await self.on_change()

    def info(self, name: str) -> ModelInfo:
        """The table entry of a model that is READY.

        Raises:
            ModelNotFound (NOT_FOUND): no such model.
            ModelNotReady (UNAVAILABLE): still starting, or the model is loading, unloading,
                unloaded or failed to load (the sentence says which, with the reason).
        """
        info = self.engine.model(name)
        if info.state is not ModelState.READY or not info.specs:
            why = f": {info.reason}" if info.reason else ""
            raise ModelNotReady(f"model '{name}' is {info.state.value.lower()}{why}")
        return info

    async def get(self, name: str, version: str) -> FrontendModel:
        """The model serving ``name`` at ``version`` (empty: the highest served).

        Raises:
            ModelNotFound (NOT_FOUND): no such model, or a version it does not serve.
            ModelNotReady (UNAVAILABLE): see :meth:`info`; or its handler failed to load here.
        """
        info = self.info(name)
        wanted = version or info.specs[-1].version
        spec = next((s for s in info.specs if s.version == wanted), None)
        if spec is None:
            served = ", ".join(s.version for s in info.specs)
            raise ModelNotFound(
                f"model '{name}' has no version '{version}' (serving version(s) {served})"
            )
        model = self.versions.get(name, {}).get(wanted)
        if (model is None or model.spec != spec) and name not in self.unavailable:
            # The table is newer than what is built: build it now (a failed handler is retried
            # on the next table).
            await self.refresh()
            model = self.versions.get(name, {}).get(wanted)
        if model is None:
            why = self.unavailable.get(name, "it is not built in this front end")
            raise ModelNotReady(f"model '{name}' is unavailable: {why}")
        return model

    def ready(self, name: str, version: str) -> bool:
        """Whether ``name`` (at ``version``, empty: any) is served here."""
        built = self.versions.get(name, {})
        return bool(built) and (not version or version in built)


__all__ = ["ModelTable"]
