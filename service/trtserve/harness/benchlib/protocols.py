"""Pure comparison of the two doors, gRPC and HTTP (KServe v2 REST), on the closed-loop unary
sweep: the points side by side per server, the per-call ratios and the protocol targets.
No clock, no I/O.

Units as in :mod:`.report`: rows per second, latency in milliseconds, CPU per request in
microseconds (the server's whole process tree; the bench process).
"""

from __future__ import annotations

from collections.abc import Sequence

from trtserve.harness.benchlib.compare import SWEEP_MODE, peer_names, quotient
from trtserve.harness.benchlib.report import FLOOR, SERVER, Point, Target, fmt, format_header, format_row

GRPC, HTTP = "grpc", "http"
PROTOCOLS = (GRPC, HTTP)
"""``trtserve bench --protocol`` items: the doors the closed-loop unary sweep runs over."""
HTTP_MODE = "closed-http"
"""The closed-loop unary sweep over the HTTP door (``SWEEP_MODE`` is the gRPC one)."""
MODE_OF = {GRPC: SWEEP_MODE, HTTP: HTTP_MODE}
CPU_MODEL = "tiny"
CPU_CALLERS = 64
HTTP_CPU_RATIO = 0.4
"""tiny at 64 callers: trtserve's server CPU per call over HTTP at most this × over gRPC."""
PEAK_MODEL = "tiny"
HTTP_PEAK_RATIO = 1.2
"""tiny: trtserve's peak rows/s over HTTP at least this × the peer's peak over HTTP."""


def parse_protocols(text: str) -> list[str]:
    """``grpc,http`` → ``["grpc", "http"]`` (order kept, repeats dropped).

    Raises:
        ValueError: an empty list or an item other than ``grpc`` and ``http`` (named).
    """
    items = list(dict.fromkeys(v.strip().lower() for v in text.split(",") if v.strip()))
    unknown = [v for v in items if v not in PROTOCOLS]
    if unknown or not items:
        raise ValueError(f"expected {' and/or '.join(PROTOCOLS)} separated by commas, got '{text}'")
    return items


def _sweep(points: Sequence[Point], model: str, server: str, protocol: str) -> dict[float, Point]:
    """Callers → point of one server's closed-loop unary sweep over one door."""
    mode = MODE_OF[protocol]
    return {p.load: p for p in points if p.model == model and p.server == server and p.mode == mode}


def _peak(sweep: dict[float, Point]) -> Point | None:
    return max(sweep.values(), key=lambda p: p.rows_per_s, default=None)


def format_protocol_table(points: Sequence[Point]) -> str:
    """Per model with HTTP points: every server's sweep over each door (a table of
    :func:`~.report.format_row` lines labelled server and door), then per caller count
    trtserve's HTTP/gRPC ratios of server CPU, client CPU and rows/s. Empty without HTTP points."""
    out: list[str] = []
    servers = [SERVER, *peer_names(points), *({p.server for p in points} & {FLOOR})]
    for model in dict.fromkeys(p.model for p in points if p.mode == HTTP_MODE):
        out.append(f"\n{model} · closed-unary by door (gRPC over the run's connections; HTTP: KServe v2 REST, "
                   "binary tensors, one kept-alive connection per caller)")
        out.append(f"{'server':9} {'door':5} {format_header()}")
        for server in servers:
            for protocol in PROTOCOLS:
                for p in _sweep(points, model, server, protocol).values():
                    out.append(f"{server:9} {protocol:5} {format_row(p)}")
        grpc, http = _sweep(points, model, SERVER, GRPC), _sweep(points, model, SERVER, HTTP)
        for load in sorted(set(grpc) & set(http)):
            g, h = grpc[load], http[load]
            out.append(f"  c={load:<4g} trtserve http/grpc: server CPU per call "
                       f"{_ratio_cell(h.server_cpu_us_per_request, g.server_cpu_us_per_request, 'us')}, "
                       f"client CPU per call "
                       f"{_ratio_cell(h.client_cpu_us_per_request, g.client_cpu_us_per_request, 'us')}, "
                       f"rows/s {_ratio_cell(h.rows_per_s, g.rows_per_s, '')}")
    return "\n".join(out)


def _ratio_cell(a: float | None, b: float | None, unit: str) -> str:
    """``a/b unit = a÷b``, e.g. ``290/1320 us = 0.22``."""
    suffix = f" {unit}" if unit else ""
    return f"{fmt(a, '.0f')}/{fmt(b, '.0f')}{suffix} = {fmt(quotient(a, b), '.2f')}"


def protocol_targets(points: Sequence[Point]) -> list[Target]:
    """The door targets: trtserve's server CPU per call over HTTP against gRPC (same run), and
    its HTTP peak against the peer's HTTP peak where a peer ran over HTTP."""
    targets: list[Target] = []
    name = (f"{CPU_MODEL} at {CPU_CALLERS} callers: server CPU per call over HTTP <= {HTTP_CPU_RATIO:g} x over gRPC "
            "(same run, whole process tree)")
    g = _sweep(points, CPU_MODEL, SERVER, GRPC).get(CPU_CALLERS)
    h = _sweep(points, CPU_MODEL, SERVER, HTTP).get(CPU_CALLERS)
    if g is None or h is None:
        why = f"needs the closed-unary sweep at {CPU_CALLERS} callers over both doors (--protocol grpc,http)"
        targets.append(Target(name, "SKIP", why))
    else:
        r = quotient(h.server_cpu_us_per_request, g.server_cpu_us_per_request)
        targets.append(Target(name, "PASS" if r is not None and r <= HTTP_CPU_RATIO else "MISS", (
            f"{_ratio_cell(h.server_cpu_us_per_request, g.server_cpu_us_per_request, 'us')}; bench client CPU "
            f"per call {_ratio_cell(h.client_cpu_us_per_request, g.client_cpu_us_per_request, 'us')}"
        )))

    peer = next(iter(peer_names(points)), None)
    name = f"{PEAK_MODEL} peak rows/s over HTTP >= {HTTP_PEAK_RATIO:g} x {peer or 'the peer'}'s HTTP peak"
    own = _peak(_sweep(points, PEAK_MODEL, SERVER, HTTP))
    other = _peak(_sweep(points, PEAK_MODEL, peer, HTTP)) if peer else None
    if own is None or other is None:
        targets.append(Target(name, "SKIP", "needs both servers' closed-unary sweep over HTTP (--peer triton, "
                                            "--protocol with http)"))
    else:
        r = quotient(own.rows_per_s, other.rows_per_s)
        targets.append(Target(name, "PASS" if r is not None and r >= HTTP_PEAK_RATIO else "MISS", (
            f"{own.rows_per_s:.0f} (c={own.load:g}) / {other.rows_per_s:.0f} (c={other.load:g}) = {fmt(r, '.2f')}"
        )))
    return targets
