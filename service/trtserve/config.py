"""The batching policy of one model, validated at construction.

Built by :mod:`trtserve.repository` from a model's ``config.pbtxt`` (``max_batch_size``,
``dynamic_batching`` with its ``default_queue_policy`` and ``priority_queue_policy``, and a
few ``parameters``); field names follow Triton's so that a Triton config means the same thing
here. All times are seconds. Changed at run time only by replacing the whole object
(:meth:`trtserve.batching.dispatcher.Dispatcher.set_policy`), which takes effect for the next
batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class TimeoutAction(Enum):
    """What happens to a queued request that can no longer meet its deadline."""

    REJECT = "REJECT"
    """Answer DEADLINE_EXCEEDED without running it (the default)."""
    DELAY = "DELAY"
    """Keep it queued behind every other request; it runs when nothing else waits."""


@dataclass(frozen=True)
class QueuePolicy:
    """Admission and timeouts for the requests of one priority level (Triton's ModelQueuePolicy).

    Attributes:
        timeout_action: what to do with a queued request whose deadline cannot be met.
        default_timeout: the deadline, in seconds after arrival, of a request that gives none;
            ``math.inf`` for none. (``default_timeout_microseconds`` / 1e6, 0 meaning none.)
        allow_timeout_override: whether a request's own ``timeout`` parameter replaces
            ``default_timeout`` (True), or may only shorten it (False, Triton's default). A
            request's gRPC deadline always applies as well.
        max_queue_size: most requests of this level queued at once; one more is refused with
            :class:`~trtserve.errors.QueueFull`. 0 means unbounded (Triton's meaning).
    """

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout: float = math.inf
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        if not self.default_timeout > 0:
            raise ValueError(f"default_timeout must be > 0 seconds, got {self.default_timeout}")
        if self.max_queue_size < 0:
            raise ValueError(f"max_queue_size must be >= 0, got {self.max_queue_size}")

    def timeout_for(self, requested: float | None) -> float:
        """Seconds from arrival to deadline for a request whose ``timeout`` parameter is
        ``requested`` seconds (``None`` when absent); ``math.inf`` for no deadline."""
        if requested is None:
            return self.default_timeout
        if self.allow_timeout_override:
            return requested
        return min(requested, self.default_timeout)


@dataclass(frozen=True)
class BatchingPolicy:
    """How a model's dispatcher forms batches.

    Attributes:
        max_batch_size: rows per engine run, at most. 0 means the model has no batch
            dimension: each request runs alone, as given. (Triton's ``max_batch_size``.)
        max_queue_delay: the longest a row may wait for more rows to join its batch while a
            slot is free, in seconds (``dynamic_batching.max_queue_delay_microseconds``/1e6).
            With ``adaptive`` it is only an upper bound (0: no bound but the deadlines); with
            the fixed-timer policy, 0 means never wait.
        preferred_batch_sizes: batch sizes the engine runs best at, ascending. When a wait is
            allowed, reaching the largest of them dispatches at once.
        priority_levels: number of priority levels; requests may ask for 1..priority_levels
            (1 is the most urgent). 0 means priorities are not configured.
        default_priority: the level of a request that asks for none (0 in the request).
        default_queue: the queue policy of every level without its own.
        priority_queues: level → its own queue policy (``priority_queue_policy``).
        priority_aging: seconds after which a queued request is served ahead of every
            priority level (in arrival order among such requests), so that low priorities
            cannot starve under sustained high-priority load. ``math.inf`` disables aging.
        adaptive: the adaptive policy (default): with a free slot, wait for more rows only
            while the engine, at the batch size queued now, runs fewer rows per second than
            arrive (measured arrival rate), or the host thread's per-batch work at that size
            would push it past its target share (:data:`trtserve.batching.policy.HOST_TARGET`),
            and only as long as the deadlines allow. False: Triton's fixed timer, waiting up to
            ``max_queue_delay`` for a fuller batch.
        adaptive_batch_size: let the dispatcher cap batches at the knee of the measured
            throughput curve (at most ``max_batch_size``) instead of always up to
            ``max_batch_size``; the cap follows drift in measured run times.
        latency_budget: with ``adaptive_batch_size``, the cap also keeps the predicted run
            time of a batch within this many seconds (``math.inf``: no budget).
        length_bucketing: when more rows wait than one batch holds, fill the batch with the
            rows closest in length to the most urgent one (less padding); rows near their
            deadline are never passed over.
        pad_value: the value that pads a variable-length dimension up to the longest row
            of the batch.
        split_oversized: whether a request with more rows than ``max_batch_size`` is split
            across batches and gathered back (True) or refused with INVALID_ARGUMENT at
            admission, as Triton does (False). Config parameter ``split_oversized_requests``.
    """

    max_batch_size: int = 0
    max_queue_delay: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 0
    default_priority: int = 0
    default_queue: QueuePolicy = QueuePolicy()
    priority_queues: Mapping[int, QueuePolicy] = field(default_factory=dict)
    priority_aging: float = 1.0
    adaptive: bool = True
    adaptive_batch_size: bool = False
    latency_budget: float = math.inf
    length_bucketing: bool = True
    pad_value: float = 0.0
    split_oversized: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if not self.max_queue_delay >= 0:
            raise ValueError(f"max_queue_delay must be >= 0 seconds, got {self.max_queue_delay}")
        if list(self.preferred_batch_sizes) != sorted(set(self.preferred_batch_sizes)):
            raise ValueError(
                f"preferred_batch_size must be distinct and ascending, got {list(self.preferred_batch_sizes)}"
            )
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= max(self.max_batch_size, 1):
                raise ValueError(
                    f"preferred_batch_size {size} is outside 1..max_batch_size ({self.max_batch_size})"
                )
        if self.priority_levels < 0:
            raise ValueError(f"priority_levels must be >= 0, got {self.priority_levels}")
        if self.priority_levels and not 1 <= self.default_priority <= self.priority_levels:
            raise ValueError(
                f"default_priority_level must be in 1..{self.priority_levels}, got {self.default_priority}"
            )
        for level in self.priority_queues:
            if not 1 <= level <= max(self.priority_levels, 1):
                raise ValueError(f"priority_queue_policy level {level} is outside 1..{self.priority_levels}")
        if not self.priority_aging > 0:
            raise ValueError(f"priority_aging must be > 0 seconds, got {self.priority_aging}")
        if not self.latency_budget > 0:
            raise ValueError(f"latency_budget must be > 0 seconds, got {self.latency_budget}")

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of priority ``level``."""
        return self.priority_queues.get(level, self.default_queue)

    def level(self, requested: int) -> int:
        """The priority level of a request that asked for ``requested`` (0: the default)."""
        return requested or self.default_priority

    @property
    def rows_per_batch(self) -> int:
        """Rows one engine run may take: ``max_batch_size``, or 1 for a model without a batch dimension."""
        return max(self.max_batch_size, 1)

    @property
    def lowest_priority(self) -> int:
        """The level behind every configured one, where ``TimeoutAction.DELAY`` moves expired requests."""
        return max(self.priority_levels, self.default_priority) + 1
