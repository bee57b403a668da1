"""The engine core's live model registry: the models of the repository that are loaded, one
:class:`~trtserve.engine.model.EngineModel` per served version, and their states.

A model whose config or file is broken is kept as *unavailable* with the reason (reported by
ModelReady, ModelMetadata and RepositoryIndex) while the other models serve. Parsing a model's
``config.pbtxt`` is :mod:`trtserve.repository`'s; which models are loaded when (model control
modes, polling) is :mod:`trtserve.engine.lifecycle`'s.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.batching.stats import DispatchStats
from trtserve.clock import Clock
from trtserve.engine.model import EngineModel
from trtserve.errors import ModelNotFound, ModelNotReady
from trtserve.ipc.messages import ModelState
from trtserve.repository import ConfigError, fingerprint, load_specs, model_dirs
from trtserve.spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """A model directory and what became of it.

    Attributes:
        name: the model's name (its directory under the repository).
        state: READY, LOADING, UNLOADING or UNAVAILABLE.
        reason: why it is not READY (a load failure, ``"unloaded"``); empty otherwise.
        versions: version → the instance serving it, ascending; swapped as a whole on a
            (re)load, so a request sees the old set or the new, never a mix.
        wanted: asked for (at start, or by a load not undone by an unload): strict readiness
            waits for it.
    """

    name: str
    state: ModelState
    reason: str = ""
    versions: dict[str, EngineModel] = dataclass_field(default_factory=dict)
    wanted: bool = True

    @property
    def served(self) -> EngineModel | None:
        """The highest version served (where a request without ``model_version`` goes)."""
        return next(reversed(self.versions.values()), None)

    @property
    def spec(self) -> ModelSpec | None:
        """The spec of :attr:`served`."""
        return self.served.spec if self.served is not None else None


class LoadPhases:
    """Keeps a model's warm-up away from every other load's work: backends build together,
    a warm-up runs alone.

    The warm-up's throughput curve chooses the batch cap a model starts with
    (:func:`~trtserve.engine.warmup.warm_up`), so it must measure the engine, not the
    neighbours: building a backend (an ONNX Runtime session's graph optimisation, libtorch's
    import, a Python model's worker processes) takes the same cores for seconds. Measured on 2
    cores with the shipped ``engines/``: minilm's warm-up beside minilm_pt's build peaked at
    115 rows/s, where the same session alone runs 210-230. A warm-up waits until no build is
    in progress and no other warm-up runs; a build waits only while a warm-up runs, so at start
    every backend builds at once and the warm-ups follow one by one (a build asked for while a
    warm-up waits goes first: loads are finite, and a small model's build must not wait out a
    large one's). Traffic to the models already served still shares the machine: that is what
    the cap's probes while serving are for (:class:`~trtserve.batching.cap.BatchCap`)."""

    def __init__(self) -> None:
        self._turn = asyncio.Condition()
        self._building = 0
        self._warming = False

    @asynccontextmanager
    async def build(self) -> AsyncIterator[None]:
        """Held while one backend builds; any number at once, none beside a warm-up."""
        async with self._turn:
            await self._turn.wait_for(lambda: not self._warming)
            self._building += 1
        try:
            yield
        finally:
            async with self._turn:
                self._building -= 1
                self._turn.notify_all()

    @asynccontextmanager
    async def warm_up(self) -> AsyncIterator[None]:
        """Held while one model warms up: alone, with no build in progress."""
        async with self._turn:
            await self._turn.wait_for(lambda: not self._warming and not self._building)
            self._warming = True
        try:
            yield
        finally:
            async with self._turn:
                self._warming = False
                self._turn.notify_all()


BackendFactory = Callable[[ModelSpec], object]
"""Builds a model's runtime (a :class:`~trtserve.runtimes.base.Backend`) from its spec; runs
on a worker thread and may raise (the model is then unavailable with that reason)."""


class ModelRegistry:
    """The models under ``root`` that are loaded, one :class:`EngineModel` per served version.

    Touched only from the event loop. Every change of a model's state or versions calls each
    of :attr:`listeners` (the engine core pushes the new table to the front ends).

    Each (model, version) keeps one :class:`~trtserve.batching.stats.DispatchStats` for the life
    of the registry (:attr:`stats`): a rebuilt instance (a reload with a changed config or
    files, a version removed and added back, an unload and a load) counts on from where the
    one before it stopped, so the metrics' counters and ModelStatistics never go backwards.

    Args:
        root: the model repository directory (``engines/``).
        clock: time source handed to each model's dispatcher.
        backend_factory: builds a model's runtime from its spec (:func:`trtserve.runtimes.create`).
    """

    def __init__(self, root: Path, *, clock: Clock, backend_factory: BackendFactory) -> None:
        self.root = Path(root)
        self.clock = clock
        self.backend_factory = backend_factory
        self.models: dict[str, ModelEntry] = {}
        self.listeners: list[Callable[[], None]] = []
        self._phases = LoadPhases()
        self._busy: dict[str, asyncio.Lock] = {}  # model → held while it loads or unloads
        # (model, version) → the config and files it was built from
        self._files: dict[tuple[str, str], tuple[object, ...]] = {}
        self.stats: dict[tuple[str, str], DispatchStats] = {}
        """(model, version) → its counters, kept across rebuilds (see the class docstring)."""

    def discover(self) -> list[str]:
        """Names of the model directories (see :func:`~trtserve.repository.model_dirs`), sorted."""
        return model_dirs(self.root)

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load every model found (or ``names``); failures are recorded, never raised."""
        names = self.discover() if names is None else names
        for name in names:
            self.models.setdefault(name, ModelEntry(name, ModelState.LOADING))
        await asyncio.gather(*(self.load(name) for name in names))

    async def load(self, name: str, config: mc.ModelConfig | None = None) -> str:
        """Load model ``name``, or reload it if it is served: parse its config (or ``config``),
        build and warm every version the policy serves whose config or files changed (a
        version with neither changed keeps its instance), then switch to the new set at once.
        The versions left out finish everything queued on them and are closed (their memory
        returned). While a reload builds, the old versions keep serving.

        Returns:
            ``""`` once served, else why not (a model that was served keeps serving its old
            versions; one that was not is UNAVAILABLE with that reason). Never raises.
        """
        entry = self.models.setdefault(name, ModelEntry(name, ModelState.LOADING))
        async with self._busy.setdefault(name, asyncio.Lock()):
            entry.wanted = True
            serving = entry.state is ModelState.READY
            if not serving:
                entry.state, entry.reason = ModelState.LOADING, ""
                self._changed()
            built: list[EngineModel] = []
            files_of: dict[tuple[str, str], tuple[object, ...]] = {}
            try:
                versions: dict[str, EngineModel] = {}
                for spec in await asyncio.to_thread(load_specs, self.root / name, config):
                    key = (name, spec.version)
                    files_of[key] = (
                        spec.config.SerializeToString(deterministic=True),
                        fingerprint(spec.model_dir, skip_versions=True),
                        fingerprint(spec.version_dir),
                    )
                    kept = entry.versions.get(spec.version)
                    if kept is None or self._files.get(key) != files_of[key]:
                        kept = await self._start(spec)
                        built.append(kept)
                    versions[spec.version] = kept
            except Exception as exc:  # this model stays as it was, or unavailable; never the server
                reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                await asyncio.gather(*(m.aclose() for m in built))
                if not serving:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, reason
                    self._changed()
                log.error("model %s failed to %s: %s", name, "reload" if serving else "load", reason)
                return reason
            retired = [m for v, m in entry.versions.items() if versions.get(v) is not m]
            self._files = {**{k: v for k, v in self._files.items() if k[0] != name}, **files_of}
            entry.versions, entry.state, entry.reason = versions, ModelState.READY, ""
            self._changed()
            log.info("model %s version(s) %s ready", name, ", ".join(versions))
            await self._retire(retired)
            return ""

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: new requests are refused (UNAVAILABLE, "unloading") while
        everything queued on it finishes; then its versions are closed and their memory
        returned. It stays in the table as UNAVAILABLE, "unloaded"."""
        entry = self.models.get(name)
        if entry is None:
            return
        async with self._busy.setdefault(name, asyncio.Lock()):
            entry.wanted = False
            entry.state, entry.reason = ModelState.UNLOADING, ""
            self._changed()
            retired, entry.versions = list(entry.versions.values()), {}
            await self._retire(retired)
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
            self._files = {k: v for k, v in self._files.items() if k[0] != name}
            self._changed()

    @property
    def busy(self) -> set[str]:
        """The models loading or unloading now."""
        return {name for name, lock in self._busy.items() if lock.locked()}

    def forget(self, name: str) -> None:
        """Drop ``name`` from the table (after :meth:`unload`): its directory is gone, so
        requests for it are NOT_FOUND, as for any unknown model."""
        entry = self.models.get(name)
        if entry is not None and not entry.versions:
            del self.models[name]
            self._changed()

    async def _start(self, spec: ModelSpec) -> EngineModel:
        asked = self.clock.now()
        async with self._phases.build():
            waited = self.clock.now() - asked
            backend = await asyncio.to_thread(self.backend_factory, spec)
        try:
            served = EngineModel(spec, backend, clock=self.clock)  # type: ignore[arg-type]
        except BaseException:
            await backend.aclose()  # type: ignore[attr-defined]
            raise
        try:
            asked = self.clock.now()
            async with self._phases.warm_up():
                waited += self.clock.now() - asked
                await served.start()
        except BaseException:
            await served.aclose()
            raise
        # Counters carry on from the previous instance of this version (which, if it is still
        # draining, counts its last batches into the same object).
        served.dispatcher.stats = self.stats.setdefault((spec.name, spec.version), served.dispatcher.stats)
        log.info("model %s version %s built (%s, %d slot(s))%s", spec.name, spec.version, spec.platform,
                 spec.instances, f"; it waited {waited:.1f} s for other models' builds and warm-ups (LoadPhases)"
                 if waited >= 0.05 else "")
        return served

    async def _retire(self, models: list[EngineModel]) -> None:
        """Drain and close ``models`` (nothing routes to them any more), then hand the freed
        memory back to the system."""
        if not models:
            return
        await asyncio.gather(*(m.aclose() for m in models))
        del models[:]
        await asyncio.to_thread(release_memory)

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def get(self, name: str, version: str = "") -> EngineModel:
        """The instance serving ``name`` at ``version`` (empty: the highest version served).

        Raises:
            ModelNotFound: no such model, or a version it does not serve.
            ModelNotReady: the model is loading, unloading, unloaded or failed to load (with the
                reason).
        """
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model '{name}'")
        versions = entry.versions
        if entry.state is not ModelState.READY or not versions:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(f"model '{name}' is {entry.state.value.lower()}{why}")
        if not version:
            return next(reversed(versions.values()))
        served = versions.get(version)
        if served is None:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}' (serving version(s) {', '.join(versions)})"
            )
        return served

    @property
    def ready(self) -> bool:
        """Whether every model asked for (:attr:`ModelEntry.wanted`) is ready."""
        return all(e.state is ModelState.READY for e in self.models.values() if e.wanted)

    async def aclose(self) -> None:
        """Drain and unload every model: queued and running requests finish first."""
        for entry in self.models.values():
            if entry.versions:
                entry.state = ModelState.UNLOADING
        await asyncio.gather(*(m.aclose() for e in self.models.values() for m in e.versions.values()))
        for entry in self.models.values():
            entry.versions = {}
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "unloaded"


def release_memory() -> None:
    """Return freed heap to the system after a model is closed: a garbage collection (the
    runtime's buffers may sit in reference cycles), then glibc's ``malloc_trim(0)``, without
    which the allocator keeps the pages of a closed ONNX Runtime session and the RSS stays
    up. Elsewhere than glibc only the collection runs."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


__all__ = ["BackendFactory", "ModelEntry", "ModelRegistry", "release_memory"]
