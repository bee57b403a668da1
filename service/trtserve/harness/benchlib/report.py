"""Pure statistics of a benchmark run: per-point summaries, the raw reference, the targets
and the terminal tables. No clock, no I/O: everything here is computed from numbers
the load generators and the raw reference measured.

Units: latencies are measured in microseconds and reported in milliseconds (``*_ms``);
throughput in rows per second; CPU time in seconds, reported per request in microseconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trtserve.harness.benchlib.deadlines import OPEN_BATCH_RUNS, DeadlineClass

MODES = ("closed-unary", "closed-stream", "open-unary", "open-stream")
"""Sweep kinds: closed loop (a fixed number of callers, each sending its next request when
the last is answered) or open loop (Poisson arrivals at a fixed rate, each request with a
deadline), over unary ModelInfer or one ModelStreamInfer stream."""

PERCENTILES = (50, 90, 99)
SERVER = "trtserve"
"""``Point.server`` of the server under test (a peer's points carry the peer's name)."""
FLOOR = "null"
"""``Point.server`` of the null server (:mod:`.null_server`): the transport's floor, not a peer."""

SATURATION_MODEL = "minilm"
SATURATION_RATIO = 0.90
SATURATION_STRETCH = 0.95
SEQUENTIAL_SLACK_MS = 1.0
OVERHEAD_MODEL = "tiny"
OVERHEAD_CONCURRENCY = 64
OPEN_FRACTION = 0.8
MAX_MISS_FRACTION = 0.01


@dataclass(frozen=True)
class Snapshot:
    """Counters read at one instant of a sweep point.

    Attributes:
        server_cpu_s: user + system CPU seconds of the server process since it started.
        client_cpu_s: user + system CPU seconds of the bench process since it started, plus
            those of the Go load generator when it drives the point.
        inference_count: rows the model has run (ModelStatistics ``inference_count``).
        execution_count: engine runs (ModelStatistics ``execution_count``).
        batches: batch size in rows → engine runs at that size (``batch_stats``).
        server_rss_mib: resident memory of the server's process tree in MiB (None: not read).
    """

    server_cpu_s: float
    client_cpu_s: float
    inference_count: int
    execution_count: int
    batches: Mapping[int, int]
    server_rss_mib: float | None = None


@dataclass(frozen=True)
class Measurement:
    """What one sweep point measured: every request started inside its window.

    Attributes:
        model: model name.
        mode: one of :data:`MODES`.
        load: callers (closed loop) or offered requests per second (open loop).
        fraction: open loop: ``load`` as a fraction of the measured capacity; else None.
        window_s: length of the measuring window in seconds.
        rows_per_request: rows (batch dim) in each request.
        latency_us: per request, microseconds from sending it to its answer.
        codes: per request, the gRPC status name of its answer (``"OK"``, ...); over HTTP,
            ``"OK"`` or ``"HTTP <status>"`` (:func:`.httpclient.status_name`).
        late: answers that came back OK but later than the request's deadline.
        deadline_us: the ``timeout`` parameter each request carried (µs), or None.
        send_lag_us: open loop: per request, microseconds the generator sent it after its
            scheduled arrival (how well it kept to the Poisson schedule); empty otherwise.
        before, after: counters at the start of the window and after the last answer.
        policy: the dispatch policy the server ran (policy comparison points); else None.
        server: which server was driven: :data:`SERVER` or a peer (``"triton"``).
        connections: client connections (gRPC channels; HTTP connections) the unary calls
            were spread over.
        classes: the requests by deadline class (overload and mixed modes); else empty.
        door: the door the requests went to: ``grpc`` or ``http`` (KServe v2 REST).
    """

    model: str
    mode: str
    load: float
    fraction: float | None
    window_s: float
    rows_per_request: int
    latency_us: np.ndarray
    codes: Sequence[str]
    late: int
    deadline_us: int | None
    send_lag_us: np.ndarray
    before: Snapshot
    after: Snapshot
    policy: str | None = None
    server: str = SERVER
    connections: int = 1
    classes: tuple[DeadlineClass, ...] = ()
    door: str = "grpc"


def percentiles_ms(latency_us: np.ndarray, qs: Sequence[float] = PERCENTILES) -> dict[int | float, float | None]:
    """Latency percentiles in milliseconds (linear interpolation); None each when empty."""
    if len(latency_us) == 0:
        return {q: None for q in qs}
    values = np.percentile(np.asarray(latency_us, dtype=np.float64), qs) / 1000.0
    return {q: float(v) for q, v in zip(qs, values)}


def ratio(served_rows_per_s: float, raw_rows_per_s: float) -> float | None:
    """Served throughput over the raw engine's best (rows/s ÷ rows/s); None without a reference."""
    if raw_rows_per_s <= 0:
        return None
    return served_rows_per_s / raw_rows_per_s


def batch_delta(before: Snapshot, after: Snapshot) -> dict[int, int]:
    """Engine runs per batch size between two snapshots (sizes with no run left out)."""
    delta = {size: after.batches.get(size, 0) - before.batches.get(size, 0) for size in after.batches}
    return {size: n for size, n in sorted(delta.items()) if n > 0}


@dataclass(frozen=True)
class RawSize:
    """The raw engine at one batch size.

    Attributes:
        batch: rows per run.
        latencies_us: each timed run's wall time in microseconds.
    """

    batch: int
    latencies_us: tuple[float, ...]

    @property
    def rows_per_s(self) -> float:
        """Rows per second over all timed runs (rows / summed run time: what back-to-back
        runs sustain, slow runs included)."""
        total = sum(self.latencies_us)
        return self.batch * len(self.latencies_us) / (total / 1e6) if total > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        """Median run time in milliseconds."""
        return float(np.median(self.latencies_us)) / 1000.0


@dataclass(frozen=True)
class RawReference:
    """The model file run directly in ONNX Runtime (no server) at batch sizes 1, 2, 4, …

    Attributes:
        model: model name.
        sizes: one entry per batch size, ascending.
    """

    model: str
    sizes: tuple[RawSize, ...]

    @property
    def best(self) -> RawSize:
        """The batch size with the most rows per second."""
        return max(self.sizes, key=lambda s: s.rows_per_s)

    @property
    def batch1_ms(self) -> float:
        """Median latency of a batch of one, in milliseconds."""
        return next(s for s in self.sizes if s.batch == 1).p50_ms

    def run_ms(self, rows: float) -> float:
        """Median latency (ms) of the smallest measured batch size of at least ``rows`` rows
        (the largest size when none is that large)."""
        return next((s.p50_ms for s in self.sizes if s.batch >= rows), self.sizes[-1].p50_ms)

    def summary(self) -> dict[str, object]:
        """JSON-ready: best rows/s and its batch, batch-of-one latency, and every size."""
        return {
            "model": self.model,
            "best_rows_per_s": self.best.rows_per_s,
            "best_batch": self.best.batch,
            "batch1_ms": self.batch1_ms,
            "sizes": [
                {"batch": s.batch, "runs": len(s.latencies_us), "rows_per_s": s.rows_per_s, "p50_ms": s.p50_ms}
                for s in self.sizes
            ],
        }


@dataclass(frozen=True)
class Point:
    """One sweep point's summary: a table row and a JSON record.

    Attributes:
        model, mode, load, fraction, window_s: as in :class:`Measurement`.
        deadline_ms: each request's deadline in milliseconds, or None.
        requests: requests in the window; ok: of them answered OK.
        rows_per_s, requests_per_s: OK rows and OK requests per second of window.
        p50_ms, p90_ms, p99_ms: latency percentiles of the OK answers (None without any).
        errors: gRPC status name → answers with it, OK left out.
        deadline_misses: answers DEADLINE_EXCEEDED plus OK answers after their deadline.
        late_answers: the OK answers after their deadline.
        mean_batch: rows per engine run in the window (None without a run).
        batch_hist: batch size → engine runs in the window.
        ratio: rows_per_s ÷ the raw engine's best rows/s.
        server_cpu_us_per_request, client_cpu_us_per_request: CPU microseconds per request
            of the server and of the bench process.
        send_lag_p99_ms: open loop: p99 of how late the generator sent a request after its
            scheduled arrival (ms); None for the closed loop.
        policy, server, connections, classes, rows_per_request, door: as in :class:`Measurement`.
        rss_start_mib, rss_end_mib: the server tree's resident memory (MiB) at the start of
            the window and after its last answer; None where not read.
    """

    model: str
    mode: str
    load: float
    fraction: float | None
    deadline_ms: float | None
    window_s: float
    requests: int
    ok: int
    rows_per_s: float
    requests_per_s: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    errors: dict[str, int]
    deadline_misses: int
    late_answers: int
    mean_batch: float | None
    batch_hist: dict[int, int]
    ratio: float | None
    server_cpu_us_per_request: float | None
    client_cpu_us_per_request: float | None
    send_lag_p99_ms: float | None
    policy: str | None = None
    server: str = SERVER
    connections: int = 1
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    classes: tuple[DeadlineClass, ...] = ()
    rows_per_request: int = 1
    door: str = "grpc"


def summarize(m: Measurement, raw_best_rows_per_s: float) -> Point:
    """Summarize a measured point; CPU per request divides the CPU seconds between the
    snapshots by the requests of the window."""
    codes = np.asarray(m.codes, dtype=object)
    ok = codes == "OK"
    n_ok = int(ok.sum())
    rows_per_s = n_ok * m.rows_per_request / m.window_s if m.window_s > 0 else 0.0
    pct = percentiles_ms(np.asarray(m.latency_us)[ok])
    errors = dict(sorted(Counter(c for c in m.codes if c != "OK").items()))
    executions = m.after.execution_count - m.before.execution_count
    rows_run = m.after.inference_count - m.before.inference_count
    requests = len(m.codes)

    def per_request_us(seconds: float) -> float | None:
        return seconds * 1e6 / requests if requests else None

    return Point(
        model=m.model,
        mode=m.mode,
        load=m.load,
        fraction=m.fraction,
        deadline_ms=m.deadline_us / 1000.0 if m.deadline_us is not None else None,
        window_s=m.window_s,
        requests=requests,
        ok=n_ok,
        rows_per_s=rows_per_s,
        requests_per_s=n_ok / m.window_s if m.window_s > 0 else 0.0,
        p50_ms=pct[50],
        p90_ms=pct[90],
        p99_ms=pct[99],
        errors=errors,
        deadline_misses=errors.get("DEADLINE_EXCEEDED", 0) + m.late,
        late_answers=m.late,
        mean_batch=rows_run / executions if executions > 0 else None,
        batch_hist=batch_delta(m.before, m.after),
        ratio=ratio(rows_per_s, raw_best_rows_per_s),
        server_cpu_us_per_request=per_request_us(m.after.server_cpu_s - m.before.server_cpu_s),
        client_cpu_us_per_request=per_request_us(m.after.client_cpu_s - m.before.client_cpu_s),
        send_lag_p99_ms=percentiles_ms(m.send_lag_us, (99,))[99],
        policy=m.policy,
        server=m.server,
        connections=m.connections,
        rss_start_mib=m.before.server_rss_mib,
        rss_end_mib=m.after.server_rss_mib,
        classes=m.classes,
        rows_per_request=m.rows_per_request,
        door=m.door,
    )


@dataclass(frozen=True)
class Target:
    """One target, checked on a run.

    Attributes:
        name: what is checked.
        verdict: ``PASS``, ``MISS``, ``INFO`` (reported, no threshold) or ``SKIP`` (the run
            did not measure it).
        detail: the numbers behind the verdict.
    """

    name: str
    verdict: str
    detail: str

    def line(self) -> str:
        return f"{self.verdict:<4}  {self.name}: {self.detail}"


def _pick(points: Sequence[Point], model: str, mode: str, load: float | None = None,
          fraction: float | None = None) -> Point | None:
    for p in points:
        if p.model != model or p.mode != mode:
            continue
        if load is not None and p.load != load:
            continue
        if fraction is not None and (p.fraction is None or abs(p.fraction - fraction) > 1e-9):
            continue
        return p
    return None


def fmt(v: float | None, spec: str = ".1f") -> str:
    """``v`` formatted with ``spec``; ``-`` for None."""
    return "-" if v is None else format(v, spec)


def check_targets(points: Sequence[Point], raws: Mapping[str, RawReference]) -> list[Target]:
    """The serving targets, from the point summaries (of trtserve; a peer's are left out)
    and the raw references."""
    points = [p for p in points if p.server == SERVER]
    targets: list[Target] = []
    name = f"{SATURATION_MODEL} saturation: served rows/s >= {SATURATION_RATIO:.2f} x raw best-batch rows/s"
    closed = [p for p in points if p.model == SATURATION_MODEL and p.mode.startswith("closed")]
    raw = raws.get(SATURATION_MODEL)
    if closed and raw is not None:
        top = max(closed, key=lambda p: p.rows_per_s)
        r = ratio(top.rows_per_s, raw.best.rows_per_s)
        verdict = "PASS" if r is not None and r >= SATURATION_RATIO else "MISS"
        met = r is not None and r >= SATURATION_STRETCH
        stretch = "stretch met" if met else f"stretch {SATURATION_STRETCH:.2f} not met"
        targets.append(Target(name, verdict, (
            f"{top.rows_per_s:.1f} rows/s ({top.mode} c={top.load:g}) / "
            f"{raw.best.rows_per_s:.1f} rows/s (raw batch {raw.best.batch}) = {fmt(r, '.3f')}; {stretch}"
        )))
    else:
        targets.append(Target(name, "SKIP", "needs the model's closed-loop points"))

    name = f"{SATURATION_MODEL} one sequential caller: p50 <= raw batch-of-one + {SEQUENTIAL_SLACK_MS:g} ms"
    p = _pick(points, SATURATION_MODEL, "closed-unary", load=1)
    if p is not None and raw is not None and p.p50_ms is not None:
        limit = raw.batch1_ms + SEQUENTIAL_SLACK_MS
        verdict = "PASS" if p.p50_ms <= limit else "MISS"
        targets.append(Target(name, verdict, f"p50 {p.p50_ms:.2f} ms vs raw {raw.batch1_ms:.2f} ms "
                                             f"+ {SEQUENTIAL_SLACK_MS:g} = {limit:.2f} ms"))
    else:
        targets.append(Target(name, "SKIP", "needs closed-unary at concurrency 1"))

    for mode in ("closed-unary", "closed-stream"):
        name = f"{OVERHEAD_MODEL} {mode.split('-')[1]} at concurrency {OVERHEAD_CONCURRENCY}"
        p = _pick(points, OVERHEAD_MODEL, mode, load=OVERHEAD_CONCURRENCY)
        if p is None:
            targets.append(Target(name, "SKIP", f"needs {mode} at concurrency {OVERHEAD_CONCURRENCY}"))
            continue
        targets.append(Target(name, "INFO", (
            f"{p.requests_per_s:.0f} req/s, server CPU {fmt(p.server_cpu_us_per_request, '.0f')} us/request, "
            f"bench client CPU {fmt(p.client_cpu_us_per_request, '.0f')} us/request"
        )))

    opened = sorted({(p.model, p.mode) for p in points if p.mode.startswith("open")})
    for model, mode in opened:
        name = (f"{model} {mode} at {OPEN_FRACTION:.0%} capacity, deadline 4x batch-of-one (at least 5 ms) and "
                f"at least {OPEN_BATCH_RUNS:g} runs of the capacity batch: misses <= {MAX_MISS_FRACTION:.0%}")
        p = _pick(points, model, mode, fraction=OPEN_FRACTION)
        if p is None or not p.requests:
            targets.append(Target(name, "SKIP", f"needs the {OPEN_FRACTION:g} rate point"))
            continue
        share = p.deadline_misses / p.requests
        verdict = "PASS" if share <= MAX_MISS_FRACTION else "MISS"
        targets.append(Target(name, verdict, (
            f"{p.deadline_misses} of {p.requests} ({share:.1%}) missed the {fmt(p.deadline_ms, '.2f')} ms deadline "
            f"({p.late_answers} answered late) at {p.load:.0f} req/s"
        )))
    return targets


COLUMNS = (
    ("load", 16), ("rows/s", 9), ("p50 ms", 9), ("p90 ms", 9), ("p99 ms", 9), ("errors", 24),
    ("misses", 7), ("batch", 6), ("ratio", 6), ("srv us/req", 10), ("cli us/req", 10),
)


def load_label(p: Point) -> str:
    """``c=16`` (closed loop) or ``160/s (80%)`` (open loop)."""
    if p.fraction is None:
        return f"c={p.load:g}"
    return f"{p.load:.0f}/s ({p.fraction:.0%})"


def format_header() -> str:
    """The column names of :func:`format_row`."""
    return "  ".join(name.rjust(w) if i else name.ljust(w) for i, (name, w) in enumerate(COLUMNS))


def format_row(p: Point) -> str:
    """One point as a table line (see :data:`COLUMNS`)."""
    errors = ", ".join(f"{code} {n}" for code, n in p.errors.items()) or "-"
    cells = (
        load_label(p), fmt(p.rows_per_s), fmt(p.p50_ms, ".2f"), fmt(p.p90_ms, ".2f"), fmt(p.p99_ms, ".2f"),
        errors, str(p.deadline_misses), fmt(p.mean_batch, ".2f"), fmt(p.ratio, ".2f"),
        fmt(p.server_cpu_us_per_request, ".0f"), fmt(p.client_cpu_us_per_request, ".0f"),
    )
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))


def format_tables(points: Sequence[Point], raws: Mapping[str, RawReference]) -> str:
    """Every model's raw reference and one table per mode (trtserve's points; a peer's are
    in :func:`~.compare.format_comparison`), as terminal text."""
    points = [p for p in points if p.server == SERVER]
    out: list[str] = []
    for model in dict.fromkeys([*raws, *(p.model for p in points)]):
        raw = raws.get(model)
        if raw is not None:
            out.append(f"{model}: raw ONNX Runtime best {raw.best.rows_per_s:.1f} rows/s at batch {raw.best.batch}, "
                       f"batch-of-one {raw.batch1_ms:.3f} ms")
            out.append("  " + "  ".join(f"b{s.batch}: {s.rows_per_s:.0f}/s {s.p50_ms:.2f} ms" for s in raw.sizes))
        for mode in MODES:
            rows = [p for p in points if p.model == model and p.mode == mode]
            if not rows:
                continue
            deadline = f", deadline {rows[0].deadline_ms:.2f} ms" if rows[0].deadline_ms is not None else ""
            out.append(f"\n{model} · {mode}{deadline}")
            out.append(format_header())
            out.extend(format_row(p) for p in rows)
        out.append("")
    return "\n".join(out)
