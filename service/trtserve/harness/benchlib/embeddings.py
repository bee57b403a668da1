"""The embeddings comparison of ``trtserve bench`` (mode ``embeddings``): sentence embeddings
through an OpenAI-style HTTP embeddings route, closed loop, on trtserve and on a peer that
serves the same model (Infinity, :mod:`.infinity`), one server at a time.

Each point is one server, one request size (:data:`TEXTS_PER_REQUEST` texts per request,
sentences of the corpus the bench loads) and one number of callers (``--concurrency``): every
caller sends its next ``POST`` when the last is answered, over a connection of its own
(aiohttp, keep-alive). Request bodies (``{"model": ..., "input": [...]}``, JSON) are built
before any clock starts; an answer counts as OK on HTTP 200 with its whole body read (the
body is not parsed, so the client's cost per call stays small and equal for both servers).
Each point runs unmeasured for ``--warmup`` seconds *and* until every caller has had its first
answer (with 64 callers of 32 texts a round is many seconds, and the first round's latencies are
not the steady state's), then a window of ``--duration`` seconds (longer, until an answer has
come inside it): the answers that come inside the window are its sample. After the window the
callers stop and their requests in flight are awaited unmeasured, so no queue is left behind for
the next point (or the next server).

Figures per point: texts/s (texts of the OK answers in the window ÷ its length: the served
rate, counted where it is delivered), p50/p99 latency in ms (send → answer, OK answers in the
window), errors by HTTP status (or the client exception's name), and the server's CPU time per
text in µs (its whole process tree, :mod:`.proctree`, over the window ÷ the texts answered in
it). Targets (:func:`embeddings_targets`): trtserve's
texts/s ≥ :data:`THROUGHPUT_RATIO` × the peer's at every (request size, callers), and
trtserve's p50 at one caller ≤ the peer's, per request size.

The mode's long documents (``"long_text": "chunk"`` against the same windows sent apart) are
:mod:`.longtext`'s, on the same loop (:func:`closed_loop_window`, :func:`summarise`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np
import orjson

from trtserve.harness.benchlib.proctree import tree_cpu_seconds
from trtserve.harness.benchlib.report import SERVER, Target, fmt, percentiles_ms
from trtserve.testing import ServerProcess

EMBEDDINGS_MODE = "embeddings"
"""The ``--modes`` item of this comparison."""
EMBEDDINGS_MODEL = "minilm"
"""The model compared: the one whose sentence-transformers weights the peer can load too."""
TEXTS_PER_REQUEST = (1, 32)
"""Texts (``input`` strings) per request, one row of points each."""
TRTSERVE_PATH = "/v1/embeddings"
"""trtserve's route (:mod:`trtserve.frontend.http.openai`)."""
THROUGHPUT_RATIO = 1.2
"""Target: trtserve's texts/s over the peer's, at every point."""
CALL_TIMEOUT_S = 300.0
"""Client timeout of one request: a safety net against a hung server, never reached in a healthy run."""
OK = "OK"


@dataclass(frozen=True)
class EmbeddingPoint:
    """One closed-loop point of the embeddings comparison.

    Attributes:
        server: :data:`~.report.SERVER` or the peer's name.
        model: the model name sent in ``model``.
        texts_per_request: strings in each request's ``input``.
        callers: concurrent callers (closed loop).
        window_s: length of the measuring window in seconds.
        requests: answers inside the window (OK or not).
        texts_per_s: texts of the OK answers per second of window.
        p50_ms, p99_ms: latency percentiles of the OK answers (ms; None without one).
        errors: answers other than OK, by HTTP status or client exception name.
        server_cpu_us_per_text: server process tree's CPU µs in the window per text answered OK
            in it (None when none was).
    """

    server: str
    model: str
    texts_per_request: int
    callers: int
    window_s: float
    requests: int
    texts_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    errors: dict[str, int] = field(default_factory=dict)
    server_cpu_us_per_text: float | None = None


def request_bodies(model: str, texts: Sequence[str], per_request: int) -> list[bytes]:
    """JSON bodies of ``per_request`` consecutive texts each (the texts repeat, in order, to
    fill the last one); at least one body.

    Raises:
        ValueError: no texts.
    """
    if not texts:
        raise ValueError("the embeddings comparison needs sentences: no corpus under --data")
    count = max(1, len(texts) // per_request)
    return [orjson.dumps({"model": model, "input": [texts[(b * per_request + i) % len(texts)]
                                                    for i in range(per_request)]})
            for b in range(count)]


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[str, bytes]:
    """One request: ``OK`` and the body on 200, else the status or the exception's name (and no body)."""
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            answer = await response.read()
            return (OK, answer) if response.status == 200 else (str(response.status), b"")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return type(exc).__name__, b""


@dataclass(frozen=True)
class LoopWindow:
    """What one closed loop's measuring window saw.

    Attributes:
        window_s: its length in seconds.
        server_cpu_s: the server process tree's CPU seconds in it.
        codes: the code of each answer that came inside it (:data:`OK`, an HTTP status, an exception's name).
        latency_us: send → answer in µs of each OK answer among them.
    """

    window_s: float
    server_cpu_s: float
    codes: tuple[str, ...]
    latency_us: np.ndarray


async def closed_loop(
    url: str, model: str, server: str, bodies: Sequence[bytes], per_request: int, callers: int, warmup_s: float,
    duration_s: float, server_cpu_s: Callable[[], float],
) -> EmbeddingPoint:
    """One point: ``callers`` callers posting ``bodies`` (in turn) to ``url`` (a full
    ``http://host:port/path``); see the module docstring for the window and the figures."""
    window = await closed_loop_window(url, bodies, callers, warmup_s, duration_s, server_cpu_s)
    return summarise(server, model, per_request, callers, [window])


async def closed_loop_window(
    url: str, bodies: Sequence[bytes], callers: int, warmup_s: float, duration_s: float,
    server_cpu_s: Callable[[], float], answer: Callable[[int, bytes], None] | None = None,
) -> LoopWindow:
    """The window of one closed loop (see the module docstring): ``callers`` callers posting
    ``bodies`` in turn to ``url``. ``answer``, when given, is the client's work on each OK answer
    (the index of its body in ``bodies``, the answer's body), done before the answer counts as
    come, so inside its latency."""
    sent: list[float] = []
    done: list[float] = []
    codes: list[str] = []
    stop = asyncio.Event()
    answered: set[int] = set()
    all_answered = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=callers)
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def caller(first: int) -> None:
            i = first
            while not stop.is_set():
                index = i % len(bodies)
                i += callers
                start = time.perf_counter()
                code, answer_body = await _post(session, url, bodies[index])
                if answer is not None and code == OK:
                    answer(index, answer_body)
                sent.append(start)
                done.append(time.perf_counter())
                codes.append(code)
                answered.add(first)
                if len(answered) == callers:
                    all_answered.set()

        task = asyncio.gather(*(caller(k) for k in range(callers)))
        try:
            await asyncio.gather(asyncio.sleep(warmup_s), all_answered.wait())
            cpu_before, window_start = server_cpu_s(), time.perf_counter()
            await asyncio.sleep(duration_s)
            # A window lasts until an answer has come inside it too: on a loaded machine a call
            # (a long document: hundreds of ms quiet) can outlast a short window, and a rate over
            # no answer says nothing.
            while not done or done[-1] < window_start:
                await asyncio.sleep(0.01)
            cpu_after, window_end = server_cpu_s(), time.perf_counter()
            stop.set()
            await task
        finally:
            task.cancel()
    sent_at, done_at = np.asarray(sent), np.asarray(done)
    keep = (done_at >= window_start) & (done_at < window_end)
    kept_codes = np.asarray(codes, dtype=object)[keep]
    return LoopWindow(window_s=window_end - window_start, server_cpu_s=cpu_after - cpu_before,
                      codes=tuple(kept_codes), latency_us=(done_at[keep] - sent_at[keep])[kept_codes == OK] * 1e6)


def summarise(server: str, model: str, per_request: int, callers: int, windows: Sequence[LoopWindow]) -> EmbeddingPoint:
    """One point's figures from the windows of one or more closed loops of the same requests and
    callers, taken together (lengths, CPU, answers and latencies summed or pooled)."""
    window_s = sum(w.window_s for w in windows)
    codes = [c for w in windows for c in w.codes]
    pct = percentiles_ms(np.concatenate([w.latency_us for w in windows]), (50, 99))
    texts = sum(c == OK for c in codes) * per_request
    return EmbeddingPoint(
        server=server, model=model, texts_per_request=per_request, callers=callers, window_s=window_s,
        requests=len(codes), texts_per_s=texts / window_s, p50_ms=pct[50],
        p99_ms=pct[99], errors=dict(Counter(c for c in codes if c != OK)),
        server_cpu_us_per_text=sum(w.server_cpu_s for w in windows) / texts * 1e6 if texts else None,
    )


def format_header() -> str:
    return f"{'server':9} {'texts/req':>9} {'callers':>7} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} " \
           f"{'cpu us/text':>11}  errors"


def format_row(p: EmbeddingPoint) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(p.errors.items())) or "0"
    return (f"{p.server:9} {p.texts_per_request:>9} {p.callers:>7} {p.texts_per_s:>9.1f} {fmt(p.p50_ms, '.2f'):>8} "
            f"{fmt(p.p99_ms, '.2f'):>8} {fmt(p.server_cpu_us_per_text, '.0f'):>11}  {errors}")


async def sweep(
    url: str, server: str, model: str, texts: Sequence[str], concurrency: Iterable[int], warmup_s: float,
    duration_s: float, server_cpu_s: Callable[[], float],
) -> list[EmbeddingPoint]:
    """Every (request size of :data:`TEXTS_PER_REQUEST`, callers of ``concurrency``) point
    against ``url``, one after another, each printed as it ends."""
    points = []
    for per_request in TEXTS_PER_REQUEST:
        bodies = request_bodies(model, texts, per_request)
        for callers in concurrency:
            point = await closed_loop(url, model, server, bodies, per_request, callers, warmup_s, duration_s,
                                      server_cpu_s)
            points.append(point)
            print(f"{model:8} {EMBEDDINGS_MODE:13} {format_row(point)}", flush=True)
    return points


def format_embeddings_table(points: Sequence[EmbeddingPoint]) -> str:
    """The embeddings points as a table (empty string without any), trtserve's rows first."""
    if not points:
        return ""
    return "\n".join([f"embeddings ({points[0].model}, OpenAI-style HTTP, closed loop):", format_header(),
                      *(format_row(p) for p in points), ""])


def embeddings_targets(points: Sequence[EmbeddingPoint]) -> list[Target]:
    """For each peer in ``points``: trtserve's texts/s ≥ :data:`THROUGHPUT_RATIO` × the peer's
    at every (request size, callers) both measured, and trtserve's p50 at one caller ≤ the
    peer's, per request size. A point with errors on either side is a MISS."""
    ours = {(p.texts_per_request, p.callers): p for p in points if p.server == SERVER}
    targets = []
    for peer in dict.fromkeys(p.server for p in points if p.server != SERVER):
        theirs = {(p.texts_per_request, p.callers): p for p in points if p.server == peer}
        for key in (k for k in ours if k in theirs):
            a, b = ours[key], theirs[key]
            clean = not a.errors and not b.errors
            name = f"{a.model} embeddings {key[0]} text(s)/request, {key[1]} caller(s)"
            quotient = a.texts_per_s / b.texts_per_s if b.texts_per_s > 0 else None
            passed = clean and quotient is not None and quotient >= THROUGHPUT_RATIO
            targets.append(Target(f"{name}: texts/s >= {THROUGHPUT_RATIO} x {peer}", "PASS" if passed else "MISS",
                                  f"{a.texts_per_s:.1f} vs {b.texts_per_s:.1f} texts/s = {fmt(quotient, '.2f')}x"
                                  + ("" if clean else f"; errors {a.errors or 0} vs {b.errors or 0}")))
            if key[1] == 1:
                passed = clean and a.p50_ms is not None and b.p50_ms is not None and a.p50_ms <= b.p50_ms
                targets.append(Target(f"{name}: p50 <= {peer}'s", "PASS" if passed else "MISS",
                                      f"{fmt(a.p50_ms, '.2f')} vs {fmt(b.p50_ms, '.2f')} ms"))
    return targets


def trtserve_points(args: argparse.Namespace, server: ServerProcess, texts: Sequence[str]) -> list[EmbeddingPoint]:
    """The embeddings sweep against the server under test (started with ``--allow-http true``),
    on :data:`EMBEDDINGS_MODEL` at :data:`TRTSERVE_PATH`.

    Raises:
        SystemExit: the server printed no HTTP address.
    """
    if not server.http_url:
        raise SystemExit(f"mode '{EMBEDDINGS_MODE}': trtserve printed no 'trtserve HTTP on' line; is "
                         "'--allow-http true' overridden in --serve-args?")
    return asyncio.run(sweep(f"http://{server.http_url}{TRTSERVE_PATH}", SERVER, EMBEDDINGS_MODEL, texts,
                             args.concurrency, args.warmup, args.duration, lambda: tree_cpu_seconds(server.pid)))
