"""The engine core's answers to the front ends' queries: one method per
:class:`~trtserve.ipc.messages.QueryKind`, of the same name, with the arguments of
:class:`~trtserve.ipc.engine.EngineQueries` (whose methods send them).

A method returns its value, or (``load``, ``unload``) a coroutine that finishes once the model
is served or unloaded; the engine core answers those when they finish, serving meanwhile.
Each raises the error its RPC answers: ModelNotFound, ModelNotReady, ModelControlDisabled,
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

    def server_ready(self) -> bool:
        """Loaded, and ready by the readiness rule (``--strict-readiness``)."""
        return self._loaded() and self.lifecycle.ready

    def model_ready(self, name: str, version: str) -> bool:
        """See :func:`~trtserve.engine.statistics.model_ready`."""
        return statistics.model_ready(self.registry, name, version)

    def statistics(self, name: str, version: str) -> bytes:
        """A serialized ModelStatisticsResponse
        (:func:`~trtserve.engine.statistics.model_statistics`)."""
        return statistics.model_statistics(self.registry, self.requests, name, version).SerializeToString()

    def repository_index(self, ready_only: bool) -> bytes:
        """A serialized RepositoryIndexResponse (:func:`~trtserve.engine.statistics.repository_index`)."""
        return statistics.repository_index(self.lifecycle.index(), ready_only).SerializeToString()

    def load(self, name: str, parameters: dict[str, Any]) -> Coroutine[Any, Any, None]:
        """RepositoryModelLoad (:meth:`~trtserve.engine.lifecycle.ModelLifecycle.load`)."""
        return self.lifecycle.load(name, parameters)

    def unload(self, name: str, parameters: dict[str, Any]) -> Coroutine[Any, Any, None]:
        """RepositoryModelUnload (:meth:`~trtserve.engine.lifecycle.ModelLifecycle.unload`)."""
        return self.lifecycle.unload(name, parameters)

    def get_policy(self, request: bytes) -> bytes:
        """ModelControl GetPolicy, serialized in and out
        (:func:`~trtserve.engine.policy_update.get_policy`)."""
        answer = policy_update.get_policy(self.registry, control_pb2.GetPolicyRequest.FromString(request))
        return answer.SerializeToString()

    def set_policy(self, request: bytes) -> bytes:
        """ModelControl SetPolicy, serialized in and out
        (:func:`~trtserve.engine.policy_update.set_policy`)."""
        answer = policy_update.set_policy(self.registry, control_pb2.SetPolicyRequest.FromString(request))
        return answer.SerializeToString()

    def inflight_bound(self) -> int | None:
        """A front end's automatic in-flight bound (:func:`~trtserve.batching.capacity.inflight_bound`)."""
        return inflight_bound(
            [m.dispatcher for e in self.registry.models.values() for m in e.versions.values()]
        )


__all__ = ["CoreQueries"]
