"""The admission rule, the one place both sides take it from: a request's priority level and
deadline (:func:`admit`), and the front end's early refusal from the model's queue as the engine
core last described it (:class:`QueueHint`, :func:`shed`).

A request's deadline is the earliest of its transport deadline (gRPC's, or the HTTP request
header's), its ``timeout`` parameter and its priority level's ``default_timeout``
(``allow_timeout_override`` lets ``timeout`` replace the default instead of only shortening
it, as in Triton's ModelQueuePolicy). Each side runs it once per request: a front end in
:func:`shed`, before it decodes a tensor (with the policy the hint carries), and the engine
core when it queues the rows (with the policy in force: ModelControl may change
``default_timeout`` at run time).

A hint's times are absolute (monotonic seconds) and lower bounds (see
:mod:`trtserve.batching.wait`, which computes them): rows that arrive later only add work,
so a hint stays a lower bound as it ages, and every answer brings a fresh one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtserve.config import BatchingPolicy
from trtserve.errors import DeadlineUnmeetable, InvalidRequest, Overloaded, QueueFull, TrtServeError


def admit(
    policy: BatchingPolicy, priority: int, timeout: float | None, transport_deadline: float, now: float
) -> tuple[int, float]:
    """The priority level and the absolute deadline of a request received at ``now``.

    Args:
        priority: the ``priority`` parameter: 1 is the most urgent; 0 (absent) means the
            model's ``default_priority_level``.
        timeout: the ``timeout`` parameter in seconds, or ``None`` when absent.
        transport_deadline: the transport's deadline, gRPC's or the HTTP header's (monotonic
            seconds; ``math.inf`` for none).
        now: monotonic seconds: when the front end read the request (the ``timeout`` and
            the model's default timeout count from it).

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
    return level, min(transport_deadline, now + budget if math.isfinite(budget) else math.inf)


@dataclass(frozen=True)
class QueueHint:
    """A model's queue as the engine core last saw it, for a front end to refuse requests
    before they cross (monotonic seconds throughout; see the module docstring).

    Attributes:
        min_run: least run time of a batch of one row (seconds).
        policy: the model's batching policy in force (priority levels, default timeouts:
            :func:`admit` resolves a request's deadline with it).
        free: when the first execution slot is free.
        points: sampled queue positions, in queue order: (priority, deadline, done_at) —
            the rows up to that entry, it included, are done at ``done_at`` at the earliest.
        full: (level, until): that level's queue is at ``max_queue_size`` until then at least
            (until a slot frees up, the dispatcher's next decision with a slot idle, or one of
            its entries expires: :func:`~trtserve.batching.wait.queue_hint`).
    """

    min_run: float
    policy: BatchingPolicy
    free: float
    points: tuple[tuple[int, float, float], ...] = ()
    full: tuple[tuple[int, float], ...] = ()

    def refusal(
        self, model: str, priority: int, timeout: float | None, transport_deadline: float, now: float, *,
        received: float | None = None,
    ) -> TrtServeError | None:
        """The error a front end answers without sending the request, or ``None`` to send it.

        Args:
            model: the model's name (for the message).
            priority, timeout: the request's parameters (timeout in seconds, or ``None``).
            transport_deadline: the transport's deadline (monotonic seconds, ``math.inf`` for
                none).
            now: monotonic seconds; received: when the front end read the request, which the
                ``timeout`` counts from (``None``: ``now``).

        Returns:
            DeadlineUnmeetable (DEADLINE_EXCEEDED), QueueFull or Overloaded (RESOURCE_EXHAUSTED);
            ``None`` when the hint gives no reason to refuse.

        Raises:
            InvalidRequest: ``priority`` outside the model's levels (as the engine core would).
        """
        base = now if received is None else received
        level, deadline = admit(self.policy, priority, timeout, transport_deadline, base)
        if deadline < now + self.min_run:
            return DeadlineUnmeetable(
                f"the request's deadline is {max(deadline - now, 0.0) * 1e3:.3f} ms away; a batch of one of model "
                f"'{model}' takes at least {self.min_run * 1e3:.3f} ms"
            )
        for full_level, until in self.full:
            if full_level == level and now < until:
                return QueueFull(f"the queue of model '{model}' is full at priority {level} "
                                 f"for at least {(until - now) * 1e3:.1f} ms more; retry later")
        done = self.free
        for p, d, done_at in self.points:
            if (p, d) > (level, deadline):
                break
            done = done_at
        if deadline < max(done, now) + self.min_run:
            return Overloaded(
                f"the model '{model}' is overloaded: predicted queue wait {max(done - now, 0.0) * 1e3:.1f} ms "
                f"exceeds the request's remaining {max(deadline - now, 0.0) * 1e3:.1f} ms deadline; "
                f"retry on another server or later"
            )
        return None


def shed(hint: QueueHint | None, model: str, priority: int, timeout: float | None, transport_deadline: float,
         now: float, *, received: float | None = None) -> TrtServeError | None:
    """A front end's refusal before it sends a request: :meth:`QueueHint.refusal`, or with no
    hint yet (no answer of this model has come back), DeadlineUnmeetable for a deadline
    already passed (the request was read too late), else ``None``.

    Raises:
        InvalidRequest: with a hint, ``priority`` outside the model's levels.
    """
    if hint is not None:
        return hint.refusal(model, priority, timeout, transport_deadline, now, received=received)
    base = now if received is None else received
    latest = min(transport_deadline, base + timeout) if timeout is not None else transport_deadline
    if latest <= now:
        return DeadlineUnmeetable(f"the request's deadline passed {(now - latest) * 1e3:.3f} ms before the server "
                                  f"could start on it (model '{model}')")
    return None


def deadline_of(remaining: float | None, now: float) -> float:
    """A call's time remaining (seconds, ``None`` for no deadline) as an absolute monotonic
    deadline (``math.inf`` for none). CLOCK_MONOTONIC is system-wide on Linux, so the engine
    core compares it with its own clock."""
    return math.inf if remaining is None else now + remaining


__all__ = ["QueueHint", "admit", "deadline_of", "shed"]
