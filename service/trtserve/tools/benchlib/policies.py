"""The dispatch-policy comparison of ``trtserve bench``: the adaptive policy against fixed
queue-delay timers (Triton's ``max_queue_delay_microseconds``), on the same arrivals, in one run.

For each offered rate one Poisson arrival trace is drawn and replayed, over one
ModelStreamInfer stream, under each policy in turn; the policy is switched on the live server
with ``trtserve.v1.ModelControl/SetPolicy`` (fields ``adaptive`` and ``max_queue_delay_us``),
which applies from the next batch, and every point starts with the bench's unmeasured warm-up.
The model's own policy is restored at the end.

Per point: goodput (answers OK within their deadline, per second), deadline misses
(DEADLINE_EXCEEDED answers plus OK answers after the deadline) as a share of requests, mean batch
size, p50/p99 latency. Pure except :func:`set_policy`/:func:`get_policy` (one RPC each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from ..._proto.trtserve.v1 import control_pb2 as pb
from .report import Point, Target, fmt

ADAPTIVE = "adaptive"
DEFAULT_POLICIES = "adaptive,fixed:0.5,fixed:2,fixed:10"
"""The issue's comparison: adaptive against fixed timers of 0.5, 2 and 10 ms."""
TARGET_FRACTION = 0.8
"""The rate (fraction of measured capacity) whose comparison is the headline target."""
CONTROL = "/trtserve.v1.ModelControl/"


@dataclass(frozen=True)
class PolicyChoice:
    """One policy of the comparison.

    Attributes:
        label: ``adaptive`` or ``fixed 2 ms``.
        adaptive: the adaptive policy (True) or the fixed timer (False).
        max_queue_delay_us: the fixed timer's queue delay in µs (0 for adaptive: no bound
            but the deadlines).
    """

    label: str
    adaptive: bool
    max_queue_delay_us: int


def parse_policies(text: str) -> list[PolicyChoice]:
    """``adaptive,fixed:0.5,fixed:2`` → choices (fixed delays in milliseconds).

    Raises:
        ValueError: an item that is neither ``adaptive`` nor ``fixed:<ms>`` with ms >= 0.
    """
    choices = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        if item == ADAPTIVE:
            choices.append(PolicyChoice(ADAPTIVE, True, 0))
            continue
        kind, _, ms = item.partition(":")
        try:
            delay_ms = float(ms)
        except ValueError:
            delay_ms = -1.0
        if kind != "fixed" or delay_ms < 0:
            raise ValueError(f"policy '{item}': expected 'adaptive' or 'fixed:<queue delay in ms>'")
        choices.append(PolicyChoice(f"fixed {delay_ms:g} ms", False, round(delay_ms * 1000)))
    return choices


async def get_policy(channel: grpc.aio.Channel, model: str) -> pb.BatchingPolicy:
    """The model's batching policy now (ModelControl/GetPolicy)."""
    call = channel.unary_unary(CONTROL + "GetPolicy", request_serializer=pb.GetPolicyRequest.SerializeToString,
                               response_deserializer=pb.BatchingPolicy.FromString)
    response: pb.BatchingPolicy = await call(pb.GetPolicyRequest(model_name=model))
    return response


async def set_policy(channel: grpc.aio.Channel, model: str, adaptive: bool, max_queue_delay_us: int) -> None:
    """Switch the model to ``adaptive`` / ``max_queue_delay_us`` (ModelControl/SetPolicy)."""
    call = channel.unary_unary(CONTROL + "SetPolicy", request_serializer=pb.SetPolicyRequest.SerializeToString,
                               response_deserializer=pb.BatchingPolicy.FromString)
    request = pb.SetPolicyRequest(model_name=model, policy=pb.BatchingPolicy(adaptive=adaptive, max_queue_delay_us=max_queue_delay_us))
    request.update_mask.paths.extend(["adaptive", "max_queue_delay_us"])
    await call(request)


def goodput(p: Point) -> float:
    """Answers OK within their deadline per second of the point's window."""
    return (p.ok - p.late_answers) / p.window_s if p.window_s > 0 else 0.0


def miss_share(p: Point) -> float:
    """Deadline misses as a share of the point's requests."""
    return p.deadline_misses / p.requests if p.requests else 0.0


COLUMNS = (("load", 12), ("policy", 13), ("goodput/s", 10), ("miss %", 7), ("batch", 6), ("p50 ms", 8), ("p99 ms", 8), ("errors", 24))


def format_policy_table(points: Sequence[Point]) -> str:
    """One table per model: every (rate, policy) point of the comparison, as terminal text."""
    out: list[str] = []
    for model in dict.fromkeys(p.model for p in points if p.policy is not None):
        rows = [p for p in points if p.model == model and p.policy is not None]
        out.append(f"{model} · open-stream, adaptive vs fixed queue delay (same trace per rate), deadline {fmt(rows[0].deadline_ms, '.1f')} ms")
        out.append("  ".join(name.rjust(w) if i else name.ljust(w) for i, (name, w) in enumerate(COLUMNS)))
        for p in rows:
            errors = ", ".join(f"{code} {n}" for code, n in p.errors.items()) or "-"
            cells = (f"{p.load:.0f}/s ({fmt(p.fraction, '.0%')})", p.policy or "", f"{goodput(p):.1f}", f"{miss_share(p):.1%}",
                     fmt(p.mean_batch, ".2f"), fmt(p.p50_ms, ".2f"), fmt(p.p99_ms, ".2f"), errors)
            out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))))
        out.append("")
    return "\n".join(out)


def counting_error(p: Point) -> float:
    """One standard error of :func:`goodput` from counting alone (answers per second): the
    square root of the good answers (Poisson), over the window."""
    good = max(p.ok - p.late_answers, 0)
    return good**0.5 / p.window_s if p.window_s > 0 else 0.0


def policy_targets(points: Sequence[Point]) -> list[Target]:
    """Per model and rate of the comparison: adaptive against the best fixed timer (most
    goodput; fewer misses, then lower p99, breaking ties). At :data:`TARGET_FRACTION` the verdict
    is ``PASS`` when adaptive's goodput is at least the best fixed timer's less one
    :func:`counting_error` of it (two runs of one policy on one trace differ by about that much
    on a shared machine, so a strict ``>=`` would be a coin flip); other rates are ``INFO``."""
    targets: list[Target] = []
    keys = dict.fromkeys((p.model, p.fraction) for p in points if p.policy is not None)
    for model, fraction in keys:
        group = [p for p in points if p.model == model and p.fraction == fraction and p.policy is not None]
        adaptive = next((p for p in group if p.policy == ADAPTIVE), None)
        fixed = [p for p in group if p.policy != ADAPTIVE]
        name = f"{model} open-stream at {fmt(fraction, '.0%')} capacity: adaptive vs best fixed timer"
        if adaptive is None or not fixed:
            targets.append(Target(name, "SKIP", "needs the adaptive policy and at least one fixed timer"))
            continue
        best = max(fixed, key=lambda p: (goodput(p), -miss_share(p), -(p.p99_ms or 0.0)))
        ratio = goodput(adaptive) / goodput(best) if goodput(best) > 0 else None
        error = counting_error(best)
        wins = goodput(adaptive) >= goodput(best) - error
        verdict = ("PASS" if wins else "MISS") if fraction is not None and abs(fraction - TARGET_FRACTION) < 1e-9 else "INFO"
        targets.append(Target(name, verdict, (
            f"goodput {goodput(adaptive):.1f}/s vs {goodput(best):.1f}/s ±{error:.1f} ({best.policy}) = {fmt(ratio, '.3f')}; "
            f"misses {miss_share(adaptive):.1%} vs {miss_share(best):.1%}; "
            f"p50 {fmt(adaptive.p50_ms, '.1f')} vs {fmt(best.p50_ms, '.1f')} ms; p99 {fmt(adaptive.p99_ms, '.1f')} vs {fmt(best.p99_ms, '.1f')} ms"
        )))
    return targets
