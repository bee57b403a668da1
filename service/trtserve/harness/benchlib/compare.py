"""Pure comparison of trtserve with its peer (Triton through PyTriton) and with itself over
one client connection: the closed-loop unary sweep side by side, the ratios per row and the
comparison targets. No clock, no I/O.

Units as in :mod:`.report`: requests per second, latency in milliseconds, server CPU per
request in microseconds (the server's whole process tree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trtserve.harness.benchlib.report import FLOOR, SEQUENTIAL_SLACK_MS, SERVER, Point, RawReference, Target, fmt

SWEEP_MODE = "closed-unary"
"""The sweep run against every server."""
ONE_CONNECTION_MODE = "closed-1conn"
"""trtserve's closed-loop unary sweep with every caller on one connection."""
PEAK_MODEL = "tiny"
PEAK_RATIO = 1.2
"""tiny: trtserve's peak req/s over the sweep at least this × the peer's peak."""
SATURATION_MODEL = "minilm"
SATURATION_CALLERS = 64
SATURATION_RATIO = 0.95
"""minilm at 64 callers: served rows/s at least this × the raw engine's best batch."""
CPU_MODEL = "tiny"
CPU_CALLERS = 64


def _of(p: Point | None, name: str) -> float | None:
    """Field ``name`` of ``p`` (a number or None); None without a point."""
    return None if p is None else getattr(p, name)


def quotient(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


@dataclass(frozen=True)
class Row:
    """One caller count of a model's sweep on each server.

    Attributes:
        callers: concurrent closed-loop callers.
        own: trtserve over the run's connections; one_connection: trtserve over one;
        peer: the peer (None where it did not run).
    """

    callers: float
    own: Point | None
    one_connection: Point | None
    peer: Point | None

    @property
    def throughput_ratio(self) -> float | None:
        """trtserve req/s ÷ the peer's req/s."""
        return quotient(_of(self.own, "requests_per_s"), _of(self.peer, "requests_per_s"))

    @property
    def p50_ratio(self) -> float | None:
        """trtserve p50 ÷ the peer's p50 (below 1: trtserve answers sooner)."""
        return quotient(_of(self.own, "p50_ms"), _of(self.peer, "p50_ms"))


def _sweep(points: Sequence[Point], model: str, server: str, mode: str = SWEEP_MODE) -> dict[float, Point]:
    return {p.load: p for p in points if p.model == model and p.server == server and p.mode == mode}


def peer_names(points: Sequence[Point]) -> list[str]:
    """The peers that have points, in order of appearance (the null server is no peer)."""
    return list(dict.fromkeys(p.server for p in points if p.server not in (SERVER, FLOOR)))


def comparison_rows(points: Sequence[Point], model: str, peer: str | None) -> list[Row]:
    """The sweep of ``model`` per caller count, trtserve (both connection counts) beside ``peer``."""
    own, one = _sweep(points, model, SERVER), _sweep(points, model, SERVER, ONE_CONNECTION_MODE)
    other = _sweep(points, model, peer) if peer else {}
    loads = sorted({*own, *one, *other})
    return [Row(c, own.get(c), one.get(c), other.get(c)) for c in loads]


def _cell(p: Point | None) -> str:
    return f"{fmt(_of(p, 'requests_per_s'), '.0f'):>7} {fmt(_of(p, 'p50_ms'), '.2f'):>7}"


def format_comparison(points: Sequence[Point]) -> str:
    """Per model, the closed-loop unary sweep: trtserve over the run's connections and over
    one, the peer, the ratios (trtserve ÷ peer) and each server's mean batch and CPU µs per
    request; empty when there is nothing to compare."""
    peer = next(iter(peer_names(points)), None)
    out: list[str] = []
    for model in dict.fromkeys(p.model for p in points):
        rows = comparison_rows(points, model, peer)
        if not rows or not any(r.one_connection or r.peer for r in rows):
            continue
        conns = next((r.own.connections for r in rows if r.own), None)
        name = peer or "peer"
        out.append(f"\n{model} · closed-unary: trtserve over {fmt(conns, 'd')} connections, over 1, and {name}"
                   " (req/s and p50 ms; ratios trtserve/" + name + ")")
        out.append(f"{'callers':8} {'trtserve':>15} {'1 conn':>15} {name:>15} {'x req/s':>8} {'x p50':>6}"
                   f" {'batch':>11} {'srv us/req':>13}")
        for r in rows:
            batch = f"{fmt(_of(r.own, 'mean_batch'), '.1f')}/{fmt(_of(r.peer, 'mean_batch'), '.1f')}"
            cpu = (f"{fmt(_of(r.own, 'server_cpu_us_per_request'), '.0f')}/"
                   f"{fmt(_of(r.peer, 'server_cpu_us_per_request'), '.0f')}")
            out.append(f"c={r.callers:<6g} {_cell(r.own)} {_cell(r.one_connection)} {_cell(r.peer)}"
                       f" {fmt(r.throughput_ratio, '.2f'):>8} {fmt(r.p50_ratio, '.2f'):>6} {batch:>11} {cpu:>13}")
    return "\n".join(out)


def _peak(sweep: Mapping[float, Point]) -> Point | None:
    return max(sweep.values(), key=lambda p: p.requests_per_s, default=None)


def anchor_targets(points: Sequence[Point], raws: Mapping[str, RawReference]) -> list[Target]:
    """The comparison targets (closed-loop unary over the run's connections), with the peer's
    figure beside trtserve's where a peer ran."""
    peer = next(iter(peer_names(points)), None)
    targets: list[Target] = []

    name = f"{PEAK_MODEL} peak req/s over the sweep >= {PEAK_RATIO:g} x {peer or 'the peer'}'s peak"
    own, other = _peak(_sweep(points, PEAK_MODEL, SERVER)), _peak(_sweep(points, PEAK_MODEL, peer)) if peer else None
    if own is None or other is None:
        targets.append(Target(name, "SKIP", "needs both servers' closed-unary sweep (--peer triton)"))
    else:
        r = quotient(own.requests_per_s, other.requests_per_s)
        targets.append(Target(name, "PASS" if r is not None and r >= PEAK_RATIO else "MISS", (
            f"{own.requests_per_s:.0f} (c={own.load:g}) / {other.requests_per_s:.0f} (c={other.load:g}) "
            f"= {fmt(r, '.2f')}"
        )))

    raw = raws.get(SATURATION_MODEL)
    name = f"{SATURATION_MODEL} at {SATURATION_CALLERS} callers: rows/s >= {SATURATION_RATIO:.2f} x raw best batch"
    p = _sweep(points, SATURATION_MODEL, SERVER).get(SATURATION_CALLERS)
    if p is None or raw is None:
        why = f"needs closed-unary at {SATURATION_CALLERS} callers and the raw reference"
        targets.append(Target(name, "SKIP", why))
    else:
        r = quotient(p.rows_per_s, raw.best.rows_per_s)
        q = _sweep(points, SATURATION_MODEL, peer).get(SATURATION_CALLERS) if peer else None
        beside = f"; {peer} {q.rows_per_s:.1f} = {fmt(quotient(q.rows_per_s, raw.best.rows_per_s), '.2f')}" if q else ""
        targets.append(Target(name, "PASS" if r is not None and r >= SATURATION_RATIO else "MISS", (
            f"{p.rows_per_s:.1f} / {raw.best.rows_per_s:.1f} (raw batch {raw.best.batch}) = {fmt(r, '.2f')}{beside}"
        )))

    name = f"{SATURATION_MODEL} one caller: p50 <= raw batch-of-one + {SEQUENTIAL_SLACK_MS:g} ms"
    p = _sweep(points, SATURATION_MODEL, SERVER).get(1)
    if p is None or raw is None or p.p50_ms is None:
        targets.append(Target(name, "SKIP", "needs closed-unary at 1 caller and the raw reference"))
    else:
        q = _sweep(points, SATURATION_MODEL, peer).get(1) if peer else None
        beside = f"; {peer} {fmt(q.p50_ms, '.2f')} ms" if q else ""
        limit = raw.batch1_ms + SEQUENTIAL_SLACK_MS
        targets.append(Target(name, "PASS" if p.p50_ms <= limit else "MISS", (
            f"p50 {p.p50_ms:.2f} ms vs raw {raw.batch1_ms:.2f} + {SEQUENTIAL_SLACK_MS:g} = {limit:.2f} ms{beside}"
        )))

    name = f"{CPU_MODEL} at {CPU_CALLERS} callers: server CPU per request (whole process tree)"
    p = _sweep(points, CPU_MODEL, SERVER).get(CPU_CALLERS)
    if p is None:
        targets.append(Target(name, "SKIP", f"needs closed-unary at {CPU_CALLERS} callers"))
    else:
        q = _sweep(points, CPU_MODEL, peer).get(CPU_CALLERS) if peer else None
        beside = f" vs {peer} {fmt(q.server_cpu_us_per_request, '.0f')} us" if q else ""
        targets.append(Target(name, "INFO", f"trtserve {fmt(p.server_cpu_us_per_request, '.0f')} us{beside}"))
    return targets
