"""Mode ``gpu-shaped`` of ``trtserve bench``: the dispatcher measured where the engine's time is
off the CPU, beside Triton's batcher on the same engine.

The ``slow`` model (``engines/slow``: a Python model whose batch of n rows sleeps
``batch_ms + row_ms·n`` milliseconds) is copied into a temporary repository with a GPU-like
curve, :data:`CURVE` (4 ms + 0.1 ms a row, max batch 64: 64 / 10.4 ms = 6 154 rows/s at full
batches), and served by trtserve and, with ``--peer triton``, by the Triton peer (PyTriton
running the same ``model.py`` behind Triton's dynamic batcher, same max batch, a request's
``timeout`` parameter honoured), one server after the other, in the same run. Per server and per
request size (``--gpu-rows``, default 1 and 8 rows), over gRPC, with the bench's own sweeps
(:mod:`.sweeps`):

(a) ``gpu-closed``: closed loop at :data:`ROWS_IN_FLIGHT` × the max batch rows in flight
    (callers = rows in flight ÷ rows per request), enough to keep a batch queued behind the one
    running. Target: served rows/s ≥ :data:`CAPACITY_RATIO` × the engine's capacity.
(b) ``gpu-open``: Poisson at :data:`OPEN_FRACTION` of the engine's capacity, each request's
    deadline (its gRPC deadline and ``timeout`` parameter) :func:`.deadlines.open_deadline_us`
    of the curve: 4 (``--deadline-factor``) × the batch of one, and at least two full batches
    (20.8 ms). Target: missed ≤ the simulator's ideal + :data:`IDEAL_SLACK` (the real dispatcher
    on a fake clock, :mod:`trtserve.harness.simulator`: same curve, same rate and deadline,
    same rows per request, a host that costs nothing).
(c) ``gpu-overload`` (:func:`.sweeps.overload_points`): Poisson at ``--overload-multiples`` ×
    the engine's capacity, deadline 10 × the batch of one (41 ms). Target: goodput at 2× and 3×
    ≥ 0.8 × the sweep's peak goodput.
(d) ``gpu-mixed`` (:func:`.sweeps.mixed_points`): Poisson at 65 % of the engine's capacity,
    half tight (10 × the batch of one, 41 ms) and half loose (10 × the tight). Target: tight
    missed ≤ 5 %, loose ≤ 1 %.

Every rate is a fraction of the engine's capacity in requests/s (its rows/s ÷ rows per request),
and both servers replay the same traces (the same seed). A miss is any request not answered OK
within its deadline (late answers and refusals alike). The curve is the raw reference
(:func:`curve_reference`), so each point's ``ratio`` is its rows/s over the engine's capacity.
Every figure stands beside the server's CPU per request (its whole process tree): with the
engine asleep, the CPU left is all the transport's and the dispatcher's, and on a few shared
cores it, not the engine, decides. Targets are held by trtserve's figures; the peer's stand
beside them in each target's detail and in :func:`format_gpu_table`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from trtserve.client import CHANNEL_OPTIONS
from trtserve.config import BatchingPolicy
from trtserve.harness.benchlib.deadlines import deadline_class, open_deadline_us
from trtserve.harness.benchlib.goclient import GoLoadgen
from trtserve.harness.benchlib.load import LoadGenerator, open_channels
from trtserve.harness.benchlib.overload import GOODPUT_RATIO, MISS_LIMITS, OVERLOAD_TARGET_MULTIPLES
from trtserve.harness.benchlib.peer import PeerSetupError, triton_peer
from trtserve.harness.benchlib.proctree import tree_cpu_seconds, tree_rss_mib
from trtserve.harness.benchlib.raw import batch_sizes
from trtserve.harness.benchlib.report import SERVER, Point, RawReference, RawSize, Target, fmt, format_row
from trtserve.harness.benchlib.sweeps import (
    SCHEDULE_SLACK_S,
    SETTLE_S,
    closed_unary,
    mixed_points,
    overload_points,
    to_point,
)
from trtserve.harness.benchlib.workload import Workload, build_workload, poisson_arrivals
from trtserve.harness.simulator import poisson_trace, simulate
from trtserve.repository import read_config
from trtserve.testing import ChildServer, ServerProcess, affine

GPU_MODE = "gpu-shaped"
"""The ``--modes`` item."""
MODEL = "slow"
"""The model copied from ``--model-repository``, whose time is a sleep."""
CLOSED, OPEN, OVERLOAD, MIXED = "gpu-closed", "gpu-open", "gpu-overload", "gpu-mixed"
"""The points' modes (kept apart from the main sweep's)."""
ROWS_PER_REQUEST = (1, 8)
"""``--gpu-rows``' default: one-row and 8-row requests."""
ROWS_IN_FLIGHT = (2, 4)
"""Closed loop: rows in flight as multiples of the max batch, one point each."""
CAPACITY_RATIO = 0.95
OPEN_FRACTION = 0.8
IDEAL_SLACK = 0.01
"""Open loop: missed ≤ the simulator's ideal + this share (one point)."""
CONFIG_HEADER = ("# Written by trtserve bench --modes gpu-shaped: engines/slow with a GPU-like curve "
                 "(batch_ms + row_ms * rows, asleep).\n")


@dataclass(frozen=True)
class Curve:
    """An engine's run time, ``batch_ms + row_ms × rows`` milliseconds a batch, up to ``max_batch`` rows."""

    batch_ms: float
    row_ms: float
    max_batch: int

    def run_ms(self, rows: int) -> float:
        """Milliseconds of a batch of ``rows`` rows."""
        return self.batch_ms + self.row_ms * rows

    @property
    def capacity_rows_per_s(self) -> float:
        """Rows per second of full batches back to back."""
        return self.max_batch / self.run_ms(self.max_batch) * 1e3

    def latency_s(self) -> Callable[[int], float]:
        """The curve in seconds, as the simulator takes it."""
        return affine(self.batch_ms / 1e3, self.row_ms / 1e3)


CURVE = Curve(batch_ms=4.0, row_ms=0.1, max_batch=64)


def write_repository(source: Path, root: Path, curve: Curve = CURVE) -> Path:
    """A model repository at ``root`` holding ``source`` (``engines/slow``) with ``curve``'s
    parameters and max batch (its config rewritten, its ``model.py`` copied); returns the model's
    directory.

    Raises:
        trtserve.errors.ConfigError: ``source``'s config is unreadable or unparsable.
    """
    config = read_config(source)
    config.max_batch_size = curve.max_batch
    config.parameters["batch_ms"].string_value = f"{curve.batch_ms:g}"
    config.parameters["row_ms"].string_value = f"{curve.row_ms:g}"
    model_dir = root / config.name
    shutil.copytree(source, model_dir, ignore=shutil.ignore_patterns("config.pbtxt", "__pycache__"))
    (model_dir / "config.pbtxt").write_text(CONFIG_HEADER + text_format.MessageToString(config))
    return model_dir


def curve_reference(curve: Curve = CURVE, model: str = MODEL) -> RawReference:
    """The curve as the raw reference: one run of its nominal time at each batch size 1, 2, 4 …
    max (so the best rows/s is the engine's capacity)."""
    return RawReference(model, tuple(RawSize(b, (curve.run_ms(b) * 1e3,)) for b in batch_sizes(curve.max_batch)))


def open_timeout_us(args: argparse.Namespace, curve: Curve = CURVE) -> int:
    """The open loop's deadline (µs): :func:`.deadlines.open_deadline_us` of the curve, its
    capacity batch the max batch."""
    return open_deadline_us(curve.run_ms(1), args.deadline_factor, curve.run_ms(curve.max_batch))


def simulated_misses(args: argparse.Namespace, rows: int, curve: Curve = CURVE) -> float:
    """The simulator's ideal for the open loop: the share of requests missed by the real
    dispatcher (the model's default policy, max batch ``curve.max_batch``) on a fake clock, the
    engine ``curve``, a free host, Poisson arrivals at :data:`OPEN_FRACTION` of the capacity for
    ``--warmup`` + ``--duration`` seconds, ``rows`` rows a request, :func:`open_timeout_us` each."""
    rate = OPEN_FRACTION * curve.capacity_rows_per_s / rows
    trace = poisson_trace(rate, args.warmup + args.duration, seed=args.seed).tolist()
    result = asyncio.run(simulate(BatchingPolicy(max_batch_size=curve.max_batch), trace,
                                  deadline=open_timeout_us(args, curve) / 1e6, latency=curve.latency_s(), rows=rows))
    return result.miss_rate


def gpu_shaped_points(args: argparse.Namespace, serve_args: Sequence[str], use_go: bool) -> tuple[list[Point],
                                                                                                  dict[int, float]]:
    """The mode's points on trtserve (``trtserve serve`` with ``serve_args``) and, with
    ``--peer triton``, on the Triton peer, each server on a temporary copy of ``slow`` with
    :data:`CURVE`; and the simulator's ideal miss share of the open loop per rows per request.

    Raises:
        SystemExit: no ``slow`` in ``--model-repository``, the model not ready on a server, or
            the peer's environment could not be made.
    """
    source = args.model_repository / MODEL
    if not (source / "config.pbtxt").is_file():
        raise SystemExit(f"mode '{GPU_MODE}' needs the '{MODEL}' model in {args.model_repository}")
    ideals = {rows: simulated_misses(args, rows) for rows in args.gpu_rows}
    print(f"{GPU_MODE}: {MODEL} at {CURVE.batch_ms:g} ms + {CURVE.row_ms:g} ms/row, max batch {CURVE.max_batch} "
          f"({CURVE.capacity_rows_per_s:.0f} rows/s); simulator's ideal open-loop misses "
          + ", ".join(f"{rows} row(s) {share:.1%}" for rows, share in ideals.items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="trtserve-gpu-shaped-") as tmp:
        model_dir = write_repository(source, Path(tmp))
        workload = build_workload(model_dir, args.requests, [], np.random.default_rng(args.seed))
        with ServerProcess(Path(tmp), *serve_args) as server:
            print(f"{GPU_MODE}: trtserve pid {server.pid} at {server.url}", flush=True)
            points = asyncio.run(_collect(args, server, SERVER, workload, use_go))
        if "triton" in args.peer:
            try:
                peer = triton_peer(args.out / "triton", [workload.spec])
            except PeerSetupError as exc:
                raise SystemExit(str(exc)) from None
            with peer:
                print(f"{GPU_MODE}: triton pid {peer.pid} at {peer.url}", flush=True)
                points += asyncio.run(_collect(args, peer, "triton", workload, use_go))
    return points, ideals


async def _collect(args: argparse.Namespace, server: ChildServer, name: str, workload: Workload,
                   use_go: bool) -> list[Point]:
    points = []
    async for point in _server_points(args, server, name, workload, use_go):
        points.append(point)
        print(f"{name:8} {point.mode + ' x' + str(point.rows_per_request):15} {format_row(point)}", flush=True)
    return points


async def _server_points(args: argparse.Namespace, server: ChildServer, name: str, one_row: Workload,
                         use_go: bool) -> AsyncIterator[Point]:
    """Every point of the mode against ``server`` (called ``name``), request size by request size."""
    channels = open_channels(server.url, args.connections, CHANNEL_OPTIONS)
    raw = curve_reference()
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(server.pid), args.warmup, args.duration,
                            server_rss_mib=lambda: tree_rss_mib(server.pid),
                            go=GoLoadgen(server.url) if use_go else None)
        if not await gen.model_ready(MODEL):
            raise SystemExit(f"model '{MODEL}' is not ready on {server.name}:\n" + "".join(server.output))
        rng = np.random.default_rng(args.seed)  # the same traces for every server
        for rows in args.gpu_rows:
            workload = one_row.grouped(rows)
            capacity = CURVE.capacity_rows_per_s / rows
            callers = [k * CURVE.max_batch // rows for k in ROWS_IN_FLIGHT]
            async for point in closed_unary(args, gen, workload, raw, CLOSED, server=name, callers=callers):
                yield point
            timeout_us = open_timeout_us(args)
            rate = OPEN_FRACTION * capacity
            arrivals = poisson_arrivals(rate, args.warmup + args.duration + SCHEDULE_SLACK_S, rng)
            window = await gen.open_unary(MODEL, workload.messages(timeout_us=timeout_us), arrivals, timeout_us / 1e6,
                                          grpc_deadline=True)
            one = deadline_class("all", timeout_us, window.seconds, window.latency_us, window.codes, window.late_mask)
            yield to_point(workload, OPEN, rate, OPEN_FRACTION, timeout_us, window, raw, server=name,
                           connections=gen.connections, classes=(one,))
            await asyncio.sleep(SETTLE_S)
            for sweep in (overload_points, mixed_points):
                mode = OVERLOAD if sweep is overload_points else MIXED
                async for point in sweep(args, channels[0], gen, workload, raw, [], rng, capacity=capacity,
                                         mode=mode, server=name, own_policy=True):
                    yield point
    finally:
        for c in channels:
            await c.close()


def _misses(p: Point) -> float:
    """Share of ``p``'s requests not answered OK within their deadline."""
    return p.classes[0].miss_share


def _refusals(p: Point) -> str:
    """The misses of ``p``'s class by kind: late answers, refusals by status (and of the
    DEADLINE_EXCEEDED how many came before the deadline: the server's, not the client's)."""
    c = p.classes[0]
    return (f"late {c.late}, DEADLINE_EXCEEDED {c.refused['DEADLINE_EXCEEDED']} ({c.refused_early} early), "
            f"RESOURCE_EXHAUSTED {c.refused['RESOURCE_EXHAUSTED']}")


def _of_peak(goodput: float, peak: float) -> str:
    return f"{goodput / peak:.2f}" if peak > 0 else "-"


def _cpu(p: Point | None) -> str:
    return "-" if p is None else f"{fmt(p.server_cpu_us_per_request, '.0f')} µs/request"


@dataclass(frozen=True)
class _Figure:
    """One row of the mode's table: a label, its target, and per server its value and CPU cells."""

    label: str
    target: str
    cells: dict[str, tuple[str, str]]


def _by_server(points: Sequence[Point], mode: str, rows: int) -> dict[str, list[Point]]:
    found: dict[str, list[Point]] = {}
    for p in points:
        if p.mode == mode and p.rows_per_request == rows:
            found.setdefault(p.server, []).append(p)
    return found


def _figures(points: Sequence[Point], ideals: Mapping[int, float], rows: int) -> list[_Figure]:
    """The rows of one request size, in the order (a) to (d)."""
    figures = []
    for load in sorted({p.load for p in points if p.mode == CLOSED and p.rows_per_request == rows}):
        at = {p.server: p for p in points if p.mode == CLOSED and p.rows_per_request == rows and p.load == load}
        figures.append(_Figure(f"closed, {load:g} callers: rows/s (of capacity)", f"≥ {CAPACITY_RATIO:g}", {
            s: (f"{p.rows_per_s:.0f} ({fmt(p.ratio, '.2f')}), batch {fmt(p.mean_batch, '.1f')}", _cpu(p))
            for s, p in at.items()}))
    opened = {s: g[0] for s, g in _by_server(points, OPEN, rows).items()}
    if opened:
        deadline = next(iter(opened.values())).deadline_ms
        ideal = ideals.get(rows)
        figures.append(_Figure(
            f"open {OPEN_FRACTION:.0%}, deadline {fmt(deadline, '.1f')} ms: missed",
            f"≤ {fmt(None if ideal is None else 100 * ideal, '.1f')} % (ideal) + 1",
            {s: (f"{_misses(p):.1%} ({_refusals(p)}), p99 {fmt(p.p99_ms, '.1f')} ms", _cpu(p))
             for s, p in opened.items()}))
    overload = _by_server(points, OVERLOAD, rows)
    peaks = {s: max(p.classes[0].goodput for p in g) for s, g in overload.items()}
    for multiple in sorted({p.fraction for g in overload.values() for p in g if p.fraction is not None}):
        at = {s: p for s, g in overload.items() for p in g if p.fraction == multiple}
        figures.append(_Figure(
            f"overload {multiple:g}×, deadline {next(iter(at.values())).classes[0].deadline_ms:.0f} ms: "
            "goodput/s (of peak)", f"≥ {GOODPUT_RATIO:g}" if multiple in OVERLOAD_TARGET_MULTIPLES else "",
            {s: (f"{p.classes[0].goodput:.0f} ({_of_peak(p.classes[0].goodput, peaks[s])})", _cpu(p))
             for s, p in at.items()}))
    mixed = {s: g[0] for s, g in _by_server(points, MIXED, rows).items()}
    for k, c in enumerate(next(iter(mixed.values())).classes if mixed else ()):
        figures.append(_Figure(
            f"mixed {fmt(next(iter(mixed.values())).fraction, '.0%')}, {c.name} {c.deadline_ms:.0f} ms: missed",
            f"≤ {MISS_LIMITS[c.name]:.0%}" if c.name in MISS_LIMITS else "",
            {s: (f"{p.classes[k].miss_share:.1%}", _cpu(p)) for s, p in mixed.items()}))
    return figures


def _servers(points: Sequence[Point]) -> list[str]:
    """The servers with points of the mode, trtserve first."""
    found = set(p.server for p in points if p.mode in (CLOSED, OPEN, OVERLOAD, MIXED))
    return [s for s in dict.fromkeys((SERVER, *(p.server for p in points))) if s in found]


def format_gpu_table(points: Sequence[Point], ideals: Mapping[int, float]) -> str:
    """The mode as one Markdown table (a row per request size and figure, a value and a CPU
    column per server), or "" without its points."""
    servers = _servers(points)
    if not servers:
        return ""
    head = ["rows/request", "figure", "target", *(c for s in servers for c in (s, f"{s} CPU"))]
    out = [
        f"{GPU_MODE}: {MODEL} at {CURVE.batch_ms:g} ms + {CURVE.row_ms:g} ms/row, max batch {CURVE.max_batch} "
        f"(asleep; capacity {CURVE.capacity_rows_per_s:.0f} rows/s); rates are fractions of that capacity; "
        "CPU = server CPU per request (its process tree)",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * 3 + "---:|" * (2 * len(servers)),
    ]
    for rows in sorted({p.rows_per_request for p in points if p.mode in (CLOSED, OPEN, OVERLOAD, MIXED)}):
        for f in _figures(points, ideals, rows):
            cells = [c for s in servers for c in f.cells.get(s, ("-", "-"))]
            out.append("| " + " | ".join([str(rows), f.label, f.target, *cells]) + " |")
    return "\n".join(out) + "\n"


def _closed_target(who: str, closed: dict[str, list[Point]], peers: Sequence[str]) -> Target:
    top = {s: max(g, key=lambda p: p.rows_per_s) for s, g in closed.items()}
    best = top[SERVER]

    def served(p: Point) -> str:
        return f"{p.rows_per_s:.0f} rows/s at {p.load:g} callers = {fmt(p.ratio, '.2f')}, {_cpu(p)}"

    return Target(
        f"{who}: closed-loop rows/s >= {CAPACITY_RATIO:g} x the engine's {CURVE.capacity_rows_per_s:.0f}",
        "PASS" if (best.ratio or 0.0) >= CAPACITY_RATIO else "MISS",
        f"{served(best)}, mean batch {fmt(best.mean_batch, '.1f')}" + _beside(peers, top, served))


def _open_target(who: str, opened: dict[str, Point], ideal: float | None, peers: Sequence[str]) -> Target:
    name = f"{who}: open loop at {OPEN_FRACTION:.0%} capacity, missed <= simulator's ideal + {IDEAL_SLACK:.0%}"
    p = opened.get(SERVER)
    if p is None or ideal is None:
        return Target(name, "SKIP", "needs the open-loop point and the simulator's ideal")

    def missed(q: Point) -> str:
        return f"{_misses(q):.1%} ({_refusals(q)}), {_cpu(q)}"

    return Target(name, "PASS" if _misses(p) <= ideal + IDEAL_SLACK else "MISS", (
        f"{_misses(p):.1%} of {p.requests} ({_refusals(p)}; deadline {fmt(p.deadline_ms, '.1f')} ms) vs ideal "
        f"{ideal:.1%} + {100 * IDEAL_SLACK:g} point, {_cpu(p)}" + _beside(peers, opened, missed)))


def _overload_targets(who: str, overload: dict[str, list[Point]], peers: Sequence[str]) -> list[Target]:
    peak = {s: max(p.classes[0].goodput for p in g) for s, g in overload.items()}

    def share(p: Point) -> str:
        goodput = p.classes[0].goodput
        return (f"{goodput:.0f}/s = {_of_peak(goodput, peak[p.server])} of peak {peak[p.server]:.0f}/s "
                f"({_refusals(p)}), {_cpu(p)}")

    targets = []
    for multiple in OVERLOAD_TARGET_MULTIPLES:
        name = f"{who}: overload at {multiple:g}x capacity, goodput >= {GOODPUT_RATIO:g} x peak"
        at = {s: p for s, g in overload.items() for p in g if p.fraction == multiple}
        p = at.get(SERVER)
        if p is None:
            targets.append(Target(name, "SKIP", f"needs the {multiple:g}x point"))
            continue
        ok = peak[SERVER] > 0 and p.classes[0].goodput >= GOODPUT_RATIO * peak[SERVER]
        targets.append(Target(name, "PASS" if ok else "MISS", share(p) + _beside(peers, at, share)))
    return targets


def _mixed_targets(who: str, mixed: dict[str, Point], peers: Sequence[str]) -> list[Target]:
    p = mixed.get(SERVER)
    if p is None:
        return []
    targets = []
    for k, c in enumerate(p.classes):
        limit = MISS_LIMITS.get(c.name)
        if limit is None:
            continue

        def missed(q: Point, k: int = k) -> str:
            return f"{q.classes[k].miss_share:.1%} of {q.classes[k].requests}, {_cpu(q)}"

        name = f"{who}: mixed at {fmt(p.fraction, '.0%')} capacity, {c.name} ({c.deadline_ms:.0f} ms)"
        targets.append(Target(f"{name} missed <= {limit:.0%}", "PASS" if c.miss_share <= limit else "MISS",
                              missed(p) + _beside(peers, mixed, missed)))
    return targets


def _beside(peers: Sequence[str], by_server: Mapping[str, Point], cell: Callable[[Point], str]) -> str:
    """``; <peer> <cell>`` for each peer (``-`` where it has no point)."""
    return "".join(f"; {peer} {cell(by_server[peer]) if peer in by_server else '-'}" for peer in peers)


def gpu_targets(points: Sequence[Point], ideals: Mapping[int, float]) -> list[Target]:
    """trtserve's targets (a) to (d) per request size (see the module docstring), each with the
    peers' figures for the same point in its detail."""
    targets: list[Target] = []
    peers = [s for s in _servers(points) if s != SERVER]
    for rows in sorted({p.rows_per_request for p in points if p.server == SERVER and p.mode == CLOSED}):
        who = f"{MODEL} {GPU_MODE} {rows}-row requests"
        targets.append(_closed_target(who, _by_server(points, CLOSED, rows), peers))
        opened = {s: g[0] for s, g in _by_server(points, OPEN, rows).items()}
        targets.append(_open_target(who, opened, ideals.get(rows), peers))
        targets += _overload_targets(who, _by_server(points, OVERLOAD, rows), peers)
        targets += _mixed_targets(who, {s: g[0] for s, g in _by_server(points, MIXED, rows).items()}, peers)
    return targets
