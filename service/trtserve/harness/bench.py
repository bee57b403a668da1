"""``trtserve bench``: served throughput and latency against the raw engine, in one run.

Starts a real server subprocess (``trtserve serve`` on 127.0.0.1, an ephemeral port) and,
for each model:

1. the raw reference while the server is idle: the model's ONNX file in ONNX Runtime
   directly, at batch sizes 1, 2, 4, … max_batch_size (best rows/s, batch-of-one latency);
2. closed loop, a sweep of concurrent callers, over unary ModelInfer and one ModelStreamInfer
   stream;
3. open loop, Poisson arrivals at fractions of the capacity the closed loop measured (per
   transport), each request with a deadline (``timeout`` parameter) of ``--deadline-factor``
   × the raw batch-of-one latency;
4. with ``--connections`` above 1, the closed-loop unary sweep again with every caller on
   one connection (mode ``closed-1conn``);
5. for ``--policy-models``, the dispatch-policy comparison (``benchlib.policies``): the
   closed-loop unary sweep at ``--policy-concurrency`` callers, and one Poisson trace per rate
   in ``--policy-rates`` replayed over a stream, each under the adaptive policy and each fixed
   queue-delay timer of ``--policies``, deadline ``--policy-deadline-factor`` × the raw run time
   of a full batch (``max_batch_size`` rows), at least 5 ms;
6. ``overload`` (``benchlib.overload``): Poisson arrivals over the unary connections at
   ``--overload-multiples`` × the closed-loop unary capacity (the sweep's peak, or a quick
   closed loop at the largest ``--concurrency`` when the sweep did not run), every request
   with a gRPC deadline and a ``timeout`` parameter of 10× the raw batch-of-one run time (at
   least 5 ms), under each policy of ``--policies``;
7. ``mixed``: Poisson at 65 % of that capacity, half the requests (at random) with a tight
   deadline (10× batch of one, at least 5 ms) and half with a loose one (10× the tight), under
   each policy of ``--policies``.

The open-loop unary calls (open sweep, overload, mixed) come from the Go load generator
(``clients/go/loadgen``, ``make loadgen``; ``benchlib.goclient``) when it is built, else, with
one printed line saying so, from the bench's ``grpc.aio`` client (``--client``): a Python call
costs the bench about 200 µs of CPU on the server's cores, so above about 1× a fast model's
capacity the Python client's own send lag, not the server, sets the figures.

Unary calls are spread over ``--connections`` client connections (gRPC channels, default 8):
the server's front-end processes share its port, and the kernel spreads connections, not
requests. With ``--peer triton``, trtserve is then stopped and NVIDIA PyTriton
(``benchlib.peer``; its own venv under ``OUT/triton``, made once) serves the same model
files with Triton's dynamic batcher; the same load generator runs the closed-loop unary
sweep against it, and a comparison table gives the trtserve/Triton ratios per row.

Each point reports achieved rows/s, p50/p90/p99 latency (ms, send → answer), errors by
status, deadline misses, the server's mean batch size (ModelStatistics deltas), the ratio of
served rows/s to the raw best-batch rows/s, the CPU time per request (µs) of the server
(its whole process tree) and of the bench client, and the server tree's resident memory (MiB)
at the start of the window and after its last answer. Overload and mixed points add, per
deadline class, goodput, late answers, refusals by status and p50/p99 of the OK answers. Output: tables and the issue's targets (PASS/MISS) on the terminal,
``OUT/bench.json``, ``OUT/<model>_latency.png``, ``OUT/<model>_batches.png`` and, with the
overload mode, ``OUT/<model>_overload.png`` (goodput against offered load per policy). Targets are reported, never turned into an exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import onnxruntime

from trtserve.client import CHANNEL_OPTIONS
from trtserve.harness.benchlib.compare import ONE_CONNECTION_MODE, SWEEP_MODE, anchor_targets, format_comparison
from trtserve.harness.benchlib.deadlines import DeadlineClass, deadline_class, deadline_us
from trtserve.harness.benchlib.goclient import LOADGEN, GoLoadgen, unavailable_reason
from trtserve.harness.benchlib.load import LoadGenerator, Window, open_channels
from trtserve.harness.benchlib.overload import (
    LOOSE, MIXED_FACTORS, MIXED_FRACTION, MIXED_MODE, OVERLOAD_DEADLINE_FACTOR, OVERLOAD_MODE, OVERLOAD_MULTIPLES, TIGHT,
    format_mixed_table, format_overload_table, mixed_deadlines_us, mixed_targets, overload_targets,
)
from trtserve.harness.benchlib.peer import PEERS, PeerSetupError, triton_peer
from trtserve.harness.benchlib.plots import plot_batches, plot_latency, plot_overload
from trtserve.harness.benchlib.policies import (
    CLOSED_MODE, DEFAULT_POLICIES, OPEN_MODE, PolicyChoice, format_policy_table, get_policy, parse_policies, policy_targets, set_policy,
)
from trtserve.harness.benchlib.proctree import tree_cpu_seconds, tree_rss_mib
from trtserve.harness.benchlib.raw import measure_raw
from trtserve.harness.benchlib.report import MODES, SERVER, Measurement, Point, RawReference, check_targets, format_header, format_row, format_tables, summarize
from trtserve.harness.benchlib.workload import CORPUS, Workload, build_workload, load_texts, poisson_arrivals
from trtserve.tools.child_server import ChildServer, ServerProcess

DEFAULT_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
SETTLE_S = 0.2
"""Pause between points (seconds) so that one point's tail does not run into the next."""
POLICY_MODE = "policy"
"""The ``--modes`` item that runs the dispatch-policy comparison."""
ALL_MODES = (*MODES, POLICY_MODE, OVERLOAD_MODE, MIXED_MODE)
SCHEDULE_SLACK_S = 1.0
"""Open loop: seconds of arrivals drawn beyond warm-up + window (the window ends on a
measured clock, so the schedule must outlast it)."""
OVERLOAD_SETTLE_S = 1.0
"""Pause after an overload or mixed point (seconds): an overloaded server may still be
refusing the last arrivals' backlog."""
CLIENTS = ("auto", "go", "python")
"""``--client``: the open loop's unary client; ``auto`` is the Go binary when it is built."""
CAPACITY_S = 2.0
"""Seconds measured by the quick closed loop that finds a capacity when its sweep did not run."""


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers separated by commas, got '{text}'")
    return values


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1 separated by commas, got '{text}'")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _policy_list(text: str) -> list[PolicyChoice]:
    try:
        return parse_policies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory (default: bench-results)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"shared data directory with {CORPUS} (default: ../shared/data beside the repository)")
    parser.add_argument("--models", type=_names, default=["tiny", "minilm"], help="models to drive, comma-separated (default: tiny,minilm)")
    parser.add_argument("--modes", type=_names, default=list(ALL_MODES), help=f"sweeps to run, comma-separated (default: {','.join(ALL_MODES)})")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64], help="closed loop: callers (unary) or requests in flight (stream) per point (default: 1,4,16,64)")
    parser.add_argument("--rates", type=_floats, default=[0.5, 0.8, 1.0], help="open loop: arrival rates as fractions of the measured capacity (default: 0.5,0.8,1.0)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per point (default: 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each point's window (default: 1)")
    parser.add_argument("--raw-duration", type=float, default=1.5, help="seconds per batch size of the raw reference (default: 1.5)")
    parser.add_argument("--deadline-factor", type=float, default=4.0, help="open loop: request deadline as a multiple of the raw batch-of-one latency (default: 4)")
    parser.add_argument("--policy-models", type=_names, default=["tiny", "minilm"], help="models of the policy comparison (mode 'policy'), comma-separated (default: tiny,minilm)")
    parser.add_argument("--policies", type=_policy_list, default=parse_policies(DEFAULT_POLICIES), help=f"policy comparison, overload and mixed modes: 'adaptive' and 'fixed:<queue delay ms>' items (default: {DEFAULT_POLICIES})")
    parser.add_argument("--policy-concurrency", type=_ints, default=[16, 64], help="policy comparison: closed-loop unary callers per row (default: 16,64)")
    parser.add_argument("--policy-rates", type=_floats, default=[0.5, 0.8], help="policy comparison: arrival rates as fractions of the measured stream capacity (default: 0.5,0.8)")
    parser.add_argument("--policy-deadline-factor", type=float, default=3.0, help="policy comparison: request deadline as a multiple of the raw run time of a full batch (default: 3, the ratio of the simulator comparison: 10 ms deadline, 3.6 ms full batch)")
    parser.add_argument("--policy-rounds", type=_positive_int, default=2, help="policy comparison: sweeps over every (rate, policy), order alternating (default: 2)")
    parser.add_argument("--policy-duration", type=float, default=3.0, help="policy comparison: seconds measured per point (default: 3)")
    parser.add_argument("--overload-multiples", type=_floats, default=list(OVERLOAD_MULTIPLES), help="overload: arrival rates as multiples of the closed-loop unary capacity (default: 0.5,1,2,3)")
    parser.add_argument("--overload-duration", type=float, default=3.0, help="overload: seconds measured per point (default: 3)")
    parser.add_argument("--mixed-duration", type=float, default=5.0, help="mixed: seconds measured per point (default: 5)")
    parser.add_argument("--requests", type=int, default=1024, help="distinct prebuilt requests per model (default: 1024)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and the Poisson arrivals (default: 0)")
    parser.add_argument("--connections", type=_positive_int, default=8, help="client connections (gRPC channels) the unary callers are spread over, for every server; above 1 the closed-loop unary sweep also runs over one (default: 8)")
    parser.add_argument("--peer", choices=PEERS, help="also drive this server on the same model files, closed-loop unary sweep, same run: 'triton' (NVIDIA PyTriton from PyPI, installed once into OUT/triton/venv)")
    parser.add_argument("--frontends", help="passed to 'trtserve serve --frontends' (default: the server's own default)")
    parser.add_argument("--client", choices=CLIENTS, default="auto", help="open-loop unary client (open sweep, overload, mixed): 'go' (clients/go/build/loadgen, built by 'make loadgen'), 'python' (grpc.aio in the bench process, ~200 us of CPU per call), 'auto' (go when built; default)")
    parser.add_argument("--serve-args", default="", help="more 'trtserve serve' flags for the server under test, one string (e.g. '--max-inflight-rpcs 8')")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0 when every point ran (targets missed or not)."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    unknown = [m for m in args.modes if m not in ALL_MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {unknown}; choose from {','.join(ALL_MODES)}")
    if args.peer and SWEEP_MODE not in args.modes:
        raise SystemExit(f"--peer runs the {SWEEP_MODE} sweep; add it to --modes")
    if args.modes == [POLICY_MODE] and not set(args.models) & set(args.policy_models):
        raise SystemExit(f"mode 'policy' runs only for --policy-models ({','.join(args.policy_models)}), "
                         f"none of which is in --models ({','.join(args.models)})")
    use_go = _open_loop_client(args.client)
    rng = np.random.default_rng(args.seed)
    texts = load_texts(args.data, args.requests, rng) if (args.data / CORPUS).is_file() else []
    workloads = {m: build_workload(args.model_repository / m, args.requests, texts, rng) for m in args.models}
    args.out.mkdir(parents=True, exist_ok=True)
    serve_args = (*(("--frontends", args.frontends) if args.frontends else ()), *shlex.split(args.serve_args))
    with ServerProcess(args.model_repository, *serve_args) as server:
        print(f"server under test: pid {server.pid} at {server.url}", flush=True)
        raws, points = asyncio.run(_bench(args, workloads, server, rng, use_go))
    if args.peer:
        try:
            peer = triton_peer(args.out / "triton", [w.spec for w in workloads.values()])
        except PeerSetupError as exc:
            raise SystemExit(str(exc)) from None
        with peer:
            print(f"peer {args.peer}: pid {peer.pid} at {peer.url}", flush=True)
            points += asyncio.run(_peer_sweep(args, workloads, raws, peer))

    print()
    print(format_tables(points, raws))
    print(format_comparison(points))
    print(format_policy_table(points))
    print(format_overload_table(points))
    print(format_mixed_table(points))
    targets = (check_targets(points, raws) + anchor_targets(points, raws) + policy_targets(points)
               + overload_targets(points) + mixed_targets(points))
    print("targets:")
    for target in targets:
        print("  " + target.line())
    plots = []
    for model, workload in workloads.items():
        mine = [p for p in points if p.model == model and p.server == SERVER and p.mode in MODES]
        if mine:
            plots += [args.out / f"{model}_latency.png", args.out / f"{model}_batches.png"]
            plot_latency(model, mine, raws.get(model), plots[-2])
            plot_batches(model, mine, workload.spec.policy.max_batch_size, plots[-1])
        overload = [p for p in points if p.model == model and p.mode == OVERLOAD_MODE]
        if overload:
            plots.append(args.out / f"{model}_overload.png")
            plot_overload(model, overload, plots[-1])
    wall_s = time.perf_counter() - started
    load_after = os.getloadavg()
    report = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {**_machine(), "loadavg_1min_before": load_before[0], "loadavg_1min_after": load_after[0]},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "command"},
        "open_loop_client": "go" if use_go else "python",
        "raw": {m: r.summary() for m, r in raws.items()},
        "points": [dataclasses.asdict(p) for p in points],
        "targets": [dataclasses.asdict(t) for t in targets],
        "wall_s": wall_s,
    }
    (args.out / "bench.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {args.out / 'bench.json'}, {', '.join(str(p) for p in plots)}")
    print(f"bench finished in {wall_s:.0f} s; 1-minute load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after, on {os.cpu_count()} CPUs")
    return 0


def _open_loop_client(choice: str) -> bool:
    """Whether the open loop's unary calls come from the Go binary: ``go`` insists (SystemExit
    naming what is missing), ``auto`` falls back to Python with one printed line saying why."""
    reason = None if choice == "python" else unavailable_reason(LOADGEN)
    if choice == "go" and reason is not None:
        raise SystemExit(f"--client go: {reason}")
    if choice == "auto" and reason is not None:
        print(f"open loop: the Python client, since {reason}; it costs the bench ~200 us of CPU per call on the "
              "server's cores, so above ~1x capacity its send lag, not the server, sets the overload and mixed figures", flush=True)
    return choice != "python" and reason is None


async def _bench(
    args: argparse.Namespace, workloads: dict[str, Workload], server: ServerProcess, rng: np.random.Generator, use_go: bool,
) -> tuple[dict[str, RawReference], list[Point]]:
    raws: dict[str, RawReference] = {}
    points: list[Point] = []
    channels = open_channels(server.url, args.connections, CHANNEL_OPTIONS)
    channel = channels[0]
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(server.pid), args.warmup, args.duration,
                            server_rss_mib=lambda: tree_rss_mib(server.pid), go=GoLoadgen(server.url) if use_go else None)
        print(f"open-loop unary client: {gen.open_loop_client}", flush=True)
        print(f"{'model':8} {'mode':13} {format_header()}", flush=True)
        for model, workload in workloads.items():
            if not await gen.model_ready(model):
                raise SystemExit(f"model '{model}' is not ready on the server:\n" + "".join(server.output))
            raw = raws[model] = measure_raw(workload, args.raw_duration)
            print(f"{model}: raw best {raw.best.rows_per_s:.1f} rows/s at batch {raw.best.batch}, "
                  f"batch-of-one {raw.batch1_ms:.3f} ms", flush=True)
            for mode in (m for m in MODES if m in args.modes):
                async for point in _sweep(args, gen, workload, raw, mode, points, rng):
                    points.append(point)
                    print(f"{model:8} {mode:13} {format_row(point)}", flush=True)
                if mode == SWEEP_MODE and gen.connections > 1:
                    async for point in _closed_unary(args, gen.with_connections(1), workload, raw, ONE_CONNECTION_MODE):
                        points.append(point)
                        print(f"{model:8} {ONE_CONNECTION_MODE:13} {format_row(point)}", flush=True)
            if POLICY_MODE in args.modes and model in args.policy_models:
                async for point in _policies(args, channel, gen, workload, raw, points, rng):
                    points.append(point)
                    print(f"{model:8} {point.policy:13} {format_row(point)}", flush=True)
            for mode, run_mode in ((OVERLOAD_MODE, _overload), (MIXED_MODE, _mixed)):
                if mode in args.modes:
                    async for point in run_mode(args, channel, gen, workload, raw, points, rng):
                        points.append(point)
                        print(f"{model:8} {mode[:4] + ' ' + (point.policy or ''):13} {format_row(point)}  {_classes_cell(point.classes)}", flush=True)
    finally:
        for c in channels:
            await c.close()
    return raws, points


async def _peer_sweep(
    args: argparse.Namespace, workloads: dict[str, Workload], raws: dict[str, RawReference], peer: ChildServer,
) -> list[Point]:
    """The closed-loop unary sweep against the peer, over as many connections as trtserve
    had; its ratios use the raw references measured beside trtserve."""
    points: list[Point] = []
    channels = open_channels(peer.url, args.connections, CHANNEL_OPTIONS)
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(peer.pid), args.warmup, args.duration)
        for model, workload in workloads.items():
            if not await gen.model_ready(model):
                raise SystemExit(f"model '{model}' is not ready on the peer:\n" + "".join(peer.output))
            async for point in _closed_unary(args, gen, workload, raws[model], SWEEP_MODE, server=args.peer):
                points.append(point)
                print(f"{model:8} {args.peer + ' ' + SWEEP_MODE:13} {format_row(point)}", flush=True)
    finally:
        for c in channels:
            await c.close()
    return points


async def _closed_unary(
    args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference, mode: str, server: str = SERVER,
) -> AsyncIterator[Point]:
    """The closed-loop unary sweep over ``--concurrency``, as points of ``mode`` and ``server``."""
    messages = workload.messages(max(len(workload.requests), max(args.concurrency) + 1))
    for concurrency in args.concurrency:
        window = await gen.closed_unary(workload.spec.name, messages, concurrency)
        yield _point(workload.spec.name, mode, concurrency, None, None, window, raw, server=server, connections=gen.connections)
        await asyncio.sleep(SETTLE_S)


async def _sweep(
    args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference, mode: str,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """The points of one mode for one model, each as soon as it is measured (``done``: the
    points measured before, where the open loop finds its capacity)."""
    model = workload.spec.name
    loop, transport = mode.split("-")
    stream = transport == "stream"

    def point(load: float, fraction: float | None, deadline_us: int | None, window: Window) -> Point:
        return _point(model, mode, load, fraction, deadline_us, window, raw, connections=1 if stream else gen.connections)

    if loop == "closed" and not stream:
        async for p in _closed_unary(args, gen, workload, raw, mode):
            yield p
        return
    if loop == "closed":
        messages = workload.messages(max(len(workload.requests), max(args.concurrency) + 1), with_ids=True)
        for concurrency in args.concurrency:
            yield point(concurrency, None, None, await gen.closed_stream(model, messages, concurrency))
            await asyncio.sleep(SETTLE_S)
        return

    capacity = await _capacity(args, gen, workload, raw, transport, done)
    timeout_us = max(1, round(args.deadline_factor * raw.batch1_ms * 1000))
    for fraction in args.rates:
        rate = fraction * capacity
        arrivals = poisson_arrivals(rate, args.warmup + args.duration + SCHEDULE_SLACK_S, rng)
        if stream:
            window = await gen.open_stream(model, workload.messages(len(arrivals), with_ids=True, timeout_us=timeout_us), arrivals, timeout_us / 1e6)
        else:
            window = await gen.open_unary(model, workload.messages(timeout_us=timeout_us), arrivals, timeout_us / 1e6)
        yield point(rate, fraction, timeout_us, window)
        await asyncio.sleep(SETTLE_S)


async def _capacity(args: argparse.Namespace, gen: LoadGenerator, workload: Workload, raw: RawReference, transport: str,
                    done: list[Point]) -> float:
    """Requests/s (one row each) the closed loop reached over ``transport`` in this run: the
    peak of its sweep, else of a quick closed loop (:data:`CAPACITY_S`, the largest
    ``--concurrency``) measured now and added to ``done`` as mode ``capacity-<transport>``."""
    model = workload.spec.name
    modes = (f"closed-{transport}", f"capacity-{transport}")
    closed = [p.rows_per_s for p in done if p.model == model and p.server == SERVER and p.mode in modes]
    if closed:
        return max(closed)
    callers = max(args.concurrency)
    quick = gen.with_duration(min(args.duration, CAPACITY_S))
    if transport == "stream":
        window = await quick.closed_stream(model, workload.messages(max(len(workload.requests), callers + 1), with_ids=True), callers)
    else:
        window = await quick.closed_unary(model, workload.messages(max(len(workload.requests), callers + 1)), callers)
    point = _point(model, modes[1], callers, None, None, window, raw, connections=1 if transport == "stream" else gen.connections)
    done.append(point)
    print(f"{model:8} {modes[1]:13} {format_row(point)}", flush=True)
    await asyncio.sleep(SETTLE_S)
    return point.rows_per_s


async def _policies(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """The policy comparison for one model: per caller count a closed loop, per rate one
    trace, each run under each policy."""
    model = workload.spec.name
    capacity = await _capacity(args, gen, workload, raw, "stream", done)
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
                        yield _point(model, mode, row, None, None, window, raw, policy=choice.label, connections=gen.connections)
                    else:
                        fraction, arrivals, messages = row
                        window = await measure.open_stream(model, messages, arrivals, timeout_us / 1e6)
                        yield _point(model, mode, fraction * capacity, fraction, timeout_us, window, raw, policy=choice.label)
                    await asyncio.sleep(SETTLE_S)


@contextlib.asynccontextmanager
async def _policy_restored(channel: grpc.aio.Channel, model: str) -> AsyncIterator[None]:
    """The model's batching policy as it was on entry is set again on exit, however the block ends."""
    original = await get_policy(channel, model)
    try:
        yield
    finally:
        await set_policy(channel, model, original.adaptive, original.max_queue_delay_us)


async def _under_policies(
    args: argparse.Namespace, channel: grpc.aio.Channel, model: str, run: Callable[[PolicyChoice], Awaitable[list[Point]]],
) -> AsyncIterator[Point]:
    """``run`` under each policy of ``--policies`` in turn, its points as they come; the
    model's own policy restored at the end."""
    async with _policy_restored(channel, model):
        for choice in args.policies:
            await set_policy(channel, model, choice.adaptive, choice.max_queue_delay_us)
            for point in await run(choice):
                yield point


async def _overload(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """Mode ``overload`` for one model: per multiple of the unary capacity one Poisson trace,
    replayed under each policy, multiples ascending; every request's gRPC deadline and
    ``timeout`` parameter 10× the raw batch-of-one run time, at least 5 ms."""
    model = workload.spec.name
    capacity = await _capacity(args, gen, workload, raw, "unary", done)
    timeout_us = deadline_us(raw.batch1_ms, OVERLOAD_DEADLINE_FACTOR)
    messages = workload.messages(timeout_us=timeout_us)
    span = gen.warmup_s + args.overload_duration + SCHEDULE_SLACK_S
    traces = [(m, poisson_arrivals(m * capacity, span, rng)) for m in sorted(args.overload_multiples)]
    measure = gen.with_duration(args.overload_duration)

    async def sweep(choice: PolicyChoice) -> list[Point]:
        points = []
        for multiple, arrivals in traces:
            window = await measure.open_unary(model, messages, arrivals, timeout_us / 1e6, grpc_deadline=True)
            one = deadline_class("all", timeout_us, window.seconds, window.latency_us, window.codes, window.late_mask)
            points.append(_point(model, OVERLOAD_MODE, multiple * capacity, multiple, timeout_us, window, raw,
                                 policy=choice.label, connections=gen.connections, classes=(one,)))
            await asyncio.sleep(OVERLOAD_SETTLE_S)
        return points

    async for point in _under_policies(args, channel, model, sweep):
        yield point


async def _mixed(
    args: argparse.Namespace, channel: grpc.aio.Channel, gen: LoadGenerator, workload: Workload, raw: RawReference,
    done: list[Point], rng: np.random.Generator,
) -> AsyncIterator[Point]:
    """Mode ``mixed`` for one model: one Poisson trace at 65 % of the unary capacity, each
    arrival tight or loose at random (half each), replayed under each policy."""
    model = workload.spec.name
    capacity = await _capacity(args, gen, workload, raw, "unary", done)
    budgets = mixed_deadlines_us(deadline_us(raw.batch1_ms, MIXED_FACTORS[TIGHT]))
    arrivals = poisson_arrivals(MIXED_FRACTION * capacity, gen.warmup_s + args.mixed_duration + SCHEDULE_SLACK_S, rng)
    tight = rng.random(len(arrivals)) < 0.5
    by_class = {name: workload.messages(timeout_us=us) for name, us in budgets.items()}
    # Message k is arrival k's: its class decides its deadline (the window's keys give it back).
    messages = [by_class[TIGHT if t else LOOSE][k % len(workload.requests)] for k, t in enumerate(tight)]
    deadlines_s = [budgets[TIGHT if t else LOOSE] / 1e6 for t in tight]
    measure = gen.with_duration(args.mixed_duration)

    async def run(choice: PolicyChoice) -> list[Point]:
        window = await measure.open_unary(model, messages, arrivals, deadlines_s, grpc_deadline=True)
        mask = tight[window.keys]
        classes = tuple(
            deadline_class(name, budgets[name], window.seconds, window.latency_us[keep],
                           [c for c, k in zip(window.codes, keep) if k], window.late_mask[keep])
            for name, keep in ((TIGHT, mask), (LOOSE, ~mask))
        )
        point = _point(model, MIXED_MODE, MIXED_FRACTION * capacity, MIXED_FRACTION, None, window, raw,
                       policy=choice.label, connections=gen.connections, classes=classes)
        await asyncio.sleep(OVERLOAD_SETTLE_S)
        return [point]

    async for point in _under_policies(args, channel, model, run):
        yield point


def _classes_cell(classes: tuple[DeadlineClass, ...]) -> str:
    """Progress line: per deadline class its goodput and miss share."""
    return "  ".join(f"{c.name} {c.deadline_ms:.1f} ms: goodput {c.goodput:.0f}/s, missed {c.miss_share:.1%}" for c in classes)


def _point(model: str, mode: str, load: float, fraction: float | None, timeout_us: int | None, window: Window,
           raw: RawReference, policy: str | None = None, server: str = SERVER, connections: int = 1,
           classes: tuple[DeadlineClass, ...] = ()) -> Point:
    return summarize(Measurement(
        model=model, mode=mode, load=load, fraction=fraction, window_s=window.seconds, rows_per_request=1,
        latency_us=window.latency_us, codes=window.codes, late=window.late, deadline_us=timeout_us,
        send_lag_us=window.send_lag_us, before=window.before, after=window.after, policy=policy,
        server=server, connections=connections, classes=classes,
    ), raw.best.rows_per_s)


def _machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "grpcio": grpc.__version__,
    }
