"""A model's request queue: admission, ordering, and taking rows off the front.

A request reaches the dispatcher as one or more *segments*: dicts of engine-input name →
numpy array with the request's rows on axis 0 (a handler may fan one request out into several
segments whose non-batch dims differ). A :class:`QueueEntry` tracks how many of its rows are
still queued, which pieces are running, and the outputs gathered so far.

Invariant: :attr:`RequestQueue.entries` is sorted by (priority, deadline, arrival) and holds
only entries with rows still to run. Touched only from the event loop thread.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from trtserve.datatypes import Tensors
from trtserve.errors import QueueFull

_arrivals = count()


@dataclass(eq=False)
class QueueEntry:
    """One submitted request, as the dispatcher sees it.

    Attributes:
        segments: the request's engine rows (see :data:`~trtserve.datatypes.Tensors`).
        level: the priority level it was admitted at (its queue policy's key).
        priority: the level it is ordered by: 1 is the most urgent; ties break on deadline,
            then arrival. Starts as ``level``; ``TimeoutAction.DELAY`` moves it last.
        deadline: monotonic seconds by which the answer must be ready; ``math.inf`` for none.
        arrival: monotonic seconds when it was queued.
        future: resolves to one output :data:`~trtserve.datatypes.Tensors` per input segment, in
            order.
        rows: rows not yet taken into a batch.
        running: pieces of this entry now inside a running batch.
        seg_index, seg_offset: where the next untaken row is.
        seq: arrival sequence number, the last tie-break of the queue order.
        chunks: per segment, the output pieces gathered so far, each with its first row
            (in completion order: the dispatcher puts them in row order at the end).
        length: elements per row of its largest input (after the batch axis): what padding
            to a batch's longest row is measured in.
    """

    segments: list[Tensors]
    level: int
    priority: int
    deadline: float
    arrival: float
    future: asyncio.Future[list[Tensors]]
    rows: int = 0
    running: int = 0
    seg_index: int = 0
    seg_offset: int = 0
    seq: int = field(default_factory=lambda: next(_arrivals))
    chunks: list[list[tuple[int, Tensors]]] = field(default_factory=list)
    length: int = 1

    def __post_init__(self) -> None:
        self.rows = sum(_rows(s) for s in self.segments)
        self.chunks = [[] for _ in self.segments]
        self.length = max(
            (math.prod(a.shape[1:]) for s in self.segments for a in s.values()), default=1
        ) or 1

    @property
    def key(self) -> tuple[int, float, int]:
        """Queue order: (priority, deadline, arrival sequence)."""
        return (self.priority, self.deadline, self.seq)

    @property
    def done(self) -> bool:
        """Whether the caller has its answer (result, error or cancellation)."""
        return self.future.done()


def _rows(segment: Tensors) -> int:
    return len(next(iter(segment.values())))


@dataclass(frozen=True)
class Piece:
    """Rows ``start:stop`` of segment ``seg`` of ``entry``, taken into one batch."""

    entry: QueueEntry
    seg: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """Rows in the piece (``stop - start``)."""
        return self.stop - self.start

    def inputs(self) -> Tensors:
        """The piece's input arrays (views, no copy)."""
        segment = self.entry.segments[self.seg]
        if self.start == 0 and self.stop == _rows(segment):
            return segment
        return {name: arr[self.start : self.stop] for name, arr in segment.items()}


class RequestQueue:
    """Queued entries of one model, in (priority, deadline, arrival) order."""

    def __init__(self) -> None:
        self.entries: list[QueueEntry] = []
        self.queued_rows = 0
        self.per_level: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, entry: QueueEntry, max_size: int = 0) -> None:
        """Queue ``entry``. Returns at once; never blocks.

        Args:
            max_size: most entries of ``entry.level`` queued at once; 0 for unbounded.

        Raises:
            QueueFull: ``max_size`` entries of that level are queued already (nothing was queued).
        """
        if max_size and self.per_level[entry.level] >= max_size:
            raise QueueFull(
                f"the queue is full ({self.per_level[entry.level]} requests queued at priority "
                f"{entry.level}, max_queue_size {max_size}); retry later"
            )
        self._insert(entry)

    def remove(self, entry: QueueEntry) -> bool:
        """Take ``entry`` out of the queue (cancelled, expired or failed). False if absent."""
        try:
            self.entries.remove(entry)
        except ValueError:
            return False
        self.queued_rows -= entry.rows
        self.per_level[entry.level] -= 1
        return True

    def reprioritize(self, entry: QueueEntry, priority: int) -> None:
        """Move a queued entry to ``priority`` with no deadline (``TimeoutAction.DELAY``)."""
        self.remove(entry)
        entry.priority = priority
        entry.deadline = math.inf
        self._insert(entry)  # admitted before: max_size does not apply again

    def _insert(self, entry: QueueEntry) -> None:
        bisect.insort(self.entries, entry, key=lambda e: e.key)
        self.queued_rows += entry.rows
        self.per_level[entry.level] += 1

    def take(self, selection: Sequence[tuple[QueueEntry, int]]) -> list[Piece]:
        """Take the given number of rows of each selected ``(entry, rows)`` (in that order) into
        a batch, each entry's from its next untaken row.

        An entry whose rows are all taken leaves the queue; a partly taken one stays where it
        is with its remaining rows (a request larger than one batch is split this way).
        """
        pieces: list[Piece] = []
        for entry, rows in selection:
            while rows > 0 and entry.rows > 0:
                segment = entry.segments[entry.seg_index]
                available = _rows(segment) - entry.seg_offset
                n = min(available, rows)
                pieces.append(Piece(entry, entry.seg_index, entry.seg_offset, entry.seg_offset + n))
                entry.running += 1
                entry.rows -= n
                self.queued_rows -= n
                rows -= n
                if n == available:
                    entry.seg_index += 1
                    entry.seg_offset = 0
                else:
                    entry.seg_offset += n
            if entry.rows == 0:
                self.entries.remove(entry)
                self.per_level[entry.level] -= 1
        return pieces
