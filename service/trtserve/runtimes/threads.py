"""Execution-slot threads at a lower OS priority than the event loops.

On a box with few cores the engine's compute threads and the event loops that read, refuse and
answer calls share the cores. Under overload a loop that waits behind compute reads each call
late: measured on 2 cores, minilm at 3x its capacity, calls reached trtserve's handler with a
median 4.6 ms left of a 29 ms deadline, so nearly every one was refused as unmeetable while the
engine idled. A slot thread started here runs at ``nice`` above the process's (Linux nice values
are per thread, setpriority(2) on the thread id), and the threads it creates inherit that value
(clone(2) copies it): ONNX Runtime's intra-op pool, created with the session on that thread,
included. The loops then run first whenever both want a core, and compute takes what is left.
Raising a thread's nice value needs no privilege.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from trtserve.datatypes import Tensors
from trtserve.runtimes.base import Batch

MAX_NICE = 19
"""The largest nice value Linux gives a thread (the lowest priority)."""
DEFAULT_COMPUTE_NICE = 10
"""``trtserve serve --compute-nice``'s default."""


def _lower_this_thread(nice: int) -> None:
    if nice and hasattr(os, "setpriority"):
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(current + nice, MAX_NICE))


def slot_thread(name: str, nice: int) -> ThreadPoolExecutor:
    """One execution slot's thread, at ``nice`` (0..19) above the process's priority: work
    submitted to it, and every thread that work starts, runs at the lower priority.

    Raises:
        ValueError: ``nice`` outside 0..19.
    """
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"a compute nice value must be between 0 and {MAX_NICE}, not {nice}")
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=_lower_this_thread, initargs=(nice,))


async def on_slot(thread: ThreadPoolExecutor, run: Callable[[int, Batch], Tensors], slot: int, batch: Batch) -> Tensors:
    """``run(slot, batch)`` on the slot's ``thread``, without blocking the event loop, once
    :meth:`Batch.begin <trtserve.runtimes.base.Batch.begin>` lets it; the run's start and end on
    that thread (:func:`time.monotonic` seconds) are appended to ``batch.ran``.

    Raises:
        BatchWithdrawn: the batch was withdrawn before its turn on the thread (not run).
        Whatever ``run`` raises.
    """
    return await asyncio.get_running_loop().run_in_executor(thread, _timed, run, slot, batch)


def _timed(run: Callable[[int, Batch], Tensors], slot: int, batch: Batch) -> Tensors:
    batch.begin()
    batch.ran.append(time.monotonic())
    try:
        return run(slot, batch)
    finally:
        batch.ran.append(time.monotonic())


__all__ = ["DEFAULT_COMPUTE_NICE", "MAX_NICE", "on_slot", "slot_thread"]
