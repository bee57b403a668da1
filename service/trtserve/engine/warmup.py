"""The warm-up at load, and the batch size it chooses where the config leaves it to the server.

Every batch size of the warm-up (1, 2, 4, ... and the limit) runs at least twice through the
model's own dispatcher: the first run pays the first-run costs of its shape (allocations, kernel
selection, a cold cache) and does not enter the latency model; the others seed the latency model
the dispatcher starts from.

**Where a live batch cap starts** (:attr:`~trtserve.spec.ModelSpec.choose_batch_size`, or
``adaptive_batch_size``; the cap then moves while serving, :mod:`trtserve.batching.cap`): the sizes double
from 1 until throughput stops growing: until :data:`SEARCH_PATIENCE` sizes in a row whose rows/s
is not more than :data:`KNEE_TOLERANCE` above the best smaller size (among sizes whose batch takes at least
:data:`SEARCH_SAMPLE_S`: the cheap sizes are always measured, so one slow run of one of them
cannot end the search), or whose batch takes longer than the ``latency_budget_us`` parameter or
:data:`SEARCH_RUN_LIMIT_S` (or would, at the last size's time per row), or the model file's limit
(:func:`~trtserve.runtimes.base.batch_limit`;
:data:`SEARCH_CEILING` where the file sets none). Each size's time is its fastest run (noise from
elsewhere on the machine only adds time) over its runs in the search and one more run of every
size measured after it; a cheap size runs again while its runs add up to less than
:data:`SEARCH_SAMPLE_S` (at most :data:`SEARCH_MAX_RUNS` runs). The choice is the knee of that curve by the rule of
``adaptive_batch_size`` and ``trtserve profile`` (:func:`~trtserve.batching.policy.knee`):
the smallest measured size within :data:`KNEE_TOLERANCE` of the best rows/s, but not below
:data:`CHOICE_FLOOR` rows where the file and the latency budget allow that many
(:func:`choose`). A load while other work holds the cores measures every size slow and
unevenly: on 2 busy cores minilm's search once chose 1 row where the quiet machine's knee is
16-32 (the live cap then has to climb back while serving). Against a fixed
``max_batch_size`` the search costs a third run of every size and the sizes past the knee up to
the first that does not beat it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from trtserve.batching.dispatcher import Dispatcher
from trtserve.batching.latency import LatencyModel
from trtserve.batching.policy import knee
from trtserve.datatypes import Tensors

WARMUP_LENGTH = 16
"""Size of every variable (-1) dimension in the warm-up batches (config parameter ``warmup_length``)."""
KNEE_TOLERANCE = 0.05
"""A larger batch counts as faster only above this share more rows/s (the knee rule's tolerance)."""
SEARCH_CEILING = 1024
"""The most rows the choice searches where the model file does not bound the batch axis."""
SEARCH_RUN_LIMIT_S = 0.5
"""The load-time bound (seconds): the search stops after a batch that ran longer than this, and
does not start a size whose batch would take longer at the last size's time per row (run time
grows with rows no faster than in proportion: the prediction is high, never low)."""
SEARCH_SAMPLE_S = 0.05
"""While searching, a size runs again while its runs add up to less than this (seconds; at most
:data:`SEARCH_MAX_RUNS` runs), and a batch faster than this never ends the search: one slow run
of a cheap size must not stop it short of the knee."""
SEARCH_MAX_RUNS = 8
SEARCH_PATIENCE = 2
"""The search stops after this many sizes in a row that do not beat the best smaller one."""
CHOICE_FLOOR = 4
"""The least batch size chosen where the file and the latency budget allow it: Triton's
``default-max-batch-size`` (the cap its auto-complete gives a model that can batch)."""


def batch_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` (at least ``[1]``)."""
    sizes = [1]
    while sizes[-1] * 2 <= limit:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] < limit:
        sizes.append(limit)
    return sizes


def search_limit(file_limit: int | None) -> int:
    """The largest batch the choice may measure: the model file's limit, else :data:`SEARCH_CEILING`."""
    return SEARCH_CEILING if file_limit is None else max(min(file_limit, SEARCH_CEILING), 1)


async def warm_up(
    dispatcher: Dispatcher, feed: Callable[[int], Tensors], limit: int, *, search: bool = False
) -> dict[int, float]:
    """Run the warm-up batches of 1 .. ``limit`` rows (``feed(rows)``: the engine inputs of one
    batch) and leave the dispatcher with the latency model of their measured runs.

    With ``search``, stop once throughput stops growing (see the module docstring) instead of
    running every size up to ``limit``, and sample the cheap sizes more.

    Returns:
        Batch size → its fastest run, seconds (every size run).

    Raises:
        TrtServeError: a warm-up batch failed (the model then does not load, with that reason).
    """
    # Each warm-up batch goes at once: under the model's fixed queue delay every size below the
    # cap would wait that long (a 6 s window made a load take 48 s).
    policy = dispatcher.policy
    dispatcher.set_policy(dataclasses.replace(policy, max_queue_delay=0.0, adaptive=False))
    try:
        clock = dispatcher.clock
        seeded = LatencyModel()
        budget = min(dispatcher.policy.latency_budget, SEARCH_RUN_LIMIT_S)
        fastest: dict[int, float] = {}
        best = 0.0
        misses = 0
        for rows in batch_sizes(limit):
            if search and fastest:
                last = max(fastest)
                if fastest[last] * rows / last > SEARCH_RUN_LIMIT_S:
                    break
            runs: list[float] = []
            while len(runs) < 2 or (search and len(runs) < SEARCH_MAX_RUNS and sum(runs) < SEARCH_SAMPLE_S):
                # The first run of a shape goes to a throwaway model: it pays the first-run costs.
                dispatcher.latency = seeded if runs else LatencyModel()
                start = clock.now()
                await dispatcher.submit([feed(rows)])
                runs.append(clock.now() - start)
            dispatcher.latency = seeded
            seconds = fastest[rows] = min(runs)
            if search:
                rate = rows / seconds if seconds > 0 else math.inf
                if seconds > budget:
                    break
                if rate <= (1 + KNEE_TOLERANCE) * best and seconds >= SEARCH_SAMPLE_S:
                    misses += 1
                    if misses >= SEARCH_PATIENCE:
                        break
                else:
                    misses = 0
                best = max(best, rate)
        if search:
            # Once more, largest first: a busy moment elsewhere on the machine during one size's
            # runs is unlikely to hit it again.
            for rows in sorted(fastest, reverse=True):
                start = clock.now()
                await dispatcher.submit([feed(rows)])
                fastest[rows] = min(fastest[rows], clock.now() - start)
        return fastest
    finally:
        dispatcher.set_policy(policy)


def choose(curve: dict[int, float], budget: float) -> int | None:
    """The batch cap to start from, chosen from the warm-up's ``curve`` (batch size → fastest run,
    seconds): its knee (:func:`~trtserve.batching.policy.knee`, within ``budget`` seconds a
    batch), raised to :data:`CHOICE_FLOOR` where a measured size of at least that many rows fits
    ``budget`` (the floor is then the smallest such size); ``None`` for a curve with no positive
    time."""
    chosen = knee(curve, budget, KNEE_TOLERANCE)
    if chosen is None:
        return None
    floor = min((b for b, t in curve.items() if b >= CHOICE_FLOOR and t <= budget), default=chosen)
    return max(chosen, floor)
