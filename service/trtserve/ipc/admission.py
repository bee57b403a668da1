"""The admission rule, the one place both sides take it from: a request's timing as a front end
read it (:class:`Ask`), its priority level and deadline (:func:`admit`), and the front end's early
refusal from the model's queue as the engine core last described it (:class:`QueueHint`,
:func:`shed`).

A request's deadline is the earliest of its transport deadline (gRPC's, or the HTTP request
header's), its ``timeout`` parameter and its priority level's ``default_timeout``
(``allow_timeout_override`` lets ``timeout`` replace the default instead of only shortening
it, as in Triton's ModelQueuePolicy). Each side runs it once per request: a front end in
:func:`shed`, before it decodes a tensor (with the policy the hint carries), and the engine
core when it queues the rows (with the policy in force: ModelControl may change
``default_timeout`` at run time). After :func:`admit`, "deadline" alone means that resolved
deadline; the transport's is always called ``transport_deadline``.

A hint's times are absolute (monotonic seconds) and lower bounds (see
:mod:`trtserve.batching.wait`, which computes them): rows that arrive later only add work,
so a hint stays a lower bound as it ages, and every answer brings a fresh one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from trtserve.config import BatchingPolicy
from trtserve.errors import DeadlineUnmeetable, InvalidRequest, Overloaded, QueueFull, TrtServeError


class Ask(NamedTuple):
    """A request's timing as the front end read it: built once, where a door reads the request,
    and carried unchanged through the contract (:meth:`Engine.infer <trtserve.ipc.engine.Engine.infer>`,
    :class:`~trtserve.ipc.messages.Infer`) to the one place that resolves it (:func:`admit`).

    Attributes:
        priority: the ``priority`` parameter: 1 is the most urgent; 0 (absent) means the model's
            ``default_priority_level``.
        timeout: the ``timeout`` parameter in seconds (the wire carries microseconds), or
            ``None`` when absent.
        transport_deadline: the transport's deadline, gRPC's or the HTTP request header's
            (monotonic seconds; ``math.inf`` for none).
        received: when the front end read the request (monotonic seconds; CLOCK_MONOTONIC is
            system-wide on Linux, so the engine core compares it with its own clock): the
            ``timeout`` and the model's default timeout count from it. ``None``: from the
            request's admission where it is admitted (a tool calling a model in process).
    """

    priority: int = 0
    timeout: float | None = None
    transport_deadline: float = math.inf
    received: float | None = None


UNTIMED = Ask()
"""The timing of a call a tool makes in process (``trtserve check``, the Ray bulk actors): the
model's default priority, no timeout, no transport deadline; only the model's default timeout
applies, counted from the request's admission."""


def admit(policy: BatchingPolicy, ask: Ask, now: float) -> tuple[int, float]:
    """The priority level and the deadline of a request, resolved once.

    Args:
        policy: the model's batching policy (priority levels, default timeouts).
        ask: the request's timing; its ``timeout`` and the level's default timeout count from
            ``ask.received``, or from ``now`` when that is ``None``.
        now: monotonic seconds.

    Returns:
        (level, deadline): the level the request is queued at, and monotonic seconds
        (``math.inf`` for no deadline).

    Raises:
        InvalidRequest (INVALID_ARGUMENT): ``priority`` outside ``1..priority_levels``.
    """
    priority = ask.priority
    if priority < 0 or (policy.priority_levels and priority > policy.priority_levels):
        raise InvalidRequest(
            f"parameter 'priority' is {priority}; this model has priority levels 1..{policy.priority_levels}"
        )
    level = policy.level(priority)
    budget = policy.queue_policy(level).timeout_for(ask.timeout)
    if not math.isfinite(budget):
        return level, ask.transport_deadline
    return level, min(ask.transport_deadline, (now if ask.received is None else ask.received) + budget)


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
        cap: the batch cap in force (rows; :mod:`trtserve.batching.cap`): what one batch of
            the model takes now, below ``policy.max_batch_size``.
    """

    min_run: float
    policy: BatchingPolicy
    free: float
    points: tuple[tuple[int, float, float], ...] = ()
    full: tuple[tuple[int, float], ...] = ()
    cap: int = 1

    def refusal(self, model: str, ask: Ask, now: float) -> TrtServeError | None:
        """The error a front end answers without sending the request, or ``None`` to send it.

        Args:
            model: the model's name (for the message).
            ask: the request's timing (:func:`admit` resolves its level and deadline).
            now: monotonic seconds.

        Returns:
            DeadlineUnmeetable (DEADLINE_EXCEEDED), QueueFull or Overloaded (RESOURCE_EXHAUSTED);
            ``None`` when the hint gives no reason to refuse.

        Raises:
            InvalidRequest: ``priority`` outside the model's levels (as the engine core would).
        """
        level, deadline = admit(self.policy, ask, now)
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


def shed(hint: QueueHint | None, model: str, ask: Ask, now: float) -> TrtServeError | None:
    """A front end's refusal before it sends a request: :meth:`QueueHint.refusal`, or with no
    hint yet (no answer of this model has come back), DeadlineUnmeetable for a deadline
    already passed (the request was read too late), else ``None``.

    Raises:
        InvalidRequest: with a hint, ``priority`` outside the model's levels.
    """
    if hint is not None:
        return hint.refusal(model, ask, now)
    latest = ask.transport_deadline
    if ask.timeout is not None:
        latest = min(latest, (now if ask.received is None else ask.received) + ask.timeout)
    if latest <= now:
        return DeadlineUnmeetable(f"the request's deadline passed {(now - latest) * 1e3:.3f} ms before the server "
                                  f"could start on it (model '{model}')")
    return None


def transport_deadline_of(remaining: float | None, now: float) -> float:
    """A call's time remaining (seconds, ``None`` for no deadline) as an absolute monotonic
    deadline (``math.inf`` for none). CLOCK_MONOTONIC is system-wide on Linux, so the engine
    core compares it with its own clock."""
    return math.inf if remaining is None else now + remaining


__all__ = ["UNTIMED", "Ask", "QueueHint", "admit", "transport_deadline_of", "shed"]
