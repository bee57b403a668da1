"""The engine core's answers to the front ends' queries (:mod:`trtserve.ipc.queries`): one
function per query class, in one table (:meth:`CoreQueries.answer`).

An answer is its value, or (``Load``, ``Unload``) a coroutine that finishes once the model is
served or unloaded; the engine core answers those when they finish, serving meanwhile. Each
raises the error its RPC answers: ModelNotFound, ModelNotReady, ModelControlDisabled,
InvalidRequest.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from trtserve._proto.trtserve.v1 import control_pb2
from trtserve.batching.capacity import inflight_bound
from trtserve.engine import policy_update, statistics
from trtserve.engine.lifecycle import ModelLifecycle
from trtserve.engine.metrics import RequestStats
from trtserve.engine.registry import ModelRegistry
from trtserve.ipc.queries import (
    EngineQuery,
    GetPolicy,
    InflightBound,
    Load,
    ModelReady,
    RepositoryIndex,
    ServerReady,
    SetPolicy,
    Statistics,
    Unload,
)


class CoreQueries:
    """Answers queries about ``registry`` and ``lifecycle``.

    Args:
        registry: the live models.
        lifecycle: the model control mode (load, unload, index, readiness).
        requests: the request outcomes the front ends reported (ModelStatistics' success/fail).
        loaded: whether the models loaded at start are loaded.
    """

    def __init__(self, registry: ModelRegistry, lifecycle: ModelLifecycle, requests: RequestStats,
                 loaded: Callable[[], bool]) -> None:
        self.registry = registry
        self.lifecycle = lifecycle
        self.requests = requests
        self._loaded = loaded
        # The one table: query class → its answer (trtserve.ipc.queries says what each asks).
        self.answers: dict[type[EngineQuery[Any]], Callable[[Any], Any]] = {
            ServerReady: self._server_ready,
            ModelReady: self._model_ready,
            Statistics: self._statistics,
            RepositoryIndex: self._repository_index,
            Load: self._load,
            Unload: self._unload,
            GetPolicy: self._get_policy,
            SetPolicy: self._set_policy,
            InflightBound: self._inflight_bound,
        }

    def answer(self, query: EngineQuery[Any]) -> Any:
        """The answer to ``query``: its value, or a coroutine of it (``Load``, ``Unload``).

        Raises:
            TrtServeError: the query's error (see :mod:`trtserve.ipc.queries`).
        """
        return self.answers[type(query)](query)

    def _server_ready(self, _query: ServerReady) -> bool:
        return self._loaded() and self.lifecycle.ready

    def _model_ready(self, query: ModelReady) -> bool:
        return statistics.model_ready(self.registry, query.name, query.version)

    def _statistics(self, query: Statistics) -> bytes:
        return statistics.model_statistics(self.registry, self.requests, query.name, query.version).SerializeToString()

    def _repository_index(self, query: RepositoryIndex) -> bytes:
        return statistics.repository_index(self.lifecycle.index(), query.ready_only).SerializeToString()

    def _load(self, query: Load) -> Coroutine[Any, Any, None]:
        return self.lifecycle.load(query.name, query.parameters)

    def _unload(self, query: Unload) -> Coroutine[Any, Any, None]:
        return self.lifecycle.unload(query.name, query.parameters)

    def _get_policy(self, query: GetPolicy) -> bytes:
        answer = policy_update.get_policy(self.registry, control_pb2.GetPolicyRequest.FromString(query.request))
        return answer.SerializeToString()

    def _set_policy(self, query: SetPolicy) -> bytes:
        answer = policy_update.set_policy(self.registry, control_pb2.SetPolicyRequest.FromString(query.request))
        return answer.SerializeToString()

    def _inflight_bound(self, _query: InflightBound) -> int | None:
        return inflight_bound([m.dispatcher for e in self.registry.models.values() for m in e.versions.values()])


__all__ = ["CoreQueries"]
