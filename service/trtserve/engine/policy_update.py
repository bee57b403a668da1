"""``trtserve.v1.ModelControl`` in the engine core: read and change a model's batching policy
at run time (the front ends forward the RPC, :mod:`trtserve.frontend.grpc.model_control`).

A change replaces the dispatcher's :class:`~trtserve.config.BatchingPolicy` and
applies to the next batch it forms; nothing queued or running is dropped. Errors map to
gRPC statuses like the inference service's: NOT_FOUND for an unknown model, UNAVAILABLE for
one not ready, INVALID_ARGUMENT for a value out of range (naming the field).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trtserve._proto.trtserve.v1 import control_pb2 as pb
from trtserve.config import BatchingPolicy
from trtserve.engine.registry import ModelRegistry
from trtserve.errors import InvalidRequest


def _us(seconds: float) -> int:
    return 0 if math.isinf(seconds) else round(seconds * 1e6)


def to_message(policy: BatchingPolicy) -> pb.BatchingPolicy:
    """The run-time adjustable fields of ``policy`` as a message (times in µs; 0 for none)."""
    return pb.BatchingPolicy(
        max_batch_size=policy.max_batch_size,
        max_queue_delay_us=_us(policy.max_queue_delay),
        default_timeout_us=_us(policy.default_queue.default_timeout),
        max_queue_size=policy.default_queue.max_queue_size,
        adaptive=policy.adaptive,
        adaptive_batch_size=policy.adaptive_batch_size,
        priority_aging_us=_us(policy.priority_aging),
        length_bucketing=policy.length_bucketing,
    )


def apply_update(
    policy: BatchingPolicy, update: pb.BatchingPolicy, paths: list[str], engine_limit: int
) -> BatchingPolicy:
    """``policy`` with the fields named in ``paths`` taken from ``update``.

    Raises:
        InvalidRequest: an unknown path, or a value out of range (``max_batch_size`` above
            the limit the model was loaded with, 0 for a batched model, or not 0 for an unbatched one).
    """
    known = set(pb.BatchingPolicy.DESCRIPTOR.fields_by_name)
    unknown = [p for p in paths if p not in known]
    if unknown:
        raise InvalidRequest(f"unknown policy field(s) {unknown}; known: {sorted(known)}")
    queue_changes: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    for path in paths:
        value = getattr(update, path)
        if path == "max_batch_size":
            if not engine_limit and value:
                raise InvalidRequest(
                    f"max_batch_size must stay 0: the model has no batch dimension (max_batch_size 0 in its "
                    f"config), got {value}"
                )
            if engine_limit and not 1 <= value <= engine_limit:
                raise InvalidRequest(
                    f"max_batch_size must be in 1..{engine_limit} (the model's limit), got {value}"
                )
            changes["max_batch_size"] = value
        elif path == "max_queue_delay_us":
            changes["max_queue_delay"] = value / 1e6
        elif path == "priority_aging_us":
            changes["priority_aging"] = value / 1e6 if value else math.inf
        elif path == "default_timeout_us":
            queue_changes["default_timeout"] = value / 1e6 if value else math.inf
        elif path == "max_queue_size":
            queue_changes["max_queue_size"] = value
        else:
            changes[path] = value
    if queue_changes:
        changes["default_queue"] = dataclasses.replace(policy.default_queue, **queue_changes)
    try:
        return dataclasses.replace(policy, **changes)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def get_policy(registry: ModelRegistry, request: pb.GetPolicyRequest) -> pb.BatchingPolicy:
    """GetPolicy: the batching policy in force for ``request.model_name``.

    Raises:
        ModelNotFound (NOT_FOUND), ModelNotReady (UNAVAILABLE): see
            :meth:`~trtserve.engine.registry.ModelRegistry.get`.
    """
    return to_message(registry.get(request.model_name).dispatcher.policy)


def set_policy(registry: ModelRegistry, request: pb.SetPolicyRequest) -> pb.BatchingPolicy:
    """SetPolicy: change the fields named in ``request.update_mask`` for the next batch on.

    Raises:
        ModelNotFound, ModelNotReady: see :meth:`~trtserve.engine.registry.ModelRegistry.get`.
        InvalidRequest (INVALID_ARGUMENT): see :func:`apply_update`.
    """
    served = registry.get(request.model_name)
    dispatcher = served.dispatcher
    new = apply_update(
        dispatcher.policy, request.policy, list(request.update_mask.paths), served.spec.policy.max_batch_size
    )
    dispatcher.set_policy(new)
    return to_message(new)
