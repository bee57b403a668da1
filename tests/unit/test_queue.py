"""A model's request queue (batching/queue.py ``RequestQueue``): kept in (priority, deadline,
arrival) order, counted per priority level, bounded by ``max_queue_size`` per level, emptied of
cancelled entries, and taken from row by row, so that a request larger than a batch is split
across batches in row order. Real entries on the running loop's futures; no dispatcher."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from trtserve.batching.queue import Piece, QueueEntry, RequestQueue
from trtserve.errors import QueueFull


def entry(first: float, rows: int = 1, *, level: int = 1, deadline: float = math.inf, arrival: float = 0.0,
          width: int = 2) -> QueueEntry:
    """An entry of ``rows`` rows whose values count up from ``first`` (row ``i`` holds ``first + i``)."""
    x = (first + np.arange(rows, dtype=np.float32))[:, None].repeat(width, axis=1)
    return QueueEntry([{"INPUT0": x}], level=level, priority=level, deadline=deadline, arrival=arrival,
                      future=asyncio.get_running_loop().create_future())


def firsts(queue: RequestQueue) -> list[float]:
    """The first value of each queued entry, in queue order."""
    return [float(e.segments[0]["INPUT0"][0, 0]) for e in queue.entries]


def rows_of(pieces: list[Piece]) -> list[list[float]]:
    return [p.inputs()["INPUT0"][:, 0].tolist() for p in pieces]


async def test_entries_are_ordered_by_priority_then_deadline_then_arrival():
    q = RequestQueue()
    q.push(entry(1, level=2, deadline=5.0))
    q.push(entry(2, level=1, deadline=9.0))
    q.push(entry(3, level=2, deadline=3.0))
    q.push(entry(4, level=1))  # no deadline: behind every deadline of its level
    q.push(entry(5, level=1, deadline=9.0))  # same level and deadline as 2: after it, by arrival
    q.push(entry(6, level=2, deadline=3.0))
    assert firsts(q) == [2, 5, 4, 3, 6, 1]


async def test_queued_rows_and_per_level_counts_follow_every_push_take_and_remove():
    q = RequestQueue()
    a, b, c = entry(1, rows=3, level=1), entry(10, rows=2, level=2), entry(20, rows=4, level=2)
    for e in (a, b, c):
        q.push(e)
    assert (len(q), q.queued_rows, q.per_level[1], q.per_level[2]) == (3, 9, 1, 2)
    q.take([(c, 1)])  # c keeps 3 rows queued, and its place
    assert (len(q), q.queued_rows, q.per_level[2]) == (3, 8, 2)
    q.take([(a, 3)])  # all of a: it leaves the queue
    assert (len(q), q.queued_rows, q.per_level[1], q.per_level[2]) == (2, 5, 0, 2)
    assert q.remove(b)
    assert (len(q), q.queued_rows, q.per_level[2]) == (1, 3, 1)
    assert q.entries == [c]


async def test_a_full_level_refuses_with_queue_full_and_queues_nothing():
    q = RequestQueue()
    q.push(entry(1, level=1), max_size=2)
    q.push(entry(2, level=1), max_size=2)
    with pytest.raises(QueueFull, match=r"the queue is full \(2 requests queued at priority 1, max_queue_size 2\)"):
        q.push(entry(3, rows=5, level=1), max_size=2)
    assert (len(q), q.queued_rows, q.per_level[1]) == (2, 2, 2) and firsts(q) == [1, 2]
    q.push(entry(4, level=2), max_size=2)  # the bound is per level: level 2 still has room
    q.push(entry(5, level=1))  # 0: unbounded
    assert firsts(q) == [1, 2, 5, 4]


async def test_a_cancelled_entry_leaves_the_queue_once_and_its_rows_are_no_longer_counted():
    q = RequestQueue()
    keep, cancelled = entry(1, rows=2), entry(2, rows=6)
    q.push(keep)
    q.push(cancelled)
    cancelled.future.cancel()
    assert cancelled.done
    assert q.remove(cancelled)
    assert not q.remove(cancelled)  # already gone: nothing is subtracted twice
    assert (q.entries, q.queued_rows, q.per_level[1]) == ([keep], 2, 1)
    q.push(entry(3), max_size=2)  # its place at the level is free again


async def test_a_request_larger_than_a_batch_is_taken_in_row_order_across_batches():
    q = RequestQueue()
    big, after = entry(0, rows=10), entry(100, rows=1)
    q.push(big)
    q.push(after)
    batches = [q.take([(big, 4)]), q.take([(big, 4)]), q.take([(big, 4), (after, 1)])]
    assert [[(p.start, p.stop) for p in b] for b in batches] == [[(0, 4)], [(4, 8)], [(8, 10), (0, 1)]]
    assert rows_of(batches[0]) == [[0, 1, 2, 3]] and rows_of(batches[1]) == [[4, 5, 6, 7]]
    assert rows_of(batches[2]) == [[8, 9], [100]]  # the last 2 of big, then the next request fills the batch
    assert big.running == 3 and big.rows == 0 and len(q) == 0 and q.queued_rows == 0


async def test_a_partly_taken_request_keeps_its_place_at_the_front():
    q = RequestQueue()
    big = entry(0, rows=5, level=1)
    q.push(big)
    q.push(entry(50, rows=1, level=2))
    q.take([(big, 2)])
    assert q.entries[0] is big and big.rows == 3
    q.push(entry(60, rows=1, level=1, deadline=1.0))  # more urgent at the same level: goes ahead of it
    assert firsts(q) == [60, 0, 50]


async def test_taking_crosses_segment_boundaries_and_pieces_are_views():
    loop = asyncio.get_running_loop()
    s0 = {"INPUT0": np.arange(6, dtype=np.float32).reshape(3, 2)}
    s1 = {"INPUT0": np.arange(100, 104, dtype=np.float32).reshape(2, 2)}
    e = QueueEntry([s0, s1], level=1, priority=1, deadline=math.inf, arrival=0.0, future=loop.create_future())
    assert e.rows == 5 and e.length == 2
    q = RequestQueue()
    q.push(e)
    first = q.take([(e, 4)])
    assert [(p.seg, p.start, p.stop, p.rows) for p in first] == [(0, 0, 3, 3), (1, 0, 1, 1)]
    assert first[0].inputs() is s0  # a whole segment goes as it is
    assert np.shares_memory(first[1].inputs()["INPUT0"], s1["INPUT0"])  # a part is a view, not a copy
    (last,) = q.take([(e, 4)])  # only 1 row is left
    assert (last.seg, last.start, last.stop) == (1, 1, 2) and len(q) == 0


async def test_an_entrys_length_is_its_widest_row_for_padding():
    loop = asyncio.get_running_loop()
    segment = {"A": np.zeros((2, 3, 4), np.float32), "B": np.zeros((2, 5), np.int64)}
    assert QueueEntry([segment], 1, 1, math.inf, 0.0, loop.create_future()).length == 12
    assert QueueEntry([{"A": np.zeros((3,), np.float32)}], 1, 1, math.inf, 0.0, loop.create_future()).length == 1


async def test_reprioritize_moves_an_entry_behind_everything_and_drops_its_deadline():
    q = RequestQueue()
    late = entry(1, level=1, deadline=2.0)
    q.push(late, max_size=2)
    q.push(entry(2, level=1, deadline=5.0), max_size=2)
    q.push(entry(3, level=2))
    q.reprioritize(late, 3)  # a full level does not refuse an entry it already holds
    assert firsts(q) == [2, 3, 1]
    assert (late.priority, late.level, late.deadline) == (3, 1, math.inf)
    assert (q.per_level[1], q.per_level[2], q.queued_rows) == (2, 1, 3)
