"""``trtserve simulate``: compare dispatch policies on the same arrival trace.

Drives the real dispatcher on a fake clock (:mod:`trtserve.harness.simulator`) with an engine
whose batch of b rows takes ``fixed + per_row·b`` milliseconds, optionally on a host that
costs CPU per request read and per batch run (``--host-per-request-us``, ``--host-per-batch-us``),
and prints the fixed-timer policies (queue delay 0.5, 2 and 10 ms) next to the adaptive one on
the same trace: goodput, deadline-miss rate, engine time spent on rows that finished late,
mean batch size and latency percentiles. Three scenarios (``--scenario``):

* ``loads``: Poisson (or bursty) arrivals at fractions of the full-batch capacity
  (``max_batch_size`` / run time of a full batch), one deadline for all.
* ``overload``: Poisson at 0.5, 1, 2 and 3 × :func:`capacity`, deadline 10 × the batch-of-one
  run time (at least 5 ms); target: goodput at 2× and 3× ≥ 0.8 × the peak goodput at the
  loads up to it (:func:`overload_peak`).
* ``mixed``: 50 % tight (10 × the batch-of-one run time, at least 5 ms) and 50 % loose (10 ×
  tight) deadlines at 0.65 × :func:`capacity`; targets: tight misses ≤ 5 %, loose ≤ 1 %.

In every scenario the adaptive policy's target is at least the best fixed timer's goodput
(within :data:`TIE`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from trtserve.config import BatchingPolicy
from trtserve.harness.simulator import SimResult, bursty_trace, poisson_trace, simulate
from trtserve.testing import HostCost, affine

OVERLOAD_LOADS = (0.5, 1.0, 2.0, 3.0)
OVERLOAD_GOODPUT_SHARE = 0.8  # goodput at 2x and 3x, at least this share of the peak
MIXED_LOAD = 0.65
# "Adaptive at least the best fixed timer" holds within this share: on one finite trace two
# policies that both run the engine flat out differ by a request or two (0.05 %) as their
# batches happen to fall near the deadlines.
TIE = 0.01
TIGHT_MISS, LOOSE_MISS = 0.05, 0.01  # the mixed scenario's targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=("loads", "overload", "mixed"), default="loads",
                        help="loads: fractions of capacity, one deadline; overload: 0.5-3x capacity; "
                             "mixed: 50 %% tight, 50 %% loose deadlines at 65 %% of capacity (default: loads)")
    parser.add_argument("--fixed-ms", type=float, default=2.0, help="engine time per batch, ms (default: 2)")
    parser.add_argument("--per-row-ms", type=float, default=0.1, help="engine time per row, ms (default: 0.1)")
    parser.add_argument("--host-per-batch-us", type=float, default=0.0,
                        help="host CPU per batch beside the engine run, µs (default: 0)")
    parser.add_argument("--host-per-request-us", type=float, default=0.0,
                        help="host CPU to read one request, µs (default: 0)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="batch cap in rows (default: 16)")
    parser.add_argument("--deadline-ms", type=float, default=10.0,
                        help="loads: each request's deadline after arrival, ms (default: 10)")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.2, 0.5, 0.8, 0.95],
                        help="loads: fractions of capacity (default: 0.2 0.5 0.8 0.95)")
    parser.add_argument("--timers-ms", type=float, nargs="+", default=[0.5, 2.0, 10.0],
                        help="fixed queue delays to compare, ms")
    parser.add_argument("--duration", type=float, default=2.0,
                        help="seconds of simulated arrivals per point (default: 2)")
    parser.add_argument("--bursty", action="store_true",
                        help="loads: bursty arrivals (all in the first quarter of every 100 ms)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")


def policies(max_batch_size: int, timers: Sequence[float]) -> dict[str, BatchingPolicy]:
    """The fixed timers (``timers`` in seconds) and the adaptive policy, by name."""
    named = {f"fixed {t * 1e3:g} ms": BatchingPolicy(max_batch_size=max_batch_size, max_queue_delay=t, adaptive=False)
             for t in timers}
    named["adaptive"] = BatchingPolicy(max_batch_size=max_batch_size)
    return named


def capacity(latency: Callable[[int], float], host: HostCost | None, slots: int = 1) -> float:
    """Requests per second a server sustains running batches of one back to back: the slower
    of the engine (``slots`` / p(1)) and the host (1 / (per request + per batch)). The
    overload and mixed scenarios scale their rates by it; the bench scales by the measured
    closed-loop capacity instead, which batching raises above this."""
    host_time = host.per_request + host.per_batch if host else 0.0
    return 1.0 / max(latency(1) / slots, host_time)


def tight_deadline(latency: Callable[[int], float]) -> float:
    """10 × the batch-of-one run time, at least 5 ms (seconds)."""
    return max(10 * latency(1), 0.005)


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
    host: HostCost | None = None,
) -> dict[float, dict[str, SimResult]]:
    """The ``loads`` scenario: load → policy name → result, every policy on the same trace per
    load (times in seconds; capacity = ``max_batch_size`` / run time of a full batch)."""
    latency = affine(fixed, per_row)
    full = max_batch_size / latency(max_batch_size)
    results: dict[float, dict[str, SimResult]] = {}
    for load in loads:
        make = bursty_trace if bursty else poisson_trace
        trace = make(load * full, duration, seed=seed)
        results[load] = _run_all(policies(max_batch_size, timers), trace, deadline, latency, host)
    return results


def overload(
    *,
    latency: Callable[[int], float],
    host: HostCost | None,
    max_batch_size: int,
    timers: Sequence[float],
    duration: float,
    seed: int = 0,
    loads: Sequence[float] = OVERLOAD_LOADS,
) -> dict[float, dict[str, SimResult]]:
    """The ``overload`` scenario: load (× :func:`capacity`) → policy name → result, deadline
    :func:`tight_deadline` for every request."""
    rate = capacity(latency, host)
    named = policies(max_batch_size, timers)
    return {
        load: _run_all(named, poisson_trace(load * rate, duration, seed=seed), tight_deadline(latency), latency, host)
        for load in loads
    }


def mixed(
    *,
    latency: Callable[[int], float],
    host: HostCost | None,
    max_batch_size: int,
    timers: Sequence[float],
    duration: float,
    seed: int = 0,
    load: float = MIXED_LOAD,
) -> dict[str, SimResult]:
    """The ``mixed`` scenario: policy name → result, at ``load`` × :func:`capacity`, each request
    tight (:func:`tight_deadline`) or loose (10 × tight) with probability ½. The result's
    ``miss_by_budget`` holds both classes' miss rates (keys in ms)."""
    trace = poisson_trace(load * capacity(latency, host), duration, seed=seed)
    tight = tight_deadline(latency)
    deadlines = np.where(np.random.default_rng(seed + 1).random(len(trace)) < 0.5, tight, 10 * tight)
    return _run_all(policies(max_batch_size, timers), trace, deadlines, latency, host)


def _run_all(named: dict[str, BatchingPolicy], trace: np.ndarray, deadline, latency, host) -> dict[str, SimResult]:
    return {name: asyncio.run(simulate(policy, trace, deadline=deadline, latency=latency, host=host))
            for name, policy in named.items()}


def run(args: argparse.Namespace) -> int:
    latency = affine(args.fixed_ms / 1e3, args.per_row_ms / 1e3)
    host = HostCost(args.host_per_request_us / 1e6, args.host_per_batch_us / 1e6)
    host = host if host.per_request or host.per_batch else None
    timers = [t / 1e3 for t in args.timers_ms]
    common = dict(max_batch_size=args.max_batch_size, timers=timers, duration=args.duration, seed=args.seed)
    hosted = (f", host {args.host_per_request_us:g} µs/request + {args.host_per_batch_us:g} µs/batch" if host else "")
    print(f"engine {args.fixed_ms:g} ms + {args.per_row_ms:g} ms/row{hosted}, max batch {args.max_batch_size}, "
          f"{args.duration:g} s per point")
    if args.scenario == "loads":
        results = compare(fixed=args.fixed_ms / 1e3, per_row=args.per_row_ms / 1e3, max_batch_size=args.max_batch_size,
                          deadline=args.deadline_ms / 1e3, loads=args.loads, timers=timers, duration=args.duration,
                          bursty=args.bursty, seed=args.seed, host=host)
        print(f"deadline {args.deadline_ms:g} ms, {'bursty' if args.bursty else 'Poisson'} arrivals, "
              "loads as fractions of the full-batch capacity")
        _table(results)
        failed = _report_adaptive(results)
    elif args.scenario == "overload":
        results = overload(latency=latency, host=host, **common)
        print(f"Poisson at multiples of {capacity(latency, host):.0f}/s (batches of one back to back), "
              f"deadline {tight_deadline(latency) * 1e3:g} ms")
        _table(results)
        failed = _report_overload(results) + _report_adaptive(results)
    else:
        by_policy = mixed(latency=latency, host=host, **common)
        tight = tight_deadline(latency)
        print(f"Poisson at {MIXED_LOAD:.0%} of {capacity(latency, host):.0f}/s, 50 % tight ({tight * 1e3:g} ms), "
              f"50 % loose ({tight * 1e4:g} ms) deadlines")
        results = {MIXED_LOAD: by_policy}
        _table(results, classes=(tight, 10 * tight))
        failed = _report_mixed(by_policy, tight) + _report_adaptive(results)
    if args.json:
        table = {str(k): {n: asdict(r) for n, r in v.items()} for k, v in results.items()}
        args.json.write_text(json.dumps(table, indent=1))
    return 1 if failed else 0


def _table(results: dict[float, dict[str, SimResult]], classes: tuple[float, ...] = ()) -> None:
    extra = "".join(f" {f'miss {c * 1e3:g} ms %':>16}" for c in classes)
    print(f"{'load':>5} {'policy':<14} {'goodput/s':>10} {'miss %':>7}{extra} {'late engine ms':>15} "
          f"{'mean batch':>10} {'p50 ms':>7} {'p99 ms':>7}")
    for load, by_policy in results.items():
        for name, r in by_policy.items():
            per_class = "".join(f" {100 * r.miss_by_budget.get(round(c * 1e3, 6), 0.0):16.2f}" for c in classes)
            print(f"{load:5.0%} {name:<14} {r.goodput:10.0f} {100 * r.miss_rate:7.2f}{per_class} "
                  f"{1e3 * r.late_engine_seconds:15.2f} {r.mean_batch:10.1f} {r.p50_ms:7.2f} {r.p99_ms:7.2f}")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _report_adaptive(results: dict[float, dict[str, SimResult]]) -> int:
    """Print, per load, adaptive's goodput against the best fixed timer's; the rows missed."""
    missed = 0
    for load, by_policy in results.items():
        best = max((r.goodput for n, r in by_policy.items() if n != "adaptive"), default=0.0)
        ok = by_policy["adaptive"].goodput >= (1 - TIE) * best
        missed += not ok
        print(f"target {load:.0%}: adaptive goodput {by_policy['adaptive'].goodput:.0f}/s >= best fixed timer "
              f"{best:.0f}/s (within {TIE:.0%}): {_verdict(ok)}")
    return missed


def overload_peak(results: dict[float, dict[str, SimResult]], name: str, load: float) -> float:
    """The peak goodput of policy ``name`` at the loads up to ``load``: what the overload
    target compares with (goodput must not fall as the load grows past capacity; where the
    simulated server still serves 2x in full, its goodput at 2x is its peak so far)."""
    return max(by_policy[name].goodput for at, by_policy in results.items() if at <= load)


def _report_overload(results: dict[float, dict[str, SimResult]]) -> int:
    missed = 0
    for name in next(iter(results.values())):
        for load in (2.0, 3.0):
            if load in results:
                got, peak = results[load][name].goodput, overload_peak(results, name, load)
                ok = got >= OVERLOAD_GOODPUT_SHARE * peak
                missed += not ok and name == "adaptive"
                print(f"target {name}, {load:g}x: goodput {got:.0f}/s >= {OVERLOAD_GOODPUT_SHARE:g} x peak "
                      f"up to {load:g}x {peak:.0f}/s: {_verdict(ok)}")
    return missed


def _report_mixed(by_policy: dict[str, SimResult], tight: float) -> int:
    missed = 0
    for name, r in by_policy.items():
        t, lo = r.miss_by_budget[round(tight * 1e3, 6)], r.miss_by_budget[round(10 * tight * 1e3, 6)]
        ok = t <= TIGHT_MISS and lo <= LOOSE_MISS
        missed += not ok and name == "adaptive"
        print(f"target {name}: tight misses {100 * t:.2f} % <= {100 * TIGHT_MISS:g} %, loose {100 * lo:.2f} % "
              f"<= {100 * LOOSE_MISS:g} %: {_verdict(ok)}")
    return missed
