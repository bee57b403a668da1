"""The dispatch-policy comparison of ``trtserve bench``: the adaptive policy against fixed
queue-delay timers (Triton's ``max_queue_delay_microseconds``), on the same load, in one run.

Two kinds of row: closed loop (a number of unary callers over the bench's connections, no
deadline; goodput is then every OK answer) and open loop (for each offered rate one Poisson
arrival trace is drawn and replayed, over one ModelStreamInfer stream). Each row runs under
each policy in turn; the policy is switched on the live server
with ``trtserve.v1.ModelControl/SetPolicy`` (fields ``adaptive`` and ``max_queue_delay_us``),
which applies from the next batch, and every point starts with the bench's unmeasured warm-up.
The model's own policy is restored at the end.

After one unmeasured replay of the first trace (so that the previous sweep's tail lands on no
policy), the whole sweep runs ``rounds`` times, alternating the order of the policies (a policy
first in one round is last in the next), and each policy is summarized over its rounds: goodput
(answers OK within their deadline, per second), deadline misses (DEADLINE_EXCEEDED answers plus
OK answers after the deadline) as a share of requests, mean batch size, p50/p99 latency. On a
machine whose cores the server and the load generator share, two runs of one policy on one
trace can differ noticeably near saturation; the rounds and the per-round column show that
spread. Pure except :func:`set_policy`/:func:`get_policy` (one RPC each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from trtserve._proto.trtserve.v1 import control_pb2 as pb
from trtserve.harness.benchlib.report import Point, Target, fmt, load_label

ADAPTIVE = "adaptive"
DEFAULT_POLICIES = "adaptive,fixed:0.5,fixed:2,fixed:10"
"""The default comparison: adaptive against fixed timers of 0.5, 2 and 10 ms."""
CONTROL = "/trtserve.v1.ModelControl/"
OPEN_MODE = "policy"
"""``Point.mode`` of an open-loop comparison point (open-stream, Poisson)."""
CLOSED_MODE = "policy-closed"
"""``Point.mode`` of a closed-loop comparison point (closed-unary, no deadline)."""
KINDS = {OPEN_MODE: "open-stream", CLOSED_MODE: "closed-unary"}


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


async def set_policy(channel: grpc.aio.Channel, model: str, adaptive: bool, max_queue_delay_us: int,
                     max_queue_size: int | None = None) -> None:
    """Switch the model to ``adaptive`` / ``max_queue_delay_us`` and, when given, its queue bound
    ``max_queue_size`` (requests; 0: none) (ModelControl/SetPolicy)."""
    call = channel.unary_unary(CONTROL + "SetPolicy", request_serializer=pb.SetPolicyRequest.SerializeToString,
                               response_deserializer=pb.BatchingPolicy.FromString)
    policy = pb.BatchingPolicy(adaptive=adaptive, max_queue_delay_us=max_queue_delay_us,
                               max_queue_size=max_queue_size or 0)
    request = pb.SetPolicyRequest(model_name=model, policy=policy)
    request.update_mask.paths.extend(["adaptive", "max_queue_delay_us"])
    if max_queue_size is not None:
        request.update_mask.paths.append("max_queue_size")
    await call(request)


def goodput(p: Point) -> float:
    """Answers OK within their deadline per second of the point's window."""
    return (p.ok - p.late_answers) / p.window_s if p.window_s > 0 else 0.0


def miss_share(p: Point) -> float:
    """Deadline misses as a share of the point's requests."""
    return p.deadline_misses / p.requests if p.requests else 0.0


@dataclass(frozen=True)
class PolicyResult:
    """One policy on one row (a rate, or a number of callers), over the rounds the comparison
    ran (each on the same trace).

    Attributes:
        model, mode, policy, fraction, load, deadline_ms: as in the points.
        rounds: the points, one per round.
    """

    model: str
    mode: str
    policy: str
    fraction: float | None
    load: float
    deadline_ms: float | None
    rounds: tuple[Point, ...]

    @property
    def goodput(self) -> float:
        """Answers OK within their deadline per second, over every round's window."""
        seconds = sum(p.window_s for p in self.rounds)
        return sum(p.ok - p.late_answers for p in self.rounds) / seconds if seconds > 0 else 0.0

    @property
    def standard_error(self) -> float:
        """Standard error of :attr:`goodput` (answers per second): from the spread of the
        rounds' goodputs (sample deviation / sqrt(rounds)) when there are two or more, and never
        below the counting error (square root of the good answers, Poisson, over the windows)."""
        seconds = sum(p.window_s for p in self.rounds)
        good = sum(max(p.ok - p.late_answers, 0) for p in self.rounds)
        counting = good**0.5 / seconds if seconds > 0 else 0.0
        n = len(self.rounds)
        if n < 2:
            return counting
        values = [goodput(p) for p in self.rounds]
        mean = sum(values) / n
        spread = (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5
        return max(spread, counting)

    @property
    def miss_share(self) -> float:
        """Deadline misses as a share of the requests of every round."""
        requests = sum(p.requests for p in self.rounds)
        return sum(p.deadline_misses for p in self.rounds) / requests if requests else 0.0

    def mean(self, attribute: str) -> float | None:
        """Mean of a point attribute (``p50_ms``, ``mean_batch``, ...) over the rounds that have it."""
        values = [v for p in self.rounds if (v := getattr(p, attribute)) is not None]
        return sum(values) / len(values) if values else None

    @property
    def row(self) -> str:
        """The row's kind and load: ``closed-unary c=16``, ``open-stream 154/s (80%)``."""
        return f"{KINDS[self.mode]} {load_label(self.rounds[0])}"


def _row_key(p: Point) -> tuple[str, str, float]:
    return (p.model, p.mode, p.fraction if p.fraction is not None else p.load)


def results(points: Sequence[Point]) -> list[PolicyResult]:
    """The comparison's points (modes :data:`OPEN_MODE`, :data:`CLOSED_MODE`) grouped by
    (model, row, policy), in the order first measured."""
    groups: dict[tuple[tuple[str, str, float], str], list[Point]] = {}
    for p in points:
        if p.mode in KINDS and p.policy is not None:
            groups.setdefault((_row_key(p), p.policy), []).append(p)
    return [PolicyResult(g[0].model, g[0].mode, policy, g[0].fraction, g[0].load, g[0].deadline_ms, tuple(g))
            for (_, policy), g in groups.items()]


COLUMNS = (("load", 22), ("policy", 13), ("goodput/s", 10), ("per round", 16), ("miss %", 7), ("batch", 6),
           ("p50 ms", 8), ("p99 ms", 8))


def format_policy_table(points: Sequence[Point]) -> str:
    """One table per model: each (row, policy) over its rounds (goodput of each round shown,
    so the spread is visible; batch, p50 and p99 are means over the rounds), closed-loop rows
    first, as terminal text."""
    out: list[str] = []
    summary = results(points)
    for model in dict.fromkeys(r.model for r in summary):
        # Stable sorts: the policy order within a row is kept.
        rows = sorted((r for r in summary if r.model == model),
                      key=lambda r: (r.mode != CLOSED_MODE, r.fraction or 0.0, r.load))
        deadline = next((r.deadline_ms for r in rows if r.deadline_ms is not None), None)
        out.append(f"{model} · adaptive vs fixed queue delay (same load per row); open-stream deadline "
                   f"{fmt(deadline, '.1f')} ms, closed loop none")
        out.append("  ".join(name.rjust(w) if i else name.ljust(w) for i, (name, w) in enumerate(COLUMNS)))
        for r in rows:
            cells = (r.row, r.policy, f"{r.goodput:.1f}",
                     " / ".join(f"{goodput(p):.0f}" for p in r.rounds), f"{r.miss_share:.1%}",
                     fmt(r.mean("mean_batch"), ".2f"), fmt(r.mean("p50_ms"), ".2f"), fmt(r.mean("p99_ms"), ".2f"))
            out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))))
        out.append("")
    return "\n".join(out)


def policy_targets(points: Sequence[Point]) -> list[Target]:
    """Per model and row of the comparison (every rate and every caller count): adaptive
    against the best fixed timer (most goodput over the rounds; fewer misses breaking ties).
    The verdict is ``PASS`` when adaptive's goodput is not below the best fixed timer's by more
    than two standard errors of the difference (:attr:`PolicyResult.standard_error` of each,
    combined: the rounds' spread, or the counting error where that is larger): two runs of the
    *same* policy on one trace can differ noticeably near saturation (an A/A run), and the best
    of several noisy timers is biased upward, so a strict ``>=`` would be a coin flip. Every
    row is checked, tiny included."""
    targets: list[Target] = []
    summary = results(points)
    for key in dict.fromkeys((r.model, r.mode, r.fraction, r.load) for r in summary):
        group = [r for r in summary if (r.model, r.mode, r.fraction, r.load) == key]
        adaptive = next((r for r in group if r.policy == ADAPTIVE), None)
        fixed = [r for r in group if r.policy != ADAPTIVE]
        name = f"{group[0].model} {group[0].row}: adaptive >= best fixed timer within 2 s.e."
        if adaptive is None or not fixed:
            targets.append(Target(name, "SKIP", "needs the adaptive policy and at least one fixed timer"))
            continue
        best = max(fixed, key=lambda r: (r.goodput, -r.miss_share))
        ratio = adaptive.goodput / best.goodput if best.goodput > 0 else None
        noise = (adaptive.standard_error**2 + best.standard_error**2) ** 0.5
        verdict = "PASS" if adaptive.goodput >= best.goodput - 2 * noise else "MISS"
        rounds = len(adaptive.rounds)

        def per_round(r: PolicyResult) -> str:
            return " / ".join(f"{goodput(p):.0f}" for p in r.rounds)

        targets.append(Target(name, verdict, (
            f"goodput {adaptive.goodput:.1f}/s vs {best.goodput:.1f}/s ({best.policy}) = {fmt(ratio, '.3f')}, "
            f"difference {adaptive.goodput - best.goodput:+.1f} ± {noise:.1f}/s (1 s.e.) "
            f"over {rounds} round{'s' if rounds != 1 else ''} "
            f"(rounds {per_round(adaptive)} vs {per_round(best)}); "
            f"misses {adaptive.miss_share:.1%} vs {best.miss_share:.1%}; "
            f"p50 {fmt(adaptive.mean('p50_ms'), '.1f')} vs {fmt(best.mean('p50_ms'), '.1f')} ms; "
            f"p99 {fmt(adaptive.mean('p99_ms'), '.1f')} vs {fmt(best.mean('p99_ms'), '.1f')} ms"
        )))
    return targets
