"""``trtserve bench``: served throughput and latency against the raw engine, in one run.

Starts a real server subprocess (``trtserve serve`` on 127.0.0.1, an ephemeral port) and,
for each model:

1. the raw reference while the server is idle: the model's ONNX file in ONNX Runtime
   directly, at batch sizes 1, 2, 4, … max_batch_size (best rows/s, batch-of-one latency);
2. closed loop, a sweep of concurrent callers, over unary ModelInfer and one ModelStreamInfer
   stream; the unary sweep runs over each door of ``--protocol`` (default both): gRPC, and
   HTTP (KServe v2 REST ``POST /v2/models/<model>/infer``, mode ``closed-http``; the server is
   started with ``--allow-http true --http-port 0``);
3. open loop, Poisson arrivals at fractions of the capacity the closed loop measured (per
   transport), each request with a deadline (``timeout`` parameter) of ``--deadline-factor``
   × the raw batch-of-one latency, at least 5 ms (a fast model's 4 × 5 µs no server can meet),
   and at least two raw run times of the batch the closed loop formed at capacity (near capacity
   a request waits for the running batch, then runs in the next: ``deadlines.open_deadline_us``);
4. with ``--connections`` above 1, the closed-loop unary gRPC sweep again with every caller
   on one connection (mode ``closed-1conn``);
5. for ``--policy-models``, the dispatch-policy comparison (``benchlib.policies``): the
   closed-loop unary sweep at ``--policy-concurrency`` callers, and one Poisson trace per rate
   in ``--policy-rates`` replayed over a stream, each under the adaptive policy and each fixed
   queue-delay timer of ``--policies``, deadline ``--policy-deadline-factor`` × the raw run time
   of a full batch (``max_batch_size`` rows), at least 5 ms;
6. ``overload`` (``benchlib.overload``): Poisson arrivals over the unary connections at
   ``--overload-multiples`` × the closed-loop unary capacity (the sweep's peak, or a quick
   closed loop at the largest ``--concurrency`` when the sweep did not run), every request
   with a gRPC deadline and a ``timeout`` parameter of 10× the raw batch-of-one run time (at
   least 5 ms), under each policy of ``--policies``. With ``--open-door http`` (the Go client
   only) over the HTTP door instead: multiples of the HTTP door's closed-loop capacity, KServe v2
   JSON bodies, each deadline in the ``trtserve-timeout-us`` header (and the client's own, 1 ms
   later) instead of the gRPC deadline; the tables' ``door`` column says which;
7. ``mixed``: Poisson at 65 % of that capacity, half the requests (at random) with a tight
   deadline (10× batch of one, at least 5 ms) and half with a loose one (10× the tight), under
   each policy of ``--policies``; over ``--open-door`` as ``overload``;
8. ``refusals`` (``benchlib.refusals``): per door of ``--protocol``, the closed loop at the
   largest ``--concurrency`` answered in full, then again with the model's queue held full (one
   request parked in it: ``max_queue_size`` 1 and a fixed queue delay of 600 s, set with
   ModelControl/SetPolicy and restored after), every call refused RESOURCE_EXHAUSTED (HTTP
   429); ρ = server CPU per refusal ÷ per answer, beside the goodput bound at 2× and 3×
   overload it implies, (1 − kρ)/(1 − ρ);
9. ``embeddings`` (``benchlib.embeddings``, minilm only; the server under test then also opens
   its HTTP door, ``--allow-http true --http-port 0``): sentence embeddings through
   ``POST /v1/embeddings``, requests of 1 and of 32 corpus sentences, closed loop at each
   ``--concurrency``; texts/s, p50/p99, errors and the server's CPU per text. Then long texts
   (``benchlib.longtext``): ~2,000-word documents of corpus sentences, one per request at each
   ``--long-text-callers``, sent whole with ``"long_text": "chunk"`` beside the same windows sent
   as separate texts and pooled by the client; the chunk/windows ratios (pooling must cost < 5 %).
10. ``gpu-shaped`` (``benchlib.gpushaped``; a server of its own, whatever ``--models``): the
    ``slow`` model copied with a GPU-like curve (4 ms + 0.1 ms a row, max batch 64, asleep),
    requests of ``--gpu-rows`` rows: closed loop against the engine's capacity, open loop at 80 %
    of it against the simulator's ideal, overload and mixed deadlines at multiples of it; with
    ``--peer triton``, the Triton peer on the same ``model.py`` too, the same traces.
11. ``queue`` (``benchlib.queue_door``, minilm only; a redis-server and a server of its own, ``trtserve
    serve --redis-url``; skipped with a sentence without ``redis-server``): minilm captions through
    the queue door (Redis Streams) against the same captions over the gRPC stream, at each
    ``--concurrency`` outstanding: texts/s, p50/p99, pickup delay p50/p99, server CPU per request.

The open-loop unary calls (open sweep, overload, mixed) come from the Go load generator
(``clients/go/loadgen``, ``make loadgen``; ``benchlib.goclient``) when it is built, else, with
one printed line saying so, from the bench's ``grpc.aio`` client (``--client``): a Python call
costs the bench far more CPU, on the server's cores, than the Go binary's, so beyond a fast
model's capacity the Python client's own send lag, not the server, sets the figures.

Unary gRPC calls are spread over ``--connections`` client connections (gRPC channels, default
8): the server's front-end processes share its port, and the kernel spreads connections, not
requests. Over HTTP (``benchlib.httpclient``: aiohttp, bodies built before the clock as
``tritonclient.http`` sends them by default, binary tensor extension in and out) each caller
holds one kept-alive connection, since HTTP/1.1 carries one request at a time on a
connection. Then, unless ``--no-floor``, the null server (``benchlib.null_server``: grpcio and
uvicorn answering each parsed request with a canned reply) runs the same closed-loop unary
sweep over the same doors: the transport's floor, which trtserve's server CPU per call is set
against (``benchlib.floor``). With ``--peer triton``, trtserve is then stopped and NVIDIA PyTriton
(``benchlib.peer``; its own venv under ``OUT/triton``, made once) serves the same model
files with Triton's dynamic batcher; the same load generators run the closed-loop unary
sweep against it over the same doors, a comparison table gives the trtserve/Triton ratios
per row (gRPC), and a table by door sets every server's sweep over gRPC beside HTTP. With
``--peer infinity`` (``benchlib.infinity``; its own venv under ``OUT/infinity``, made once),
Infinity (``infinity-emb``) serves all-MiniLM-L6-v2 from local files and the ``embeddings``
mode runs against it, after trtserve and Triton; ``--peer triton,infinity`` runs both, one
server at a time.

Each point reports achieved rows/s, p50/p90/p99 latency (ms, send → answer), errors by
status (gRPC status names; over HTTP ``HTTP <status>``), deadline misses, the server's mean
batch size (ModelStatistics deltas), the ratio of served rows/s to the raw best-batch rows/s,
the CPU time per request (µs) of the server (its whole process tree) and of the bench client,
and the server tree's resident memory (MiB) at the start of the window and after its last
answer. Overload and mixed points add, per
deadline class, goodput, late answers, refusals by status and p50/p99 of the OK answers.
Output: tables and the targets (PASS/MISS) on the terminal, ``OUT/bench.json``,
``OUT/<model>_latency.png``, ``OUT/<model>_batches.png`` and, with the overload mode,
``OUT/<model>_overload.png`` (goodput against offered load per policy). Targets are reported,
never turned into an exit status. The points of each mode are measured in
:mod:`~trtserve.harness.benchlib.sweeps`.
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
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime

from trtserve.client import CHANNEL_OPTIONS
from trtserve.harness.benchlib.compare import ONE_CONNECTION_MODE, SWEEP_MODE, anchor_targets, format_comparison
from trtserve.harness.benchlib.deadlines import DeadlineClass
from trtserve.harness.benchlib.embeddings import (
    EMBEDDINGS_MODE,
    EMBEDDINGS_MODEL,
    embeddings_targets,
    format_embeddings_table,
    trtserve_points,
)
from trtserve.harness.benchlib.floor import floor_targets
from trtserve.harness.benchlib.goclient import LOADGEN, GoLoadgen, unavailable_reason
from trtserve.harness.benchlib.gpushaped import (
    GPU_MODE,
    ROWS_PER_REQUEST,
    format_gpu_table,
    gpu_shaped_points,
    gpu_targets,
)
from trtserve.harness.benchlib.httpclient import RestClient
from trtserve.harness.benchlib.infinity import infinity_points
from trtserve.harness.benchlib.load import LoadGenerator, open_channels
from trtserve.harness.benchlib.longtext import (
    LONG_TEXT_CALLERS,
    format_long_text_table,
    long_text_targets,
    trtserve_long_text_run,
)
from trtserve.harness.benchlib.null_server import null_server
from trtserve.harness.benchlib.overload import (
    MIXED_MODE,
    OVERLOAD_MODE,
    OVERLOAD_MULTIPLES,
    format_mixed_table,
    format_overload_table,
    mixed_targets,
    overload_targets,
)
from trtserve.harness.benchlib.peer import PEERS, PeerSetupError, triton_peer
from trtserve.harness.benchlib.plots import plot_batches, plot_latency, plot_overload
from trtserve.harness.benchlib.policies import (
    DEFAULT_POLICIES,
    PolicyChoice,
    format_policy_table,
    parse_policies,
    policy_targets,
)
from trtserve.harness.benchlib.proctree import tree_cpu_seconds, tree_rss_mib
from trtserve.harness.benchlib.protocols import (
    GRPC,
    HTTP,
    HTTP_MODE,
    PROTOCOLS,
    format_protocol_table,
    parse_protocols,
    protocol_targets,
)
from trtserve.harness.benchlib.queue_door import (
    QUEUE_MODE,
    QUEUE_MODEL,
    format_queue_table,
    queue_points,
    queue_targets,
)
from trtserve.harness.benchlib.raw import measure_raw
from trtserve.harness.benchlib.refusals import REFUSAL_MODE, format_refusal_table, refusal_targets
from trtserve.harness.benchlib.report import (
    FLOOR,
    MODES,
    SERVER,
    Point,
    RawReference,
    check_targets,
    format_header,
    format_row,
    format_tables,
)
from trtserve.harness.benchlib.sweeps import (
    closed_unary,
    mixed_points,
    mode_points,
    overload_points,
    policy_points,
    refusal_points,
)
from trtserve.harness.benchlib.workload import CORPUS, Workload, build_workload, load_texts
from trtserve.testing import ChildServer, ServerProcess

LEARNED_CAP_ROWS = 64
"""Where a model's config leaves ``max_batch_size`` to the server (which then learns the batch cap
while serving, below a hard limit of up to 1024 rows), the bench's raw reference and its
full-batch requests go up to this many rows: past a CPU engine's knee (16-32 rows here)."""

DEFAULT_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
POLICY_MODE = "policy"
"""The ``--modes`` item that runs the dispatch-policy comparison."""
ALL_MODES = (*MODES, POLICY_MODE, OVERLOAD_MODE, MIXED_MODE, REFUSAL_MODE, EMBEDDINGS_MODE, GPU_MODE, QUEUE_MODE)
CLIENTS = ("auto", "go", "python")
"""``--client``: the open loop's unary client; ``auto`` is the Go binary when it is built."""
OPEN_LOOP_MODES = (OVERLOAD_MODE, MIXED_MODE)
"""The modes ``--open-door`` sends over."""


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


def _protocol_list(text: str) -> list[str]:
    try:
        return parse_protocols(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _peers(text: str) -> list[str]:
    names = _names(text)
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {unknown or text!r}; choose from {','.join(PEERS)}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench-results"), help="output directory (default: bench-results)")
    add("--data", type=Path, default=DEFAULT_DATA,
        help=f"shared data directory with {CORPUS} (default: ../shared/data beside the repository)")
    add("--models", type=_names, default=["tiny", "minilm"],
        help="models to drive, comma-separated (default: tiny,minilm)")
    add("--modes", type=_names, default=list(ALL_MODES),
        help=f"sweeps to run, comma-separated (default: {','.join(ALL_MODES)})")
    add("--concurrency", type=_ints, default=[1, 4, 16, 64],
        help="closed loop: callers (unary) or requests in flight (stream) per point (default: 1,4,16,64)")
    add("--rates", type=_floats, default=[0.5, 0.8, 1.0],
        help="open loop: arrival rates as fractions of the measured capacity (default: 0.5,0.8,1.0)")
    add("--duration", type=float, default=5.0, help="seconds measured per point (default: 5)")
    add("--warmup", type=float, default=1.0, help="unmeasured seconds before each point's window (default: 1)")
    add("--raw-duration", type=float, default=1.5,
        help="seconds per batch size of the raw reference (default: 1.5)")
    add("--deadline-factor", type=float, default=4.0,
        help="open loop: request deadline as a multiple of the raw batch-of-one latency, at least 5 ms and "
             "two raw runs of the closed loop's batch at capacity (default: 4)")
    add("--policy-models", type=_names, default=["tiny", "minilm"],
        help="models of the policy comparison (mode 'policy'), comma-separated (default: tiny,minilm)")
    add("--policies", type=_policy_list, default=parse_policies(DEFAULT_POLICIES),
        help="policy comparison, overload and mixed modes: 'adaptive' and 'fixed:<queue delay ms>' items "
             f"(default: {DEFAULT_POLICIES})")
    add("--policy-concurrency", type=_ints, default=[16, 64],
        help="policy comparison: closed-loop unary callers per row (default: 16,64)")
    add("--policy-rates", type=_floats, default=[0.5, 0.8],
        help="policy comparison: arrival rates as fractions of the measured stream capacity (default: 0.5,0.8)")
    add("--policy-deadline-factor", type=float, default=3.0,
        help="policy comparison: request deadline as a multiple of the raw run time of a full batch (default: 3, "
             "the ratio of the simulator comparison: 10 ms deadline, 3.6 ms full batch)")
    add("--policy-rounds", type=_positive_int, default=2,
        help="policy comparison: sweeps over every (rate, policy), order alternating (default: 2)")
    add("--policy-duration", type=float, default=3.0,
        help="policy comparison: seconds measured per point (default: 3)")
    add("--overload-multiples", type=_floats, default=list(OVERLOAD_MULTIPLES),
        help="overload: arrival rates as multiples of the closed-loop unary capacity (default: 0.5,1,2,3)")
    add("--overload-duration", type=float, default=3.0, help="overload: seconds measured per point (default: 3)")
    add("--mixed-duration", type=float, default=5.0, help="mixed: seconds measured per point (default: 5)")
    add("--requests", type=int, default=1024, help="distinct prebuilt requests per model (default: 1024)")
    add("--seed", type=int, default=0, help="seed of the inputs and the Poisson arrivals (default: 0)")
    add("--protocol", type=_protocol_list, default=list(PROTOCOLS),
        help="doors of the closed-loop unary sweep (closed-unary), comma-separated: 'grpc', 'http' (KServe v2 "
             "REST, binary tensors, one kept-alive connection per caller); with --peer, for the peer too "
             "(default: grpc,http)")
    add("--connections", type=_positive_int, default=8,
        help="client connections (gRPC channels) the unary callers are spread over, for every server; above 1 "
             "the closed-loop unary sweep also runs over one (default: 8)")
    add("--peer", type=_peers, default=[],
        help="also drive these servers on the same model, same run, one at a time, comma-separated: 'triton' "
             "(NVIDIA PyTriton from PyPI, installed once into OUT/triton/venv; the closed-loop unary sweep), "
             "'infinity' (infinity-emb from PyPI, installed once into OUT/infinity/venv; the embeddings mode)")
    add("--floor", action=argparse.BooleanOptionalAction, default=True,
        help="also drive the null server (grpcio and uvicorn answering each parsed request with a canned reply: "
             "the transport's floor) with the closed-loop unary sweep over the same doors, after trtserve "
             "(default: on; --no-floor to skip)")
    add("--frontends", help="passed to 'trtserve serve --frontends' (default: the server's own default)")
    add("--client", choices=CLIENTS, default="auto",
        help="open-loop unary client (open sweep, overload, mixed): 'go' (clients/go/build/loadgen, built by "
             "'make loadgen'), 'python' (grpc.aio in the bench process, ~200 us of CPU per call), "
             "'auto' (go when built; default)")
    add("--open-door", choices=PROTOCOLS, default=GRPC,
        help="door of the overload and mixed modes' open loop: 'grpc' (default) or 'http' (KServe v2 REST, JSON "
             "bodies, deadline in the trtserve-timeout-us header; multiples of the HTTP door's capacity; the Go "
             "client only)")
    add("--serve-args", default="",
        help="more 'trtserve serve' flags for the server under test, one string (e.g. '--max-inflight-rpcs 8')")
    add("--long-text-callers", type=_ints, default=list(LONG_TEXT_CALLERS),
        help=f"mode '{EMBEDDINGS_MODE}', long texts: callers per point, comma-separated "
             f"(default: {','.join(map(str, LONG_TEXT_CALLERS))})")
    add("--gpu-rows", type=_ints, default=list(ROWS_PER_REQUEST),
        help=f"mode '{GPU_MODE}': rows per request, one set of points each, comma-separated "
             f"(default: {','.join(map(str, ROWS_PER_REQUEST))})")

def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0 when every point ran (targets missed or not)."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    unknown = [m for m in args.modes if m not in ALL_MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {unknown}; choose from {','.join(ALL_MODES)}")
    if "triton" in args.peer and SWEEP_MODE not in args.modes and GPU_MODE not in args.modes:
        raise SystemExit(f"--peer triton runs the {SWEEP_MODE} sweep and the {GPU_MODE} mode; add one to --modes")
    # Every mode but gpu-shaped and queue (which start servers of their own) drives the server on --models.
    main = [m for m in args.modes if m not in (GPU_MODE, QUEUE_MODE)]
    queue = QUEUE_MODE in args.modes and QUEUE_MODEL in args.models
    if QUEUE_MODE in args.modes and not queue:
        print(f"mode '{QUEUE_MODE}' skipped: it runs only on {QUEUE_MODEL}, which is not in --models", flush=True)
    embeddings = EMBEDDINGS_MODE in args.modes and EMBEDDINGS_MODEL in args.models
    if "infinity" in args.peer and not embeddings:
        raise SystemExit(f"--peer infinity runs the {EMBEDDINGS_MODE} mode on {EMBEDDINGS_MODEL}; add them to "
                         "--modes and --models")
    if EMBEDDINGS_MODE in args.modes and not embeddings:
        if args.modes == [EMBEDDINGS_MODE]:
            raise SystemExit(f"mode '{EMBEDDINGS_MODE}' runs only on {EMBEDDINGS_MODEL}, which is not in --models")
        print(f"mode '{EMBEDDINGS_MODE}' skipped: it runs only on {EMBEDDINGS_MODEL}, which is not in --models",
              flush=True)
    if args.modes == [POLICY_MODE] and not set(args.models) & set(args.policy_models):
        raise SystemExit(f"mode 'policy' runs only for --policy-models ({','.join(args.policy_models)}), "
                         f"none of which is in --models ({','.join(args.models)})")
    use_go = _open_loop_client(args.client)
    open_http = args.open_door == HTTP and bool(set(OPEN_LOOP_MODES) & set(args.modes))
    if open_http and not use_go:
        raise SystemExit("--open-door http: the open loop over HTTP is the Go load generator's (--client go or auto, "
                         "with `make loadgen` built)")
    rng = np.random.default_rng(args.seed)
    texts = load_texts(args.data, args.requests, rng) if (main or queue) and (args.data / CORPUS).is_file() else []
    workloads = {m: build_workload(args.model_repository / m, args.requests, texts, rng)
                 for m in (args.models if main else [QUEUE_MODEL] if queue else [])}
    args.out.mkdir(parents=True, exist_ok=True)
    frontends = ("--frontends", args.frontends) if args.frontends else ()
    raws: dict[str, RawReference] = {}
    points: list[Point] = []
    embedding_points = []
    long_text = None
    if main:
        serve_args = (*frontends,
                      *(("--allow-http", "true", "--http-port", "0")
                        if HTTP in args.protocol or embeddings or open_http else ()),
                      *shlex.split(args.serve_args))
        with ServerProcess(args.model_repository, *serve_args) as server:
            http = f", HTTP at {server.http_url}" if server.http_url else ""
            print(f"server under test: pid {server.pid} at {server.url}{http}", flush=True)
            raws, points = asyncio.run(_bench(args, workloads, server, rng, use_go))
            embedding_points = trtserve_points(args, server, texts) if embeddings else []
            long_text = trtserve_long_text_run(args, server, texts) if embeddings else None
    if args.floor and SWEEP_MODE in args.modes:
        with null_server() as floor:
            print(f"null server (the transport's floor): pid {floor.pid} at {floor.url}, HTTP at {floor.http_url}",
                  flush=True)
            points += asyncio.run(_peer_sweep(args, workloads, raws, floor, FLOOR))
    if "triton" in args.peer and SWEEP_MODE in args.modes:
        try:
            peer = triton_peer(args.out / "triton", [w.spec for w in workloads.values()])
        except PeerSetupError as exc:
            raise SystemExit(str(exc)) from None
        with peer:
            http = f", HTTP at {peer.http_url}" if peer.http_url else ""
            print(f"peer triton: pid {peer.pid} at {peer.url}{http}", flush=True)
            points += asyncio.run(_peer_sweep(args, workloads, raws, peer, "triton"))
    if "infinity" in args.peer:
        embedding_points += infinity_points(args, [w.spec for w in workloads.values()], texts)
    gpu_points, ideals = (gpu_shaped_points(args, (*frontends, *shlex.split(args.serve_args)), use_go)
                          if GPU_MODE in args.modes else ([], {}))
    queue_results = queue_points(args, (*frontends, *shlex.split(args.serve_args)), workloads[QUEUE_MODEL]) \
        if queue else []

    print()
    print(format_tables(points, raws))
    print(format_comparison(points))
    print(format_protocol_table(points))
    print(format_policy_table(points))
    print(format_overload_table(points))
    print(format_mixed_table(points))
    print(format_refusal_table(points))
    print(format_embeddings_table(embedding_points))
    print(format_long_text_table(long_text))
    print(format_gpu_table(gpu_points, ideals))
    print(format_queue_table(queue_results))
    targets = (check_targets(points, raws) + anchor_targets(points, raws) + protocol_targets(points)
               + floor_targets(points)
               + policy_targets(points) + overload_targets(points) + mixed_targets(points) + refusal_targets(points)
               + embeddings_targets(embedding_points) + long_text_targets(long_text) + gpu_targets(gpu_points, ideals)
               + queue_targets(queue_results))
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
        "embeddings": [dataclasses.asdict(p) for p in embedding_points],
        "embeddings_long_text": dataclasses.asdict(long_text) if long_text else None,
        GPU_MODE: {"points": [dataclasses.asdict(p) for p in gpu_points], "simulator_ideal_misses": ideals},
        QUEUE_MODE: [dataclasses.asdict(p) for p in queue_results],
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
              "server's cores, so above ~1x capacity its send lag, not the server, sets the overload and mixed "
              "figures", flush=True)
    return choice != "python" and reason is None


async def _bench(
    args: argparse.Namespace, workloads: dict[str, Workload], server: ServerProcess, rng: np.random.Generator,
    use_go: bool,
) -> tuple[dict[str, RawReference], list[Point]]:
    raws: dict[str, RawReference] = {}
    points: list[Point] = []
    channels = open_channels(server.url, args.connections, CHANNEL_OPTIONS)
    channel = channels[0]
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(server.pid), args.warmup, args.duration,
                            server_rss_mib=lambda: tree_rss_mib(server.pid),
                            go=GoLoadgen(server.url) if use_go else None)
        print(f"open-loop unary client: {gen.open_loop_client}; overload and mixed over {args.open_door}", flush=True)
        print(f"{'model':8} {'mode':13} {format_header()}", flush=True)
        for model, workload in workloads.items():
            if not await gen.model_ready(model):
                raise SystemExit(f"model '{model}' is not ready on the server:\n" + "".join(server.output))
            if workload.spec.choose_batch_size:
                # The server learns the cap below the hard limit it reports (up to 1024 rows):
                # the raw reference and the full-batch requests go up to LEARNED_CAP_ROWS.
                served = min(await gen.max_batch_size(model), LEARNED_CAP_ROWS)
                workload = workloads[model] = workload.served_with(served)
                print(f"{model}: the server learns its batch cap; measured up to {served} rows", flush=True)
            raw = raws[model] = measure_raw(workload, args.raw_duration)
            print(f"{model}: raw best {raw.best.rows_per_s:.1f} rows/s at batch {raw.best.batch}, "
                  f"batch-of-one {raw.batch1_ms:.3f} ms", flush=True)
            for mode in (m for m in MODES if m in args.modes):
                sweeps = (_unary_sweeps(args, gen, server, workload, raw) if mode == SWEEP_MODE
                          else mode_points(args, gen, workload, raw, mode, points, rng))
                async for point in sweeps:
                    points.append(point)
                    print(f"{model:8} {point.mode:13} {format_row(point)}", flush=True)
            if POLICY_MODE in args.modes and model in args.policy_models:
                async for point in policy_points(args, channel, gen, workload, raw, points, rng):
                    points.append(point)
                    print(f"{model:8} {point.policy:13} {format_row(point)}", flush=True)
            async with _open_loop_door(args, gen, server) as open_gen:
                for mode, run_mode in ((OVERLOAD_MODE, overload_points), (MIXED_MODE, mixed_points)):
                    if mode in args.modes:
                        async for point in run_mode(args, channel, open_gen, workload, raw, points, rng):
                            points.append(point)
                            label = mode[:4] + " " + (point.policy or "")
                            print(f"{model:8} {label:13} {format_row(point)}  {_classes_cell(point.classes)}",
                                  flush=True)
            if REFUSAL_MODE in args.modes:
                async for point in refusal_points(args, channel, gen, server, workload, raw):
                    points.append(point)
                    print(f"{model:8} {point.mode:13} {format_row(point)}", flush=True)
    finally:
        for c in channels:
            await c.close()
    return raws, points


@contextlib.asynccontextmanager
async def _open_loop_door(args: argparse.Namespace, gen: LoadGenerator,
                          server: ServerProcess) -> AsyncIterator[LoadGenerator]:
    """``gen`` for the overload and mixed modes: as it is for ``--open-door grpc``; for ``http``
    over ``server``'s HTTP door, the open loop from the Go binary and the capacity's quick closed
    loop (where the ``closed-http`` sweep did not run) from a REST client of the largest
    ``--concurrency`` connections, closed on exit."""
    if args.open_door != HTTP or not set(OPEN_LOOP_MODES) & set(args.modes):
        yield gen
        return
    async with RestClient(server.http_url, max(args.concurrency)) as rest:
        yield gen.over_http(rest, GoLoadgen(server.http_url))


async def _unary_sweeps(
    args: argparse.Namespace, gen: LoadGenerator, server: ChildServer, workload: Workload, raw: RawReference,
    name: str = SERVER,
) -> AsyncIterator[Point]:
    """The closed-loop unary sweep of ``server`` (called ``name`` in the points) over each door
    of ``--protocol``: over gRPC (for trtserve with ``--connections`` above 1, again over one
    connection), then over HTTP at ``server.http_url``.

    Raises:
        SystemExit: HTTP asked of a server that announced no HTTP door.
    """
    if GRPC in args.protocol:
        async for point in closed_unary(args, gen, workload, raw, SWEEP_MODE, server=name):
            yield point
        if name == SERVER and gen.connections > 1:
            async for point in closed_unary(args, gen.with_connections(1), workload, raw, ONE_CONNECTION_MODE):
                yield point
    if HTTP in args.protocol:
        if not server.http_url:
            raise SystemExit(f"--protocol http: {server.name} announced no HTTP door:\n" + "".join(server.output))
        async with RestClient(server.http_url, max(args.concurrency)) as rest:
            async for point in closed_unary(args, gen.over_http(rest), workload, raw, HTTP_MODE, server=name):
                yield point


async def _peer_sweep(
    args: argparse.Namespace, workloads: dict[str, Workload], raws: dict[str, RawReference], peer: ChildServer,
    name: str,
) -> list[Point]:
    """The closed-loop unary sweep against the peer (or the null server) called ``name`` over
    the same doors, as many gRPC connections as trtserve had; its ratios use the raw references
    measured beside trtserve."""
    points: list[Point] = []
    channels = open_channels(peer.url, args.connections, CHANNEL_OPTIONS)
    try:
        gen = LoadGenerator(channels, lambda: tree_cpu_seconds(peer.pid), args.warmup, args.duration)
        for model, workload in workloads.items():
            if not await gen.model_ready(model):
                raise SystemExit(f"model '{model}' is not ready on the peer:\n" + "".join(peer.output))
            async for point in _unary_sweeps(args, gen, peer, workload, raws[model], name=name):
                points.append(point)
                print(f"{model:8} {name + ' ' + point.mode:13} {format_row(point)}", flush=True)
    finally:
        for c in channels:
            await c.close()
    return points


def _classes_cell(classes: tuple[DeadlineClass, ...]) -> str:
    """Progress line: per deadline class its goodput and miss share."""
    return "  ".join(f"{c.name} {c.deadline_ms:.1f} ms: goodput {c.goodput:.0f}/s, missed {c.miss_share:.1%}"
                     for c in classes)


def _machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
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
