"""The points of each ``trtserve bench`` mode against one model, each yielded as soon as it is
measured: the closed-loop sweeps (unary and stream), the open loop at fractions of the measured
capacity, the dispatch-policy comparison, and the ``overload`` and ``mixed`` modes under each
policy of ``--policies``. ``args`` is ``trtserve bench``'s parsed command line; every point is a
:class:`~.report.Point` with the raw reference's ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import numpy as np

from trtserve.harness.benchlib.deadlines import DeadlineClass, deadline_class, deadline_us, open_deadline_us
from trtserve.harness.benchlib.httpclient import RestClient, RestRequest
from trtserve.harness.benchlib.load import METHOD, LoadGenerator, Window
from trtserve.harness.benchlib.overload import (
    LOOSE,
    MIXED_FACTORS,
    MIXED_FRACTION,
    MIXED_MODE,
    OVERLOAD_DEADLINE_FACTOR,
    OVERLOAD_MODE,
    TIGHT,
    mixed_deadlines_us,
)
from trtserve.harness.benchlib.policies import CLOSED_MODE, OPEN_MODE, PolicyChoice, get_policy, set_policy
from trtserve.harness.benchlib.protocols import HTTP
from trtserve.harness.benchlib.refusals import ANSWERED, LOOP_MODES, REFUSED
from trtserve.harness.benchlib.report import SERVER, Measurement, Point, RawReference, format_row, summarize
from trtserve.harness.benchlib.workload import Workload, poisson_arrivals
from trtserve.testing import ChildServer

SETTLE_S = 0.2
"""Pause between points (seconds) so that one point's tail does not run into the next."""
SCHEDULE_SLACK_S = 1.0
"""Open loop: seconds of arrivals drawn beyond warm-up + window (the window ends on a
measured clock, so the schedule must outlast it)."""
OVERLOAD_SETTLE_S = 1.0
"""Pause after an overload or mixed point (seconds): an overloaded server may still be
refusing the last arrivals' backlog."""
CAPACITY_S = 2.0
"""Seconds measured by the quick closed loop that finds a capacity when its sweep did not run."""
PARKED_DELAY_US = 600_000_000
"""Mode ``refusals``: the fixed queue delay (µs) that keeps the parked request queued, longer
than any point."""


async def closed_unary(
    args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference, mode: str,
    server: str = SERVER, callers: Sequence[int] | None = None,
) -> AsyncIterator[Point]:
    """The closed-loop unary sweep over ``callers`` (default ``--concurrency``), as points of
    ``mode`` and ``server``, over the generator's door (:attr:`.LoadGenerator.protocol`)."""
    model = workload.spec.name
    sweep = args.concurrency if callers is None else callers
    count = max(len(workload.requests), max(sweep) + 1)
    http = gen.protocol == HTTP
    messages = workload.rest_requests(count) if http else workload.messages(count)
    for concurrency in sweep:
        window = await gen.closed_unary(model, messages, concurrency)
        # HTTP/1.1: one request at a time per connection, so each caller in flight holds its own.
        connections = min(concurrency, gen.connections) if http else gen.connections
        yield to_point(workload, mode, concurrency, None, None, window, raw, server=server, connections=connections)
        await asyncio.sleep(SETTLE_S)


async def mode_points(
    args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference, mode: str,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """The points of one mode for one model, each as soon as it is measured (``done``: the
    points measured before, where the open loop finds its capacity)."""
    model = workload.spec.name
    loop, transport = mode.split("-")
    stream = transport == "stream"

    connections = 1 if stream else gen.connections

    def point(load: float, fraction: float | None, deadline_us: int | None, window: Window) -> Point:
        return to_point(workload, mode, load, fraction, deadline_us, window, raw, connections=connections)

    if loop == "closed" and not stream:
        async for p in closed_unary(args, gen, workload, raw, mode):
            yield p
        return
    if loop == "closed":
        messages = workload.messages(max(len(workload.requests), max(args.concurrency) + 1), with_ids=True)
        for concurrency in args.concurrency:
            yield point(concurrency, None, None, await gen.closed_stream(model, messages, concurrency))
            await asyncio.sleep(SETTLE_S)
        return

    at_capacity = await find_capacity(args, gen, workload, raw, transport, done)
    timeout_us = open_deadline_us(raw.batch1_ms, args.deadline_factor, raw.run_ms(at_capacity.mean_batch or 1))
    for fraction in args.rates:
        rate = fraction * at_capacity.rows_per_s
        arrivals = poisson_arrivals(rate, args.warmup + args.duration + SCHEDULE_SLACK_S, rng)
        if stream:
            messages = workload.messages(len(arrivals), with_ids=True, timeout_us=timeout_us)
            window = await gen.open_stream(model, messages, arrivals, timeout_us / 1e6)
        else:
            window = await gen.open_unary(model, workload.messages(timeout_us=timeout_us), arrivals, timeout_us / 1e6)
        yield point(rate, fraction, timeout_us, window)
        await asyncio.sleep(SETTLE_S)


def unary_transport(gen: LoadGenerator) -> str:
    """The unary transport of ``gen``'s door as the closed-loop modes name it: ``unary``
    (gRPC, mode ``closed-unary``) or ``http`` (mode ``closed-http``)."""
    return "http" if gen.protocol == HTTP else "unary"


def unary_messages(gen: LoadGenerator, workload: Workload, count: int | None = None,
                   timeout_us: int | None = None) -> list[bytes] | list[RestRequest]:
    """``workload``'s requests (cycled to ``count``; with that ``timeout`` parameter, µs) for
    ``gen``'s door: serialized ModelInferRequests over gRPC, KServe v2 JSON bodies over HTTP
    (what the Go load generator sends there)."""
    if gen.protocol == HTTP:
        return workload.rest_requests(count, binary=False, timeout_us=timeout_us)
    return workload.messages(count, timeout_us=timeout_us)


async def find_capacity(args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference,
                        transport: str, done: list[Point]) -> Point:
    """The closed-loop point at capacity over ``transport`` in this run (its ``rows_per_s``:
    requests/s, one row each): the peak of its sweep, else a quick closed loop
    (:data:`CAPACITY_S`, the largest ``--concurrency``) measured now and added to ``done`` as
    mode ``capacity-<transport>``. ``transport``: ``stream``, or the unary door of ``gen``
    (:func:`unary_transport`: ``unary`` over gRPC, ``http``; the quick loop over HTTP sends
    :func:`unary_messages`' JSON bodies)."""
    model = workload.spec.name
    modes = (f"closed-{transport}", f"capacity-{transport}")
    closed = [p for p in done if p.model == model and p.server == SERVER and p.mode in modes]
    if closed:
        return max(closed, key=lambda p: p.rows_per_s)
    callers = max(args.concurrency)
    quick = gen.with_duration(min(args.duration, CAPACITY_S))
    count = max(len(workload.requests), callers + 1)
    if transport == "stream":
        window = await quick.closed_stream(model, workload.messages(count, with_ids=True), callers)
    else:
        window = await quick.closed_unary(model, unary_messages(gen, workload, count), callers)
    connections = 1 if transport == "stream" else gen.connections
    point = to_point(workload, modes[1], callers, None, None, window, raw, connections=connections)
    done.append(point)
    print(f"{model:8} {modes[1]:13} {format_row(point)}", flush=True)
    await asyncio.sleep(SETTLE_S)
    return point


async def policy_points(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """The policy comparison for one model: per caller count a closed loop, per rate one
    trace, each run under each policy."""
    model = workload.spec.name
    capacity = (await find_capacity(args, gen, workload, raw, "stream", done)).rows_per_s
    full = raw.sizes[-1]  # batch_sizes() ends at max_batch_size
    timeout_us = deadline_us(full.p50_ms, args.policy_deadline_factor)
    choices: list[PolicyChoice] = args.policies
    traces = []
    for fraction in args.policy_rates:
        arrivals = poisson_arrivals(fraction * capacity, gen.warmup_s + args.policy_duration + SCHEDULE_SLACK_S, rng)
        traces.append((fraction, arrivals, workload.messages(len(arrivals), with_ids=True, timeout_us=timeout_us)))
    closed = workload.messages(max(len(workload.requests), max(args.policy_concurrency) + 1))
    measure = gen.with_duration(args.policy_duration)
    async with _policy_restored(channel, model):
        # One unmeasured replay first: the previous sweep's tail (an overloaded open loop) must
        # not land on whichever policy happens to be measured first.
        await measure.open_stream(model, traces[0][2], traces[0][1], timeout_us / 1e6)
        for r in range(args.policy_rounds):
            rows = [*((CLOSED_MODE, c) for c in args.policy_concurrency), *((OPEN_MODE, trace) for trace in traces)]
            for k, (mode, row) in enumerate(rows):
                # Alternate the order (by row and by round), so that no policy always runs first:
                # a warmer or quieter machine early in a sweep would favour it.
                for choice in choices if (k + r) % 2 == 0 else choices[::-1]:
                    await set_policy(channel, model, choice.adaptive, choice.max_queue_delay_us)
                    if mode == CLOSED_MODE:
                        window = await measure.closed_unary(model, closed, row)
                        yield to_point(workload, mode, row, None, None, window, raw, policy=choice.label,
                                       connections=gen.connections)
                    else:
                        fraction, arrivals, messages = row
                        window = await measure.open_stream(model, messages, arrivals, timeout_us / 1e6)
                        yield to_point(workload, mode, fraction * capacity, fraction, timeout_us, window, raw,
                                       policy=choice.label)
                    await asyncio.sleep(SETTLE_S)


@contextlib.asynccontextmanager
async def _policy_restored(channel: grpc.aio.Channel, model: str) -> AsyncIterator[None]:
    """The model's batching policy as it was on entry is set again on exit, however the block ends."""
    original = await get_policy(channel, model)
    try:
        yield
    finally:
        await set_policy(channel, model, original.adaptive, original.max_queue_delay_us, original.max_queue_size)


async def _under_policies(
    args: argparse.Namespace, channel: grpc.aio.Channel, model: str,
    run: Callable[[PolicyChoice | None], Awaitable[list[Point]]], own_policy: bool = False,
) -> AsyncIterator[Point]:
    """``run`` under each policy of ``--policies`` in turn, its points as they come; the
    model's own policy restored at the end. With ``own_policy``, ``run(None)`` once under the
    policy the server already runs (a peer's, which ``SetPolicy`` cannot reach), nothing set."""
    if own_policy:
        for point in await run(None):
            yield point
        return
    async with _policy_restored(channel, model):
        for choice in args.policies:
            await set_policy(channel, model, choice.adaptive, choice.max_queue_delay_us)
            for point in await run(choice):
                yield point


async def overload_points(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator, *, capacity: float | None = None, mode: str = OVERLOAD_MODE,
    server: str = SERVER, own_policy: bool = False,
) -> AsyncIterator[Point]:
    """Mode ``overload`` for one model: per multiple of the unary capacity one Poisson trace,
    replayed under each policy, multiples ascending; every request's gRPC deadline and
    ``timeout`` parameter 10× the raw batch-of-one run time, at least 5 ms. Over ``gen``'s
    door: with :meth:`.LoadGenerator.over_http`, the HTTP door's capacity and JSON bodies, the
    deadline in the ``trtserve-timeout-us`` header instead of the gRPC deadline.

    ``capacity`` (requests/s) replaces the measured one (:func:`find_capacity`); the points are
    of ``mode`` and ``server``; ``own_policy``: see :func:`_under_policies`."""
    model = workload.spec.name
    if capacity is None:
        capacity = (await find_capacity(args, gen, workload, raw, unary_transport(gen), done)).rows_per_s
    timeout_us = deadline_us(raw.batch1_ms, OVERLOAD_DEADLINE_FACTOR)
    messages = unary_messages(gen, workload, timeout_us=timeout_us)
    span = gen.warmup_s + args.overload_duration + SCHEDULE_SLACK_S
    traces = [(m, poisson_arrivals(m * capacity, span, rng)) for m in sorted(args.overload_multiples)]
    measure = gen.with_duration(args.overload_duration)

    async def sweep(choice: PolicyChoice | None) -> list[Point]:
        points = []
        for multiple, arrivals in traces:
            window = await measure.open_unary(model, messages, arrivals, timeout_us / 1e6, grpc_deadline=True)
            one = deadline_class("all", timeout_us, window.seconds, window.latency_us, window.codes, window.late_mask)
            points.append(to_point(workload, mode, multiple * capacity, multiple, timeout_us, window, raw,
                                   policy=choice.label if choice else None, server=server, connections=gen.connections,
                                   classes=(one,)))
            await asyncio.sleep(OVERLOAD_SETTLE_S)
        return points

    async for point in _under_policies(args, channel, model, sweep, own_policy):
        yield point


async def mixed_points(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator, *, capacity: float | None = None, mode: str = MIXED_MODE,
    server: str = SERVER, own_policy: bool = False,
) -> AsyncIterator[Point]:
    """Mode ``mixed`` for one model: one Poisson trace at 65 % of the unary capacity, each
    arrival tight or loose at random (half each), replayed under each policy. ``capacity``,
    ``mode``, ``server`` and ``own_policy`` as in :func:`overload_points`; over ``gen``'s door
    as there."""
    model = workload.spec.name
    if capacity is None:
        capacity = (await find_capacity(args, gen, workload, raw, unary_transport(gen), done)).rows_per_s
    budgets = mixed_deadlines_us(deadline_us(raw.batch1_ms, MIXED_FACTORS[TIGHT]))
    arrivals = poisson_arrivals(MIXED_FRACTION * capacity, gen.warmup_s + args.mixed_duration + SCHEDULE_SLACK_S, rng)
    tight = rng.random(len(arrivals)) < 0.5
    by_class = {name: unary_messages(gen, workload, timeout_us=us) for name, us in budgets.items()}
    # Message k is arrival k's: its class decides its deadline (the window's keys give it back).
    messages = [by_class[TIGHT if t else LOOSE][k % len(workload.requests)] for k, t in enumerate(tight)]
    deadlines_s = [budgets[TIGHT if t else LOOSE] / 1e6 for t in tight]
    measure = gen.with_duration(args.mixed_duration)

    async def run(choice: PolicyChoice | None) -> list[Point]:
        window = await measure.open_unary(model, messages, arrivals, deadlines_s, grpc_deadline=True)
        mask = tight[window.keys]
        classes = tuple(
            deadline_class(name, budgets[name], window.seconds, window.latency_us[keep],
                           [c for c, k in zip(window.codes, keep) if k], window.late_mask[keep])
            for name, keep in ((TIGHT, mask), (LOOSE, ~mask))
        )
        point = to_point(workload, mode, MIXED_FRACTION * capacity, MIXED_FRACTION, None, window, raw,
                         policy=choice.label if choice else None, server=server, connections=gen.connections,
                         classes=classes)
        await asyncio.sleep(OVERLOAD_SETTLE_S)
        return [point]

    async for point in _under_policies(args, channel, model, run, own_policy):
        yield point


async def refusal_points(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, server: ChildServer,
    workload: Workload, raw: RawReference,
) -> AsyncIterator[Point]:
    """Mode ``refusals`` for one model (:mod:`.refusals`): per door of ``--protocol``, the closed
    loop at the largest ``--concurrency`` answered in full, then the same loop with the model's
    queue held full (:func:`_queue_held_full`), every call of it refused RESOURCE_EXHAUSTED
    (HTTP 429) as a full queue refuses; over HTTP at ``server.http_url``."""
    model = workload.spec.name
    callers = max(args.concurrency)
    count = max(len(workload.requests), callers + 1)
    parked = workload.messages(1)[0]
    for door in args.protocol:
        async with contextlib.AsyncExitStack() as stack:
            g, messages = gen, workload.messages(count)
            if door == HTTP:
                g = gen.over_http(await stack.enter_async_context(RestClient(server.http_url, callers)))
                messages = workload.rest_requests(count)
            for kind in (ANSWERED, REFUSED):
                async with _queue_held_full(channel, model, parked) if kind == REFUSED else contextlib.nullcontext():
                    window = await g.closed_unary(model, messages, callers)
                connections = min(callers, g.connections) if door == HTTP else g.connections
                yield to_point(workload, LOOP_MODES[door][kind], callers, None, None, window, raw,
                               connections=connections)
                await asyncio.sleep(SETTLE_S)


@contextlib.asynccontextmanager
async def _queue_held_full(channel: grpc.aio.Channel, model: str, message: bytes) -> AsyncIterator[None]:
    """The model's queue full for the block: ``max_queue_size`` 1 and a fixed queue delay of
    :data:`PARKED_DELAY_US`, then ``message`` (a ModelInferRequest without a deadline of its
    own) sent, so that it waits in the queue for a batch that never fills and every other
    request finds the queue full. On exit the parked call is cancelled (it leaves the queue)
    and the model's policy restored."""
    async with _policy_restored(channel, model):
        await set_policy(channel, model, False, PARKED_DELAY_US, max_queue_size=1)
        call = channel.unary_unary(METHOD + "ModelInfer")(message)
        try:
            await asyncio.sleep(SETTLE_S)
            if call.done():
                raise RuntimeError(f"the request parked in the queue of '{model}' was answered "
                                   f"({await call.code()}): the queue cannot be held full")
            yield
        finally:
            call.cancel()


def to_point(workload: Workload, mode: str, load: float, fraction: float | None, timeout_us: int | None,
             window: Window, raw: RawReference, policy: str | None = None, server: str = SERVER, connections: int = 1,
             classes: tuple[DeadlineClass, ...] = ()) -> Point:
    """One measured window of ``workload``'s requests as a report point, its rows/s set against the
    raw best-batch rows/s (``load``: callers or arrivals/s; ``timeout_us``: the requests' deadline,
    if they had one)."""
    return summarize(Measurement(
        model=workload.spec.name, mode=mode, load=load, fraction=fraction, window_s=window.seconds,
        rows_per_request=workload.rows_per_request,
        latency_us=window.latency_us, codes=window.codes, late=window.late, deadline_us=timeout_us,
        send_lag_us=window.send_lag_us, before=window.before, after=window.after, policy=policy,
        server=server, connections=connections, classes=classes, door=window.door,
    ), raw.best.rows_per_s)
