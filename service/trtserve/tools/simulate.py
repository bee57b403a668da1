"""``trtserve simulate``: compare dispatch policies on the same arrival trace.

Drives the real dispatcher on a fake clock (:mod:`trtserve.batching.simulate`) with an engine
whose batch of b rows takes ``fixed + per_row·b`` milliseconds, under Poisson (or bursty)
arrivals at several fractions of capacity (capacity = ``max_batch_size`` / run time of a full
batch), each request with the same relative deadline. Prints, per load, the fixed-timer
policies (queue delay 0.5, 2 and 10 ms) next to the adaptive one: goodput, deadline-miss
rate, engine time spent on rows that finished late, mean batch size and latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path

from ..config import BatchingPolicy
from ..batching.simulate import SimResult, affine, bursty_trace, poisson_trace, simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fixed-ms", type=float, default=2.0, help="engine time per batch, ms (default: 2)")
    parser.add_argument("--per-row-ms", type=float, default=0.1, help="engine time per row, ms (default: 0.1)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="batch cap in rows (default: 16)")
    parser.add_argument("--deadline-ms", type=float, default=10.0, help="each request's deadline after arrival, ms (default: 10)")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.2, 0.5, 0.8, 0.95], help="fractions of capacity (default: 0.2 0.5 0.8 0.95)")
    parser.add_argument("--timers-ms", type=float, nargs="+", default=[0.5, 2.0, 10.0], help="fixed queue delays to compare, ms")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of simulated arrivals per point (default: 2)")
    parser.add_argument("--bursty", action="store_true", help="bursty arrivals (all in the first quarter of every 100 ms)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")


def compare(
    *,
    fixed: float,
    per_row: float,
    max_batch_size: int,
    deadline: float,
    loads: list[float],
    timers: list[float],
    duration: float,
    bursty: bool = False,
    seed: int = 0,
) -> dict[float, dict[str, SimResult]]:
    """load → policy name → result, every policy on the same trace per load (times in seconds)."""
    latency = affine(fixed, per_row)
    capacity = max_batch_size / latency(max_batch_size)
    policies = {f"fixed {t * 1e3:g} ms": BatchingPolicy(max_batch_size=max_batch_size, max_queue_delay=t, adaptive=False) for t in timers}
    policies["adaptive"] = BatchingPolicy(max_batch_size=max_batch_size)
    results: dict[float, dict[str, SimResult]] = {}
    for load in loads:
        make = bursty_trace if bursty else poisson_trace
        trace = make(load * capacity, duration, seed=seed)
        results[load] = {
            name: asyncio.run(simulate(policy, trace, deadline=deadline, latency=latency)) for name, policy in policies.items()
        }
    return results


def run(args: argparse.Namespace) -> int:
    results = compare(
        fixed=args.fixed_ms / 1e3,
        per_row=args.per_row_ms / 1e3,
        max_batch_size=args.max_batch_size,
        deadline=args.deadline_ms / 1e3,
        loads=args.loads,
        timers=[t / 1e3 for t in args.timers_ms],
        duration=args.duration,
        bursty=args.bursty,
        seed=args.seed,
    )
    print(f"engine {args.fixed_ms:g} ms + {args.per_row_ms:g} ms/row, max batch {args.max_batch_size}, "
          f"deadline {args.deadline_ms:g} ms, {'bursty' if args.bursty else 'Poisson'} arrivals, {args.duration:g} s per point")
    print(f"{'load':>5} {'policy':<14} {'goodput/s':>10} {'miss %':>7} {'late engine ms':>15} {'mean batch':>10} {'p50 ms':>7} {'p99 ms':>7}")
    for load, by_policy in results.items():
        for name, r in by_policy.items():
            print(f"{load:5.0%} {name:<14} {r.goodput:10.0f} {100 * r.miss_rate:7.2f} {1e3 * r.late_engine_seconds:15.2f} "
                  f"{r.mean_batch:10.1f} {r.p50_ms:7.2f} {r.p99_ms:7.2f}")
    if args.json:
        args.json.write_text(json.dumps({str(k): {n: asdict(r) for n, r in v.items()} for k, v in results.items()}, indent=1))
    return 0
