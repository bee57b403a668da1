"""The engine core's queries, each said once: one frozen class per question, its arguments as
fields and its answer's type as the class's parameter.

A front end asks with :meth:`Engine.query <trtserve.ipc.engine.Engine.query>` (over ZeroMQ, or
in process); the engine core answers from one table,
:meth:`CoreQueries.answer <trtserve.engine.queries.CoreQueries.answer>`, one function per class.

=================  ==============  ============================================================
query              answer          what it asks (errors: the gRPC status they become)
=================  ==============  ============================================================
ServerReady        ``bool``        loaded, and ready by ``--strict-readiness``
ModelReady         ``bool``        the model (version) is served and not every slot hung
Statistics         ``bytes``       a serialized ``ModelStatisticsResponse`` (NOT_FOUND)
RepositoryIndex    ``bytes``       a serialized ``RepositoryIndexResponse``
Load               ``None``        RepositoryModelLoad, answered once the model serves
                                   (NOT_FOUND, UNAVAILABLE, INVALID_ARGUMENT)
Unload             ``None``        RepositoryModelUnload, answered once its queue is answered
GetPolicy          ``bytes``       ModelControl GetPolicy, serialized (NOT_FOUND)
SetPolicy          ``bytes``       ModelControl SetPolicy: the policy in force after it
                                   (NOT_FOUND, INVALID_ARGUMENT naming the field)
InflightBound      ``int | None``  a front end's automatic in-flight bound (None: no bound)
=================  ==============  ============================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class EngineQuery(Generic[T]):
    """A question to the engine core whose answer is a ``T`` (the table in the module
    docstring). Subclasses are frozen dataclasses of plain values: they cross pickled."""


@dataclass(frozen=True)
class ServerReady(EngineQuery[bool]):
    """Whether the engine core counts the server ready (its models loaded, by
    ``--strict-readiness``)."""


@dataclass(frozen=True)
class ModelReady(EngineQuery[bool]):
    """Whether ``name`` at ``version`` (empty: the highest) is served and not every slot hung."""

    name: str
    version: str


@dataclass(frozen=True)
class Statistics(EngineQuery[bytes]):
    """ModelStatistics of ``name`` (empty: every model) at ``version`` (empty: every version)."""

    name: str
    version: str


@dataclass(frozen=True)
class RepositoryIndex(EngineQuery[bytes]):
    """RepositoryIndex: every model with its state (only READY ones if ``ready_only``)."""

    ready_only: bool


@dataclass(frozen=True)
class Load(EngineQuery[None]):
    """RepositoryModelLoad of ``name`` (``parameters``: ``config``, JSON)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unload(EngineQuery[None]):
    """RepositoryModelUnload of ``name`` (``parameters``: ``unload_dependents``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GetPolicy(EngineQuery[bytes]):
    """ModelControl GetPolicy: ``request`` is a serialized ``trtserve.v1.GetPolicyRequest``."""

    request: bytes


@dataclass(frozen=True)
class SetPolicy(EngineQuery[bytes]):
    """ModelControl SetPolicy: ``request`` is a serialized ``trtserve.v1.SetPolicyRequest``."""

    request: bytes


@dataclass(frozen=True)
class InflightBound(EngineQuery[int | None]):
    """The automatic in-flight request bound of a front end (``--max-inflight-rpcs auto``)."""


__all__ = ["EngineQuery", "GetPolicy", "InflightBound", "Load", "ModelReady", "RepositoryIndex",
           "ServerReady", "SetPolicy", "Statistics", "Unload"]
