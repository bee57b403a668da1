"""Long documents in the ``embeddings`` mode of ``trtserve bench``: a text longer than minilm's
window embedded whole by the server (``"long_text": "chunk"``) against the same windows
cut, sent and pooled by the client, through ``POST /v1/embeddings`` on trtserve.

The documents (:func:`long_documents`): :data:`LONG_DOCUMENTS` texts of at least
:data:`LONG_TEXT_WORDS` words each (whitespace-separated), made of the corpus sentences the bench
loaded, joined with spaces in their order (the sentences repeat when there are too few). Two
routes, one document per request, both asking ``"encoding_format": "base64"`` (what the ``openai``
client asks for):

* ``chunk``: ``{"input": [document], "long_text": "chunk"}``; the server tokenizes the document,
  cuts its windows, batches them and pools them into one embedding. The client decodes it.
* ``windows``: what a client does without chunking (:class:`WindowCutter`): it tokenizes the
  document with the model's own tokenizer (the served version's ``tokenizer.json``), cuts the same
  windows as the handler (the handler module's ``windows``, at the handler's window and stride),
  and sends each window as the text it covers, every window a string of one request
  (``{"input": [window, ...]}``, the default truncation: each window's text is exactly its
  window's tokens, checked when the windows are cut). The client decodes the window embeddings and
  pools them as the handler does: the mean weighted by each window's tokens ([CLS] and [SEP]
  included), L2-normalised.

So both routes run the same engine rows; what differs is who tokenizes, cuts and pools, and how
many vectors come back. Each point is one route at one number of callers
(:data:`LONG_TEXT_CALLERS` by default), closed loop (:func:`~.embeddings.closed_loop_window`):
texts/s counts documents, p50/p99 is send → answer decoded (and, ``windows``, pooled), the
server's CPU per document is its process tree's (:mod:`.proctree`). The client's own work per
answer is timed beside it (µs per document). The two routes of a number of callers are measured
in :data:`ORDER` (chunk, windows, windows, chunk), each leg a closed loop of its own (warm-up
included) with half of ``--duration`` as its window, and each route's two windows are taken
together: a load that drifts evenly over the four legs weighs on both routes alike, which
matters on a machine shared with other work. The last pooled vector of each document on each
route is kept: their largest difference (absolute, per component) says the two routes computed
the same embeddings.

Beside the points, a figure no other load on the machine can move (:func:`handler_cpu_ms`): the
handler's own CPU per document, in the bench process, for each route (``chunk``: ``chunk`` and
its ``gather``; ``windows``: ``preprocess`` and ``postprocess`` of the windows' texts), against
which the engine's CPU per document (the server's CPU per text) says what the pooling can cost.

Targets (:func:`long_text_targets`): the pooling costs less than :data:`POOLING_COST` at every
number of callers: ``chunk``'s texts/s ≥ (1 − :data:`POOLING_COST`) × ``windows``', and its p50 ≤
(1 + :data:`POOLING_COST`) × ``windows``'.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from tokenizers import Tokenizer

from trtserve.handlers import load_handler
from trtserve.harness.benchlib.embeddings import (
    EMBEDDINGS_MODE,
    EMBEDDINGS_MODEL,
    TRTSERVE_PATH,
    EmbeddingPoint,
    LoopWindow,
    closed_loop_window,
    summarise,
)
from trtserve.harness.benchlib.proctree import tree_cpu_seconds
from trtserve.harness.benchlib.report import SERVER, Target, fmt
from trtserve.repository import load_spec
from trtserve.spec import ModelSpec
from trtserve.testing import ServerProcess

LONG_TEXT_WORDS = 2000
"""Words (whitespace-separated) each document has at least."""
LONG_DOCUMENTS = 8
"""Distinct documents; the callers send them in turn."""
LONG_TEXT_CALLERS = (1, 16)
"""Default callers of the long-text points (``--long-text-callers``)."""
POOLING_COST = 0.05
"""Target: what chunking in the server may cost against the client's own windows, as a fraction
of texts/s (and of p50)."""
CHUNK = "chunk"
"""Route: the document sent whole with ``"long_text": "chunk"``."""
WINDOWS = "windows"
"""Route: the document's windows sent as separate texts of one request, pooled by the client."""
ENCODING = "base64"
"""``encoding_format`` of every long-text request."""
ORDER = (CHUNK, WINDOWS, WINDOWS, CHUNK)
"""The legs of each number of callers, each route's two taken together."""


@dataclass(frozen=True)
class WindowedDocument:
    """One long document and its windows as the client cuts them.

    Attributes:
        text: the document.
        parts: each window as the text it covers (a slice of ``text``), in order.
        tokens: the tokens the model reads of each window ([CLS] and [SEP] included): the weights.
    """

    text: str
    parts: tuple[str, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class LongTextPoint:
    """One closed-loop point of a route.

    Attributes:
        route: :data:`CHUNK` or :data:`WINDOWS`.
        point: the closed loop's figures; ``texts_per_request`` is 1 (a document per request),
            ``texts_per_s`` documents per second, ``server_cpu_us_per_text`` µs per document.
        client_us_per_text: the bench client's decoding (and, ``windows``, pooling) per answer, µs
            (mean over every OK answer of the point, warm-up included; None without one).
    """

    route: str
    point: EmbeddingPoint
    client_us_per_text: float | None


@dataclass(frozen=True)
class LongTextRun:
    """The long-text points of one server.

    Attributes:
        documents: distinct documents sent.
        words_per_text: mean words per document.
        windows_per_text: mean windows (engine rows) per document.
        points: every point, ``chunk`` then ``windows`` at each number of callers.
        max_abs_difference: the largest |chunk − windows| component of any document's embedding
            answered by both routes (None when none was).
        handler_cpu_ms: route → the handler's CPU ms per document (:func:`handler_cpu_ms`).
    """

    documents: int
    words_per_text: float
    windows_per_text: float
    points: list[LongTextPoint]
    max_abs_difference: float | None
    handler_cpu_ms: dict[str, float]


def long_documents(texts: Sequence[str], words: int = LONG_TEXT_WORDS, count: int = LONG_DOCUMENTS) -> list[str]:
    """``count`` documents of at least ``words`` words: ``texts`` joined with spaces in order,
    each document going on where the one before ended (``texts`` repeat when they run out).

    Raises:
        ValueError: no texts, or no words in them.
    """
    if not any(t.split() for t in texts):
        raise ValueError("the long-text points need sentences: no corpus under --data")
    docs, i = [], 0
    for _ in range(count):
        parts, n = [], 0
        while n < words:
            parts.append(texts[i % len(texts)])
            n += len(parts[-1].split())
            i += 1
        docs.append(" ".join(parts))
    return docs


class WindowCutter:
    """The client's side of the ``windows`` route: a model's windows cut outside the server.

    The tokenizer is the served version's own file, read without truncation, padding or special
    tokens; the window rule, window and stride are its handler's (module function ``windows``,
    attributes ``max_seq_length`` and ``stride``: engines/minilm/handler.py).

    Args:
        spec: the served model (minilm).

    Raises:
        ValueError: the model's handler cuts no windows (it has no ``windows`` rule or ``stride``).
    """

    def __init__(self, spec: ModelSpec) -> None:
        handler = load_handler(spec)
        module = sys.modules[type(handler).__module__] if handler is not None else None
        if module is None or not hasattr(module, "windows") or not hasattr(handler, "stride"):
            raise ValueError(f"model '{spec.name}' has no handler that cuts long texts into windows")
        self.handler = handler
        """The model's handler (the same code the server runs)."""
        self._windows = module.windows
        self._pieces = Tokenizer.from_file(str(Path(spec.version_dir) / module.TOKENIZER_FILE))
        self._pieces.no_truncation()
        self._pieces.no_padding()
        self._specials = self._pieces.num_special_tokens_to_add(is_pair=False)
        self._size = handler.max_seq_length - self._specials
        self._stride = handler.stride

    def cut(self, text: str) -> WindowedDocument:
        """``text``'s windows, each as the text it covers.

        Raises:
            ValueError: a window's text tokenizes to other pieces than the window's (a word
                longer than the stride, cut inside): the routes would not run the same rows.
        """
        enc = self._pieces.encode(text, add_special_tokens=False)
        parts, tokens = [], []
        for start, end in self._windows(enc.word_ids, self._size, self._stride):
            part = text[enc.offsets[start][0]:enc.offsets[end - 1][1]]
            if self._pieces.encode(part, add_special_tokens=False).ids != enc.ids[start:end]:
                raise ValueError(f"the window of word pieces {start}-{end} does not tokenize back to itself")
            parts.append(part)
            tokens.append(end - start + self._specials)
        return WindowedDocument(text, tuple(parts), tuple(tokens))


def handler_cpu_ms(handler, docs: Sequence[WindowedDocument], rounds: int = 3) -> dict[str, float]:
    """The CPU ms per document (``time.process_time``: every thread of the bench process) of the
    server's handler stages for each route, over ``rounds`` passes through ``docs``: ``chunk``
    and its ``gather`` for :data:`CHUNK`, ``preprocess`` of the windows' texts and ``postprocess``
    for :data:`WINDOWS`. The engine's outputs are stood in for by unit vectors of the right shape
    (the stages' cost does not depend on their values); names and width are the handler module's
    ``INPUT_NAME``, ``OUTPUT_NAME`` and ``EMBEDDING_DIM``."""
    module = sys.modules[type(handler).__module__]
    dim = module.EMBEDDING_DIM

    def texts(items: Sequence[str]) -> dict[str, np.ndarray]:
        return {module.INPUT_NAME: np.array([[t.encode()] for t in items], dtype=object)}

    def outputs(rows: int) -> list[dict[str, np.ndarray]]:
        return [{module.OUTPUT_NAME: np.full((1, dim), dim ** -0.5, dtype=np.float32)} for _ in range(rows)]

    def chunk(doc: WindowedDocument) -> None:
        fanout = handler.chunk(texts([doc.text]))
        fanout.gather(outputs(len(fanout.segments)))

    def windows(doc: WindowedDocument) -> None:
        inputs = texts(doc.parts)
        handler.postprocess(inputs, outputs(len(handler.preprocess(inputs))))

    cost = {}
    for route, stage in ((CHUNK, chunk), (WINDOWS, windows)):
        stage(docs[0])  # first call: lazy set-up out of the figure
        start = time.process_time()
        for _ in range(rounds):
            for doc in docs:
                stage(doc)
        cost[route] = (time.process_time() - start) / (rounds * len(docs)) * 1e3
    return cost


def embeddings_of(body: bytes) -> np.ndarray:
    """The embeddings of a ``/v1/embeddings`` answer in ``base64``: float32 [texts, dim], in order."""
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                     for d in orjson.loads(body)["data"]])


class _Client:
    """The client's work on each OK answer of a route (decode; ``windows``: pool), timed; keeps
    the last embedding of each document."""

    def __init__(self, route: str, docs: Sequence[WindowedDocument]) -> None:
        self.route = route
        self.weights = [np.asarray(d.tokens, dtype=np.float64) for d in docs]
        self.vectors: dict[int, np.ndarray] = {}
        self.seconds = 0.0
        self.answers = 0

    def answer(self, index: int, body: bytes) -> None:
        start = time.perf_counter()
        emb = embeddings_of(body)
        if self.route == WINDOWS:
            if len(emb) != len(self.weights[index]):
                raise RuntimeError(f"{len(emb)} embeddings came for {len(self.weights[index])} windows")
            pooled = self.weights[index] @ emb.astype(np.float64)
            emb = (pooled / np.linalg.norm(pooled))[None, :]
        elif len(emb) != 1:
            raise RuntimeError(f"{len(emb)} embeddings came for one document")
        self.vectors[index] = emb[0]
        self.seconds += time.perf_counter() - start
        self.answers += 1

    def us_per_text(self) -> float | None:
        return self.seconds / self.answers * 1e6 if self.answers else None


def request_body(model: str, route: str, doc: WindowedDocument) -> bytes:
    """The JSON body of one document on ``route``."""
    if route == CHUNK:
        return orjson.dumps({"model": model, "input": [doc.text], "long_text": CHUNK, "encoding_format": ENCODING})
    return orjson.dumps({"model": model, "input": list(doc.parts), "encoding_format": ENCODING})


async def long_text_sweep(
    url: str, server: str, model: str, docs: Sequence[WindowedDocument], callers: Iterable[int], warmup_s: float,
    duration_s: float, server_cpu_s: Callable[[], float], handler_ms: dict[str, float],
) -> LongTextRun:
    """Both routes at each number of ``callers`` against ``url`` (``http://host:port/path``), in
    legs of :data:`ORDER` of ``duration_s / 2`` each; each point printed as it ends."""
    bodies = {route: [request_body(model, route, d) for d in docs] for route in (CHUNK, WINDOWS)}
    points, differences = [], []
    for n in callers:
        clients = {route: _Client(route, docs) for route in (CHUNK, WINDOWS)}
        legs: dict[str, list[LoopWindow]] = {route: [] for route in clients}
        for route in ORDER:
            legs[route].append(await closed_loop_window(url, bodies[route], n, warmup_s, duration_s / 2,
                                                        server_cpu_s, clients[route].answer))
        for route, client in clients.items():
            points.append(LongTextPoint(route, summarise(server, model, 1, n, legs[route]), client.us_per_text()))
            print(f"{model:8} {EMBEDDINGS_MODE:13} long {format_row(points[-1])}", flush=True)
        mine, theirs = clients[CHUNK].vectors, clients[WINDOWS].vectors
        differences += [float(np.abs(mine[i] - theirs[i]).max()) for i in mine.keys() & theirs.keys()]
    return LongTextRun(
        documents=len(docs), words_per_text=float(np.mean([len(d.text.split()) for d in docs])),
        windows_per_text=float(np.mean([len(d.parts) for d in docs])), points=points,
        max_abs_difference=max(differences) if differences else None, handler_cpu_ms=handler_ms,
    )


def format_header() -> str:
    return f"{'route':8} {'callers':>7} {'texts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'server us/text':>14} " \
           f"{'client us/text':>14}  errors"


def format_row(p: LongTextPoint) -> str:
    q = p.point
    errors = ", ".join(f"{k} {v}" for k, v in sorted(q.errors.items())) or "0"
    return (f"{p.route:8} {q.callers:>7} {q.texts_per_s:>8.2f} {fmt(q.p50_ms, '.1f'):>8} {fmt(q.p99_ms, '.1f'):>8} "
            f"{fmt(q.server_cpu_us_per_text, '.0f'):>14} {fmt(p.client_us_per_text, '.0f'):>14}  {errors}")


def _pairs(run: LongTextRun) -> list[tuple[EmbeddingPoint, EmbeddingPoint]]:
    """(chunk, windows) points at each number of callers both routes measured."""
    by = {(p.route, p.point.callers): p.point for p in run.points}
    return [(by[CHUNK, n], by[WINDOWS, n]) for route, n in by if route == CHUNK and (WINDOWS, n) in by]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def format_long_text_table(run: LongTextRun | None) -> str:
    """The long-text points and the chunk/windows ratios per number of callers (empty string
    without a run)."""
    if run is None:
        return ""
    ratios = [f"chunk / windows at {a.callers} caller(s): texts/s {fmt(_ratio(a.texts_per_s, b.texts_per_s), '.3f')}"
              f", p50 {fmt(_ratio(a.p50_ms, b.p50_ms), '.3f')}, server CPU per text "
              f"{fmt(_ratio(a.server_cpu_us_per_text, b.server_cpu_us_per_text), '.3f')}" for a, b in _pairs(run)]
    return "\n".join([
        f"embeddings, long texts ({EMBEDDINGS_MODEL}, {run.documents} documents of {run.words_per_text:.0f} words, "
        f"{run.windows_per_text:.1f} windows each; one per request, {ENCODING}):", format_header(),
        *(format_row(p) for p in run.points), *ratios,
        f"largest |chunk - windows| embedding component: {fmt(run.max_abs_difference, '.1e')}",
        "handler CPU per text (bench process): "
        + ", ".join(f"{route} {ms:.2f} ms" for route, ms in run.handler_cpu_ms.items()), ""])


def long_text_targets(run: LongTextRun | None) -> list[Target]:
    """At each number of callers: chunk's texts/s ≥ (1 − :data:`POOLING_COST`) × windows', and
    chunk's p50 ≤ (1 + :data:`POOLING_COST`) × windows'. A pair with errors on either side is a MISS."""
    targets = []
    for a, b in _pairs(run) if run is not None else []:
        clean = not a.errors and not b.errors
        name = f"{a.model} embeddings long texts, {a.callers} caller(s)"
        errors = "" if clean else f"; errors {a.errors or 0} vs {b.errors or 0}"
        quotient = _ratio(a.texts_per_s, b.texts_per_s)
        passed = clean and quotient is not None and quotient >= 1 - POOLING_COST
        targets.append(Target(f"{name}: chunk texts/s >= {1 - POOLING_COST:.2f} x windows sent apart",
                              "PASS" if passed else "MISS",
                              f"{a.texts_per_s:.2f} vs {b.texts_per_s:.2f} texts/s = {fmt(quotient, '.3f')}x{errors}"))
        quotient = _ratio(a.p50_ms, b.p50_ms)
        passed = clean and quotient is not None and quotient <= 1 + POOLING_COST
        targets.append(Target(f"{name}: chunk p50 <= {1 + POOLING_COST:.2f} x windows sent apart",
                              "PASS" if passed else "MISS",
                              f"{fmt(a.p50_ms, '.1f')} vs {fmt(b.p50_ms, '.1f')} ms = {fmt(quotient, '.3f')}x"))
    return targets


def trtserve_long_text_run(args: argparse.Namespace, server: ServerProcess, texts: Sequence[str]) -> LongTextRun:
    """The long-text points against the server under test (its HTTP door open, as for
    :func:`~.embeddings.trtserve_points`) at ``args.long_text_callers``, ``args.warmup`` and
    ``args.duration``; the windows are cut with ``args.model_repository``'s minilm.

    Raises:
        SystemExit: the server printed no HTTP address.
        ValueError: no sentences (see :func:`long_documents`).
    """
    if not server.http_url:
        raise SystemExit(f"mode '{EMBEDDINGS_MODE}': trtserve printed no 'trtserve HTTP on' line")
    cutter = WindowCutter(load_spec(args.model_repository / EMBEDDINGS_MODEL))
    docs = [cutter.cut(d) for d in long_documents(texts)]
    handler_ms = handler_cpu_ms(cutter.handler, docs)
    return asyncio.run(long_text_sweep(f"http://{server.http_url}{TRTSERVE_PATH}", SERVER, EMBEDDINGS_MODEL, docs,
                                       args.long_text_callers, args.warmup, args.duration,
                                       lambda: tree_cpu_seconds(server.pid), handler_ms))
