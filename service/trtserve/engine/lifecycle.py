"""Which models the engine core serves, and when that changes: Triton's model control modes.

=============  ==================================================================================
mode           what is loaded
=============  ==================================================================================
``none``       every model of the repository, once at start; RepositoryModelLoad/Unload refused
``poll``       every model at start, then the repository is scanned every ``poll_secs``: a new
               model directory is loaded, a removed one unloaded (and forgotten: NOT_FOUND), a
               changed one (config, files, a version directory added or removed) reloaded;
               RepositoryModelLoad/Unload refused
``explicit``   at start only the ``load_models`` (``*``: all); then RepositoryModelLoad and
               RepositoryModelUnload decide; an unloaded model whose directory is then removed
               is forgotten (NOT_FOUND, out of RepositoryIndex) within :data:`FORGET_SECS`, or
               at once by a RepositoryIndex call
=============  ==================================================================================

A load of a served model is a reload: the new versions are built and warmed while the old
serve, then switched to at once (:meth:`ModelRegistry.load <trtserve.engine.registry.ModelRegistry.load>`).
Readiness (``strict_readiness``): strict, the server is ready once started and every model
asked for is ready; non-strict, once started.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.engine.registry import ModelRegistry
from trtserve.errors import InvalidRequest, ModelControlDisabled, ModelNotFound, Unsupported
from trtserve.ipc.messages import ModelState
from trtserve.repository import fingerprint, model_dirs

log = logging.getLogger(__name__)

DEFAULT_POLL_SECS = 15.0  # Triton's --repository-poll-secs default
FORGET_SECS = 1.0
"""Explicit mode: seconds between two looks for unloaded models whose directory is gone."""


class ControlMode(enum.Enum):
    """``--model-control-mode``: Triton's names."""

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


@dataclass(frozen=True)
class LifecycleConfig:
    """How the engine core's set of models is controlled (from the CLI).

    Attributes:
        mode: see the module table.
        load_models: in ``explicit`` mode, the models loaded at start (``"*"``: all).
        poll_secs: in ``poll`` mode, seconds between two scans of the repository (> 0).
        strict_readiness: ServerReady and health wait for every model asked for (True,
            Triton's default), or only for the server to be up (False).
    """

    mode: ControlMode = ControlMode.NONE
    load_models: tuple[str, ...] = ()
    poll_secs: float = DEFAULT_POLL_SECS
    strict_readiness: bool = True

    def __post_init__(self) -> None:
        if self.load_models and self.mode is not ControlMode.EXPLICIT:
            raise ValueError(f"--load-model needs --model-control-mode explicit (the mode is {self.mode.value})")
        if not (self.poll_secs > 0 and math.isfinite(self.poll_secs)):
            raise ValueError(f"--repository-poll-secs must be a number of seconds > 0, got {self.poll_secs}")


class ModelLifecycle:
    """Loads, reloads and unloads the models of ``registry`` (the live
    :class:`~trtserve.engine.registry.ModelRegistry`) as ``config`` says.

    Touched only from the event loop. :meth:`start` does the loading at start (and starts
    polling); :meth:`load` / :meth:`unload` answer the RPCs; :meth:`aclose` stops polling.
    """

    def __init__(self, registry: ModelRegistry, config: LifecycleConfig | None = None) -> None:
        self.registry = registry
        self.config = config or LifecycleConfig()
        self._seen: dict[str, tuple[object, ...]] = {}  # poll mode: model → files at the last scan
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load what the mode loads at start (failures are recorded per model, never raised)."""
        mode, names = self.config.mode, self.registry.discover()
        if mode is ControlMode.EXPLICIT and "*" not in self.config.load_models:
            names = [n for n in names if n in self.config.load_models]
        if mode is ControlMode.POLL:
            self._seen = {name: fingerprint(self.registry.root / name) for name in names}
        await self.registry.load_all(names)
        if mode is ControlMode.POLL:
            self._poller = asyncio.ensure_future(self._poll_forever())
        elif mode is ControlMode.EXPLICIT:
            self._poller = asyncio.ensure_future(self._forget_removed_forever())

    @property
    def ready(self) -> bool:
        """Whether the server counts as ready (after :meth:`start`), by ``strict_readiness``."""
        return self.registry.ready or not self.config.strict_readiness

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        """RepositoryModelLoad: load ``name``, or reload it if served (see the module docstring).

        Args:
            parameters: the request's parameters; ``config`` is a model config as JSON
                (Triton's form) used instead of ``config.pbtxt`` and audited the same way.

        Raises:
            ModelControlDisabled (UNAVAILABLE): the mode is ``none`` or ``poll``.
            ModelNotFound (NOT_FOUND): no such model directory.
            Unsupported (UNIMPLEMENTED): a ``file:`` override (model files sent in the request).
            InvalidRequest (INVALID_ARGUMENT): another parameter, a ``config`` that is not a
                model config, or a model that fails to load (the reason; a model that was
                served keeps serving its old versions).
        """
        self._check_mode("load")
        self._check_dir(name)
        config = None
        for key, value in parameters.items():
            if key == "config":
                config = _config_of(name, value)
            elif key.startswith("file:"):
                raise Unsupported(f"RepositoryModelLoad parameter '{key}': trtserve loads model files from its "
                                  f"repository only; copy them into {self.registry.root / name} and load again")
            else:
                raise InvalidRequest(f"RepositoryModelLoad has no parameter '{key}' (it takes 'config')")
        reason = await self.registry.load(name, config)
        if reason:
            raise InvalidRequest(f"failed to load model '{name}': {reason}")

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        """RepositoryModelUnload: stop serving ``name`` once what is queued on it is answered.

        Args:
            parameters: ``unload_dependents`` (bool) is accepted: trtserve has no ensembles,
                so a model has no dependents to unload.

        Raises:
            ModelControlDisabled (UNAVAILABLE): the mode is ``none`` or ``poll``.
            ModelNotFound (NOT_FOUND): no such model, loaded or in the repository.
            InvalidRequest (INVALID_ARGUMENT): another parameter.
        """
        self._check_mode("unload")
        for key in parameters:
            if key != "unload_dependents":
                raise InvalidRequest(f"RepositoryModelUnload has no parameter '{key}' (it takes 'unload_dependents')")
        if name not in self.registry.models:
            self._check_dir(name)
            return  # in the repository and not loaded: nothing to do, as Triton
        await self.registry.unload(name)

    def index(self) -> list[tuple[str, str, ModelState, str]]:
        """(name, version, state, reason) of every model in the repository or the table: one
        row per served version; a model directory never loaded is UNAVAILABLE, "not loaded"."""
        rows = []
        dirs = set(model_dirs(self.registry.root))
        self._forget_removed(dirs)
        entries = self.registry.models
        for name in sorted(set(entries) | dirs):
            entry = entries.get(name)
            if entry is None:
                rows.append((name, "", ModelState.UNAVAILABLE, "not loaded"))
            elif entry.versions:
                rows += [(name, version, entry.state, entry.reason) for version in entry.versions]
            else:
                rows.append((name, "", entry.state, entry.reason))
        return rows

    async def aclose(self) -> None:
        """Stop polling or looking for removed models (a scan under way is cancelled; a model it
        was loading is left as it was)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None

    async def poll(self) -> None:
        """One scan of the repository (poll mode): load what is new, reload what changed,
        unload what is gone. A directory whose files have not changed since the last scan is
        left alone, even one that failed to load (it is retried once it changes)."""
        root = self.registry.root
        names = await asyncio.to_thread(model_dirs, root)
        now = {name: await asyncio.to_thread(fingerprint, root / name) for name in names}
        for name in [n for n in self._seen if n not in now]:
            del self._seen[name]
            log.info("poll: model %s is gone from the repository: unloading", name)
            await self.registry.unload(name)
            self.registry.forget(name)
        for name, files in now.items():
            if self._seen.get(name) != files:
                self._seen[name] = files
                log.info("poll: model %s is new or changed: loading", name)
                await self.registry.load(name)

    def _forget_removed(self, dirs: set[str]) -> None:
        """Forget every model that serves no version (unloaded, or failed to load) and whose
        directory is no longer among ``dirs``: requests for it are NOT_FOUND, as for a name the
        repository never had."""
        for name, entry in list(self.registry.models.items()):
            if name not in dirs and not entry.versions and name not in self.registry.busy:
                log.info("model %s is gone from the repository: forgotten", name)
                self.registry.forget(name)

    async def _forget_removed_forever(self) -> None:
        while True:
            await asyncio.sleep(FORGET_SECS)
            if any(not e.versions for e in self.registry.models.values()):  # else nothing to look for
                try:
                    self._forget_removed(set(await asyncio.to_thread(model_dirs, self.registry.root)))
                except OSError:  # the repository unreadable a moment: look again next time
                    log.exception("looking for removed models in %s failed", self.registry.root)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_secs)
            try:
                await self.poll()
            except Exception:  # one failed scan must not end polling
                log.exception("poll: scanning %s failed", self.registry.root)

    def _check_mode(self, action: str) -> None:
        if self.config.mode is not ControlMode.EXPLICIT:
            raise ModelControlDisabled(
                f"explicit model {action} is not allowed in model control mode '{self.config.mode.value}' "
                f"(start the server with --model-control-mode explicit)"
            )

    def _check_dir(self, name: str) -> None:
        if name not in model_dirs(self.registry.root):
            raise ModelNotFound(f"no model '{name}' in the repository {self.registry.root}")


def _config_of(name: str, value: Any) -> mc.ModelConfig:
    """The ``config`` parameter of RepositoryModelLoad: a model config in JSON (as Triton
    takes it; field names as in config.pbtxt or in camelCase).

    Raises:
        InvalidRequest: not a string, not JSON, or a field a model config does not have.
    """
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidRequest(f"RepositoryModelLoad parameter 'config' of model '{name}' must be a JSON string")
    try:
        return json_format.Parse(value, mc.ModelConfig())
    except json_format.ParseError as exc:
        raise InvalidRequest(
            f"RepositoryModelLoad parameter 'config' of model '{name}' is not a model config: {exc}"
        ) from None


__all__ = ["ControlMode", "DEFAULT_POLL_SECS", "LifecycleConfig", "ModelLifecycle"]
