"""The admission rule: a request's priority level and deadline, from what it asked for and
the model's policy (``../shared/DESIGN.md``, principle 3).

A request's deadline is the earliest of its gRPC deadline, its ``timeout`` parameter and its
priority level's ``default_timeout`` (``allow_timeout_override`` lets ``timeout`` replace the
default instead of only shortening it, as in Triton's ModelQueuePolicy). The engine core
applies it with the policy in force (ModelControl may change ``default_timeout`` at run time);
the front end only parses the parameters.
"""

from __future__ import annotations

import math

from ..config import BatchingPolicy
from ..errors import InvalidRequest


def admit(policy: BatchingPolicy, priority: int, timeout: float | None, grpc_deadline: float, now: float) -> tuple[int, float]:
    """The priority level and the absolute deadline of a request arriving at ``now``.

    Args:
        priority: the ``priority`` parameter: 1 is the most urgent; 0 (absent) means the
            model's ``default_priority_level``.
        timeout: the ``timeout`` parameter in seconds, or ``None`` when absent.
        grpc_deadline: the call's gRPC deadline (monotonic seconds; ``math.inf`` for none).
        now: monotonic seconds.

    Returns:
        (level, deadline): the level the request is queued at, and monotonic seconds
        (``math.inf`` for no deadline).

    Raises:
        InvalidRequest (INVALID_ARGUMENT): ``priority`` outside ``1..priority_levels``.
    """
    if priority < 0 or (policy.priority_levels and priority > policy.priority_levels):
        raise InvalidRequest(
            f"parameter 'priority' is {priority}; this model has priority levels 1..{policy.priority_levels}"
        )
    level = policy.level(priority)
    budget = policy.queue_policy(level).timeout_for(timeout)
    return level, min(grpc_deadline, now + budget if math.isfinite(budget) else math.inf)
