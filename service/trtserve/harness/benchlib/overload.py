"""The overload and mixed-deadline modes of ``trtserve bench``: their tables and targets.
Pure: computed from the points' :class:`~.deadlines.DeadlineClass` summaries.

* ``overload``: per model and policy, Poisson arrivals (open loop, unary, every request with
  its gRPC deadline and ``timeout`` parameter) at multiples of the closed-loop capacity. A
  point's ``fraction`` is the multiple, ``load`` the offered rate (requests/s), its single
  class ``all``. Targets: goodput at :data:`OVERLOAD_TARGET_MULTIPLES` ≥ :data:`GOODPUT_RATIO`
  × the peak goodput of the same (model, policy) sweep; the server tree's RSS at the end of
  every point above 1× ≤ :data:`RSS_GROWTH` × its RSS after the 1× point.
* ``mixed``: per model and policy, one Poisson run at :data:`MIXED_FRACTION` of capacity, each
  request tight or loose at random (half each). Targets: misses (not answered OK within the
  deadline, refusals included) ≤ :data:`MISS_LIMITS` per class.

Both modes run over the gRPC door or, with ``--open-door http``, the HTTP door (KServe v2
REST; refusals recorded under the gRPC names their statuses stand for): each point's ``door``.
A sweep is one (model, policy, door); its targets name the door when it is HTTP.

Tables are Markdown (pipes), so a run's output can be pasted into docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtserve.harness.benchlib.deadlines import OTHER, DeadlineClass
from trtserve.harness.benchlib.report import Point, Target, fmt

OVERLOAD_MODE = "overload"
MIXED_MODE = "mixed"
OVERLOAD_MULTIPLES = (0.5, 1.0, 2.0, 3.0)
"""Offered rates as multiples of the measured closed-loop capacity."""
OVERLOAD_TARGET_MULTIPLES = (2.0, 3.0)
GOODPUT_RATIO = 0.8
RSS_GROWTH = 1.25
OVERLOAD_DEADLINE_FACTOR = 10.0
"""Overload deadline: this × the batch-of-one run time (at least ``MIN_DEADLINE_MS``)."""
MIXED_FRACTION = 0.65
TIGHT, LOOSE = "tight", "loose"
MIXED_FACTORS = {TIGHT: 10.0, LOOSE: 100.0}
"""Mixed deadlines as multiples of the batch-of-one run time (the loose one also at least
10× the tight one's floor, see :func:`mixed_deadlines_us`)."""
MISS_LIMITS = {TIGHT: 0.05, LOOSE: 0.01}


def mixed_deadlines_us(tight_us: int) -> dict[str, int]:
    """The two classes' deadlines in µs from the tight one (already floored): loose is
    ``MIXED_FACTORS`` loose/tight × tight, i.e. 100× the batch-of-one run time whenever the
    tight one is 10× it, and 10× the floor when the floor applies."""
    return {TIGHT: tight_us, LOOSE: round(tight_us * MIXED_FACTORS[LOOSE] / MIXED_FACTORS[TIGHT])}


def _groups(points: Sequence[Point], mode: str) -> dict[tuple[str, str, str], list[Point]]:
    """The points of ``mode`` by (model, policy, door), in order."""
    groups: dict[tuple[str, str, str], list[Point]] = {}
    for p in points:
        if p.mode == mode and p.classes:
            groups.setdefault((p.model, p.policy or "-", p.door), []).append(p)
    return groups


def _label(policy: str, door: str) -> str:
    """A sweep's policy as its targets name it: ``adaptive``, or ``adaptive over HTTP``."""
    return policy if door == "grpc" else f"{policy} over {door.upper()}"


def _near(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) < 1e-9


def overload_targets(points: Sequence[Point]) -> list[Target]:
    """Per (model, policy) of the overload sweep: goodput at 2× and 3× against the sweep's
    peak, and the RSS bound (see the module docstring)."""
    targets: list[Target] = []
    for (model, policy, door), group in _groups(points, OVERLOAD_MODE).items():
        policy = _label(policy, door)
        peak = max(group, key=lambda p: p.classes[0].goodput)
        top = peak.classes[0].goodput
        for multiple in OVERLOAD_TARGET_MULTIPLES:
            name = f"{model} overload {policy} at {multiple:g}x capacity: goodput >= {GOODPUT_RATIO:g} x peak"
            p = next((q for q in group if _near(q.fraction, multiple)), None)
            if p is None:
                targets.append(Target(name, "SKIP", f"needs the {multiple:g}x point"))
                continue
            c = p.classes[0]
            share = c.goodput / top if top > 0 else 0.0
            targets.append(Target(name, "PASS" if top > 0 and share >= GOODPUT_RATIO else "MISS", (
                f"{c.goodput:.0f}/s of {p.load:.0f}/s offered vs peak {top:.0f}/s at {fmt(peak.fraction, 'g')}x "
                f"= {share:.2f}; "
                f"deadline {c.deadline_ms:.1f} ms; refused {_refusals(c)}; late {c.late}"
            )))
        name = f"{model} overload {policy}: server RSS after each point above 1x <= {RSS_GROWTH:g} x RSS after 1x"
        base = next((q for q in group if _near(q.fraction, 1.0)), None)
        above = [q for q in group if q.fraction is not None and q.fraction > 1.0 and q.rss_end_mib is not None]
        if base is None or base.rss_end_mib is None or not above:
            targets.append(Target(name, "SKIP", "needs the 1x point and one above it, with RSS read"))
            continue
        worst = max(above, key=lambda q: q.rss_end_mib or 0.0)
        growth = (worst.rss_end_mib or 0.0) / base.rss_end_mib
        targets.append(Target(name, "PASS" if growth <= RSS_GROWTH else "MISS", (
            f"{worst.rss_end_mib:.0f} MiB after {fmt(worst.fraction, 'g')}x vs {base.rss_end_mib:.0f} MiB after 1x "
            f"= {growth:.2f}"
        )))
    return targets


def mixed_targets(points: Sequence[Point]) -> list[Target]:
    """Per (model, policy) of the mixed run and per class: its miss share against
    :data:`MISS_LIMITS`."""
    targets: list[Target] = []
    for (model, policy, door), group in _groups(points, MIXED_MODE).items():
        policy = _label(policy, door)
        for p in group:
            for c in p.classes:
                limit = MISS_LIMITS.get(c.name)
                if limit is None:
                    continue
                name = (f"{model} mixed {policy} at {fmt(p.fraction, '.0%')} capacity, {c.name} "
                        f"({c.deadline_ms:.1f} ms): misses <= {limit:.0%}")
                targets.append(Target(name, "PASS" if c.miss_share <= limit else "MISS", (
                    f"{c.misses} of {c.requests} ({c.miss_share:.1%}): late {c.late}, refused {_refusals(c)}; "
                    f"goodput {c.goodput:.0f}/s, p50 {fmt(c.p50_ms, '.1f')} ms, p99 {fmt(c.p99_ms, '.1f')} ms"
                )))
    return targets


def _refusals(c: DeadlineClass) -> str:
    return ", ".join(f"{code} {n}" for code, n in c.refused.items())


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _mib(p: Point) -> str:
    return f"{fmt(p.rss_start_mib, '.0f')} → {fmt(p.rss_end_mib, '.0f')}"


def format_overload_table(points: Sequence[Point]) -> str:
    """The overload sweep as one Markdown table (model, policy, offered rate by row), or ""."""
    groups = _groups(points, OVERLOAD_MODE)
    if not groups:
        return ""
    out = [
        "overload: Poisson, unary, every request with deadline (gRPC deadline; over HTTP the trtserve-timeout-us "
        "header) = timeout parameter; goodput = answers OK within the deadline per second; DE early = "
        "DEADLINE_EXCEEDED (HTTP 504) before the deadline passed; RESOURCE_EXHAUSTED = HTTP 429",
        _row(("model", "policy", "door", "offered/s", "deadline ms", "goodput/s", "late", "RESOURCE_EXHAUSTED",
              "DEADLINE_EXCEEDED (early)", OTHER, "p50 ms", "p99 ms", "send lag p99 ms", "RSS MiB")),
        _row(("---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
              "---:")),
    ]
    for (model, policy, door), group in groups.items():
        for p in group:
            c = p.classes[0]
            out.append(_row((
                model, policy, door, f"{p.load:.0f} ({fmt(p.fraction, 'g')}x)", f"{c.deadline_ms:.1f}",
                f"{c.goodput:.0f}", str(c.late), str(c.refused["RESOURCE_EXHAUSTED"]),
                f"{c.refused['DEADLINE_EXCEEDED']} ({c.refused_early})", str(c.refused[OTHER]),
                fmt(c.p50_ms, ".2f"), fmt(c.p99_ms, ".2f"), fmt(p.send_lag_p99_ms, ".1f"), _mib(p),
            )))
    return "\n".join(out) + "\n"


def format_mixed_table(points: Sequence[Point]) -> str:
    """The mixed-deadline runs as one Markdown table (a row per model, policy and class), or ""."""
    groups = _groups(points, MIXED_MODE)
    if not groups:
        return ""
    out = [
        "mixed: Poisson, unary, half tight and half loose deadlines at random; "
        "miss = not answered OK within the deadline",
        _row(("model", "policy", "door", "offered/s", "class", "deadline ms", "goodput/s", "miss %", "late",
              "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED (early)", OTHER, "p50 ms", "p99 ms", "RSS MiB")),
        _row(("---", "---", "---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
              "---:", "---:")),
    ]
    for (model, policy, door), group in groups.items():
        for p in group:
            for c in p.classes:
                out.append(_row((
                    model, policy, door, f"{p.load:.0f} ({fmt(p.fraction, '.0%')})", c.name, f"{c.deadline_ms:.1f}",
                    f"{c.goodput:.0f}", f"{c.miss_share:.1%}", str(c.late), str(c.refused["RESOURCE_EXHAUSTED"]),
                    f"{c.refused['DEADLINE_EXCEEDED']} ({c.refused_early})", str(c.refused[OTHER]),
                    fmt(c.p50_ms, ".2f"), fmt(c.p99_ms, ".2f"), _mib(p),
                )))
    return "\n".join(out) + "\n"
