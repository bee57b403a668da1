"""The ``refusals`` mode of ``trtserve bench``: ρ, the server's CPU per refusal ÷ its CPU per
answer, per door, and the bound it puts on goodput under overload. Pure: computed from the
points' CPU per request and status counts. No clock, no I/O.

Per model and door two closed loops of the same callers run back to back: one answered in full,
then one against the model's queue held full (every call refused RESOURCE_EXHAUSTED, over HTTP
429, as a queue at ``max_queue_size`` refuses). With ``a`` the server CPU per answer of the
first loop and ``T`` the server CPU of the second, the CPU per refusal is
``(T − ok × a) ÷ refused`` (a call the second loop answered all the same costs ``a``) and
``ρ = refusal ÷ a``.

Why it matters: if one answer takes the server's whole CPU ``a`` per call (capacity ``1/a``),
then at ``k`` × capacity offered, ``x`` answers and ``k/a − x`` refusals a second need
``x a + (k/a − x) ρ a ≤ 1``, so goodput cannot exceed :func:`goodput_bound`
``(1 − kρ) ÷ (1 − ρ)`` of capacity, whatever the policy; 0.8 at 3× needs ρ ≤ 0.09
(:func:`rho_needed`). Units: CPU per call in microseconds (the server's whole process tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtserve.harness.benchlib.protocols import GRPC, HTTP
from trtserve.harness.benchlib.report import SERVER, Point, Target, fmt

REFUSAL_MODE = "refusals"
"""The ``--modes`` item."""
ANSWERED, REFUSED = "answered", "refused"
LOOP_MODES = {door: {kind: f"rho-{kind[:3]}-{door}" for kind in (ANSWERED, REFUSED)} for door in (GRPC, HTTP)}
"""``Point.mode`` of each loop: door → kind → mode (``rho-ans-grpc``, ``rho-ref-http``, …)."""
REFUSAL_CODES = ("RESOURCE_EXHAUSTED", "HTTP 429", "HTTP 503")
"""The statuses counted as overload refusals (gRPC; HTTP queue full or overloaded; HTTP
server busy)."""
BOUND_MULTIPLES = (2.0, 3.0)
TARGET_GOODPUT, TARGET_MULTIPLE = 0.8, 3.0
"""The issue's goal: goodput 0.8 × capacity at 3× overload, which needs ρ ≤ :func:`rho_needed`."""


def goodput_bound(rho: float, multiple: float) -> float:
    """The most goodput (as a share of capacity, 0..1) one server's CPU allows at ``multiple``
    × its capacity offered, when a refusal costs ``rho`` × an answer: ``(1 − kρ) ÷ (1 − ρ)``,
    clipped to 0..1 (1 up to 1× offered; 0 once refusals alone take the whole CPU).

    Raises:
        ValueError: ``rho`` not in 0..1 (a refusal dearer than an answer bounds nothing this way).
    """
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), got {rho}")
    if multiple <= 1.0:
        return 1.0
    return max(0.0, min(1.0, (1.0 - multiple * rho) / (1.0 - rho)))


def rho_needed(goodput: float, multiple: float) -> float:
    """The largest ρ at which :func:`goodput_bound` still allows ``goodput`` (share of
    capacity) at ``multiple`` × capacity: ``(1 − g) ÷ (k − g)``; 0.8 at 3× → 0.0909.

    Raises:
        ValueError: ``multiple`` not above 1 or ``goodput`` not in 0..1.
    """
    if multiple <= 1.0 or not 0.0 <= goodput <= 1.0:
        raise ValueError(f"expected a multiple above 1 and a goodput share in [0, 1], got {multiple}, {goodput}")
    return (1.0 - goodput) / (multiple - goodput)


@dataclass(frozen=True)
class Rho:
    """ρ of one model over one door.

    Attributes:
        model, door: the model and ``grpc`` or ``http``.
        callers: the closed loop's callers.
        answer_us: server CPU per answer, µs (the answered loop).
        refusal_us: server CPU per refusal, µs (the refused loop, its answers at ``answer_us``).
        refused, requests: refusals and calls of the refused loop.
    """

    model: str
    door: str
    callers: float
    answer_us: float
    refusal_us: float
    refused: int
    requests: int

    @property
    def rho(self) -> float:
        """CPU per refusal ÷ CPU per answer."""
        return self.refusal_us / self.answer_us

    def bound(self, multiple: float) -> float | None:
        """:func:`goodput_bound` at ``multiple``; None where ρ is outside 0..1."""
        return goodput_bound(self.rho, multiple) if 0.0 <= self.rho < 1.0 else None


def _refusals(p: Point) -> int:
    return sum(p.errors.get(code, 0) for code in REFUSAL_CODES)


def _cpu_s(p: Point) -> float | None:
    return None if p.server_cpu_us_per_request is None else p.server_cpu_us_per_request * p.requests / 1e6


def measure_rho(answered: Point, refused: Point) -> Rho | None:
    """ρ from the two loops of one model and door (see the module docstring); None where the
    answered loop has no OK answer or the refused loop no refusal, or CPU was not read."""
    total, answered_cpu = _cpu_s(refused), _cpu_s(answered)
    count = _refusals(refused)
    if total is None or answered_cpu is None or answered.ok == 0 or count == 0:
        return None
    answer_us = answered_cpu * 1e6 / answered.ok
    door = next(d for d, kinds in LOOP_MODES.items() if refused.mode == kinds[REFUSED])
    refusal_us = (total * 1e6 - refused.ok * answer_us) / count
    return Rho(refused.model, door, refused.load, answer_us, refusal_us, count, refused.requests)


def rhos(points: Sequence[Point]) -> list[Rho]:
    """ρ per (model, door) of trtserve's refusal loops, in the order measured: each refused loop
    with the answered loop before it (the last pair, should one have run twice)."""
    found: dict[tuple[str, str], Rho] = {}
    answered: dict[tuple[str, str], Point] = {}
    for p in points:
        for door, kinds in LOOP_MODES.items():
            if p.server != SERVER:
                continue
            if p.mode == kinds[ANSWERED]:
                answered[(p.model, door)] = p
            elif p.mode == kinds[REFUSED] and (p.model, door) in answered:
                rho = measure_rho(answered[(p.model, door)], p)
                if rho is not None:
                    found[(p.model, door)] = rho
    return list(found.values())


def format_refusal_table(points: Sequence[Point]) -> str:
    """ρ per model and door beside the goodput bound at 2× and 3×, as a Markdown table; "" without
    the mode's points."""
    rows = rhos(points)
    if not rows:
        return ""
    needed = rho_needed(TARGET_GOODPUT, TARGET_MULTIPLE)
    multiples = " | ".join(f"bound at {k:g}x" for k in BOUND_MULTIPLES)
    out = [
        f"refusals: rho = server CPU per refusal / per answer (same callers, same run); goodput bound "
        f"(1 - k rho)/(1 - rho) of capacity; {TARGET_GOODPUT:g} at {TARGET_MULTIPLE:g}x needs rho <= {needed:.3f}",
        f"| model | door | callers | CPU/answer us | CPU/refusal us | refused | rho | {multiples} |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in BOUND_MULTIPLES) + " |",
    ]
    for r in rows:
        bounds = " | ".join(fmt(r.bound(k), ".2f") for k in BOUND_MULTIPLES)
        out.append(f"| {r.model} | {r.door} | {r.callers:g} | {r.answer_us:.0f} | {r.refusal_us:.0f} | "
                   f"{r.refused}/{r.requests} | {r.rho:.3f} | {bounds} |")
    return "\n".join(out) + "\n"


def refusal_targets(points: Sequence[Point]) -> list[Target]:
    """Per (model, door) measured: ρ ≤ :func:`rho_needed` (0.8 at 3×), the bounds at 2× and 3×
    in the detail."""
    needed = rho_needed(TARGET_GOODPUT, TARGET_MULTIPLE)
    targets = []
    for r in rhos(points):
        name = (f"{r.model} over {r.door}: rho <= {needed:.3f} (goodput {TARGET_GOODPUT:g} x capacity at "
                f"{TARGET_MULTIPLE:g}x allowed)")
        bounds = ", ".join(f"{fmt(r.bound(k), '.2f')} at {k:g}x" for k in BOUND_MULTIPLES)
        targets.append(Target(name, "PASS" if r.rho <= needed else "MISS", (
            f"{r.refusal_us:.0f}/{r.answer_us:.0f} us = {r.rho:.3f} at c={r.callers:g} "
            f"({r.refused} of {r.requests} refused); goodput bound {bounds}"
        )))
    return targets


__all__ = ["REFUSAL_MODE", "Rho", "format_refusal_table", "goodput_bound", "measure_rho", "refusal_targets",
           "rho_needed", "rhos"]
