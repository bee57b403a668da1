"""``trtserve profile MODEL``: throughput and latency against batch size, and what to configure.

Runs the model's engine directly (no server, no queue) on synthetic rows at batch sizes 1, 2,
4, ... ``max_batch_size`` (where the config leaves ``max_batch_size`` to the server: until
throughput stops growing, as the server's own search at load, :mod:`trtserve.engine.warmup`)
— and, for inputs with variable-length dims, at several padded lengths — timing each point as
the median of ``--repeats`` runs. Prints the table, writes a PNG plot (rows/s and batch latency
against batch size), and recommends ``max_batch_size``: the knee, the smallest batch within
``--tolerance`` of peak throughput whose latency fits ``--latency-budget-ms`` (the same rule as
the dispatcher's ``adaptive_batch_size`` and the server's choice at load).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from trtserve.batching.policy import knee
from trtserve.engine.warmup import KNEE_TOLERANCE, batch_sizes, search_limit
from trtserve.runtimes.base import batch_limit
from trtserve.tools import ToolError, fail, model_dir, model_failure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model name in the repository")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 128],
                        help="padded lengths for variable dims (default: 16 64 128)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point (median; default: 5)")
    parser.add_argument("--latency-budget-ms", type=float, default=float("inf"),
                        help="largest acceptable batch latency, ms")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="knee: within this fraction of peak rows/s (default: 0.05)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: <model>-profile.png)")


async def measure(root: Path, name: str, lengths: list[int], repeats: int) -> dict[int, dict[int, float]]:
    """length → batch size → median seconds per batch, on the model's own engine.

    Raises:
        ToolError: no such repository or model, the model does not load, or its engine fails
            on a batch (the message says which, with the reason).
    """
    from trtserve import runtimes
    from trtserve.engine.model import sample_inputs
    from trtserve.repository import load_spec
    from trtserve.runtimes.base import Batch

    directory = model_dir(root, name)
    try:
        spec = load_spec(directory)
        backend = await asyncio.to_thread(runtimes.create, spec)
    except Exception as exc:  # whatever stops it loading is the user's one line
        raise model_failure(name, "cannot load", exc) from exc
    try:
        variable = any(-1 in t.dims for t in backend.inputs)
        # A config that leaves max_batch_size to the server: up to what the server may choose,
        # and, as its search at load, only until throughput stops growing.
        limit = search_limit(batch_limit(backend)) if spec.choose_batch_size else spec.policy.rows_per_batch
        sizes = batch_sizes(limit)
        table: dict[int, dict[int, float]] = {}
        for length in lengths if variable else [1]:
            table[length] = {}
            for rows in sizes:
                try:
                    inputs = backend.prepare(sample_inputs(backend.inputs, rows, length))
                    batch = Batch((inputs,), rows)
                    await backend.run(0, batch)  # warm
                    times = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        await backend.run(0, batch)
                        times.append(time.perf_counter() - start)
                except Exception as exc:  # the engine failing on a synthetic batch
                    raise model_failure(name, f"failed on a batch of {rows} (length {length})", exc) from exc
                table[length][rows] = float(np.median(times))
                if spec.choose_batch_size and rows > 1 and not growing(table[length]):
                    break
        return table
    finally:
        await backend.aclose()


def growing(curve: dict[int, float]) -> bool:
    """Whether the last size of ``curve`` (batch size → seconds, ascending) has more than
    :data:`~trtserve.engine.warmup.KNEE_TOLERANCE` more rows/s than every smaller one."""
    *before, (rows, seconds) = curve.items()
    return rows / seconds > (1 + KNEE_TOLERANCE) * max(b / t for b, t in before)


def run(args: argparse.Namespace) -> int:
    """Exit status: 0, or 2 where the model could not be profiled (one line on stderr)."""
    try:
        table = asyncio.run(measure(args.model_repository, args.model, args.lengths, args.repeats))
    except ToolError as exc:
        return fail("profile", exc)
    budget = args.latency_budget_ms / 1e3
    print(f"{args.model}: engine alone, median of {args.repeats} runs")
    print(f"{'length':>6} {'batch':>6} {'latency ms':>11} {'rows/s':>9}")
    for length, curve in table.items():
        for rows, seconds in curve.items():
            print(f"{length:6d} {rows:6d} {seconds * 1e3:11.2f} {rows / seconds:9.0f}")
    limit = max(max(c) for c in table.values())
    knees = {length: knee(curve, budget, args.tolerance) or limit for length, curve in table.items()}
    for length, size in knees.items():
        seconds = table[length][size]
        print(f"knee at length {length}: batch {size} ({size / seconds:.0f} rows/s, {seconds * 1e3:.1f} ms)")
    choice = max(knees.values())
    print(f"recommended: max_batch_size: {choice}   "
          "(config.pbtxt; or leave it out, or set parameters adaptive_batch_size \"true\", and the server "
          "learns the cap while serving)")

    try:
        import matplotlib
    except ImportError:  # a dev extra; the table and the recommendation above stand without it
        print("plot: skipped (matplotlib is not installed: pip install matplotlib)")
        return 0

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for length, curve in table.items():
        sizes = list(curve)
        label = f"length {length}" if len(table) > 1 else None
        ax1.plot(sizes, [b / curve[b] for b in sizes], marker="o", label=label)
        ax2.plot(sizes, [curve[b] * 1e3 for b in sizes], marker="o", label=label)
    ax1.set(xscale="log", xlabel="batch size (rows)", ylabel="rows/s", title=f"{args.model}: throughput")
    ax2.set(xscale="log", xlabel="batch size (rows)", ylabel="batch latency (ms)", title="latency")
    for ax in (ax1, ax2):
        ax.axvline(choice, color="gray", linestyle=":")
        if len(table) > 1:
            ax.legend()
    path = args.plot or Path(f"{args.model}-profile.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")
    return 0
