"""The benchmark's inputs, built before any clock starts: one-row requests per model
(random FP32 rows for numeric inputs, real sentences for text), serialized once, and the
same rows packed into engine batches for the raw reference."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtserve.client import build_request
from trtserve.datatypes import Tensors
from trtserve.handlers import load_handler
from trtserve.harness.benchlib.httpclient import RestRequest, rest_request
from trtserve.repository import load_spec
from trtserve.runtimes.base import Batch, StagingBuffers, pack
from trtserve.spec import ModelSpec, TensorSpec

CORPUS = Path("corpus/multi30k_en_captions.jsonl.gz")
VARIABLE_DIM = 16
"""Size given to a -1 dim of a numeric request input."""


def load_texts(data_dir: Path, count: int, rng: np.random.Generator) -> list[str]:
    """``count`` sentences drawn at random (no repeats) from the Multi30K caption corpus
    (JSONL with ``id`` and ``text``) under ``data_dir``.

    Raises:
        FileNotFoundError: no corpus under ``data_dir``.
    """
    with gzip.open(data_dir / CORPUS, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    picks = rng.choice(len(texts), size=min(count, len(texts)), replace=False)
    return [texts[i] for i in picks]


def poisson_arrivals(rate_per_s: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in seconds from 0, ascending, of a Poisson process at ``rate_per_s``
    over ``[0, seconds)``."""
    expected = rate_per_s * seconds
    # Ten standard deviations above the expected count: the draw never falls short in practice.
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, size=int(expected + 10 * np.sqrt(expected) + 100)))
    return times[times < seconds]


def _request_input(spec: TensorSpec, index: int, texts: Sequence[str], rng: np.random.Generator) -> np.ndarray:
    shape = (1, *(VARIABLE_DIM if d == -1 else d for d in spec.dims))
    if spec.datatype.name == "BYTES":
        if not texts:
            raise ValueError(f"input '{spec.name}' is text: the benchmark needs sentences from {CORPUS} under --data")
        arr = np.empty(shape, dtype=object)
        arr.fill(texts[index % len(texts)].encode("utf-8"))
        return arr
    if spec.datatype.numpy.kind == "f":
        return rng.standard_normal(shape).astype(spec.datatype.numpy)
    return rng.integers(0, 100, size=shape).astype(spec.datatype.numpy)


@dataclass(frozen=True)
class Workload:
    """One-row requests for one model, and the engine rows the server would make of them.

    Attributes:
        spec: the model's configuration.
        requests: request inputs (name → array with one row), in order.
        segments: the engine rows of the requests, in the same order (after the model's
            handler, if it has one), one row each.
    """

    spec: ModelSpec
    requests: tuple[Tensors, ...]
    segments: tuple[Tensors, ...]

    def served_with(self, max_batch_size: int) -> Workload:
        """This workload with the ``max_batch_size`` the server serves the model with (the one
        it chose at load, for a config that leaves it to the server)."""
        policy = dataclasses.replace(self.spec.policy, max_batch_size=max_batch_size)
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, policy=policy))

    @property
    def rows_per_request(self) -> int:
        """Rows (batch dim) of each request."""
        return len(next(iter(self.requests[0].values())))

    def grouped(self, rows: int) -> Workload:
        """This workload's rows as requests of ``rows`` consecutive rows each (the last rows that
        fill no request are left out); the engine rows (:attr:`segments`) are unchanged.

        Raises:
            ValueError: ``rows`` below 1, or more than the workload's rows.
        """
        singles = [one for request in self.requests for one in _split(request)]
        if not 1 <= rows <= len(singles):
            raise ValueError(f"{len(singles)} rows cannot make requests of {rows} rows")
        requests = tuple({name: np.concatenate([s[name] for s in singles[i : i + rows]]) for name in singles[0]}
                         for i in range(0, len(singles) - rows + 1, rows))
        return dataclasses.replace(self, requests=requests)

    @property
    def onnx_path(self) -> Path:
        return self.spec.version_dir / "model.onnx"

    def messages(self, count: int | None = None, *, with_ids: bool = False,
                 timeout_us: int | None = None) -> list[bytes]:
        """Serialized ``ModelInferRequest`` messages over the requests, cycled to ``count``
        (default: one per request); with ``with_ids`` message i has id ``str(i)``; with
        ``timeout_us`` each carries that ``timeout`` parameter (microseconds)."""
        n = len(self.requests) if count is None else count
        return [
            build_request(
                self.spec.name, self.requests[i % len(self.requests)],
                request_id=str(i) if with_ids else "", timeout_us=timeout_us,
            ).SerializeToString()
            for i in range(n)
        ]

    def rest_requests(self, count: int | None = None, *, binary: bool = True,
                      timeout_us: int | None = None) -> list[RestRequest]:
        """The same requests as KServe v2 REST infer bodies (:func:`.httpclient.rest_request`:
        binary tensor extension, as ``tritonclient.http`` sends by default; with ``binary``
        False, JSON alone), cycled to ``count`` (default: one per request); with ``timeout_us``
        each carries that ``timeout`` parameter (microseconds)."""
        n = len(self.requests) if count is None else count
        bodies = [rest_request(self.spec.name, inputs, binary=binary, timeout_us=timeout_us)
                  for inputs in self.requests[:n]]
        return [bodies[i % len(bodies)] for i in range(n)]

    def engine_batches(self, batch: int, engine_inputs: Sequence[TensorSpec], limit: int) -> list[Tensors]:
        """Up to ``limit`` engine feeds of ``batch`` consecutive rows each, packed and padded
        exactly as the server packs a batch (the runtime's own ``pack``)."""
        feeds = []
        for start in range(0, len(self.segments) - batch + 1, batch):
            parts = self.segments[start : start + batch]
            packed = pack(Batch(tuple(parts), batch), engine_inputs, StagingBuffers(), self.spec.policy.pad_value)
            feeds.append({name: np.array(arr) for name, arr in packed.items()})
            if len(feeds) == limit:
                break
        return feeds


def _split(request: Tensors) -> list[Tensors]:
    """A request's rows as one-row requests."""
    rows = len(next(iter(request.values())))
    return [{name: arr[i : i + 1] for name, arr in request.items()} for i in range(rows)]


def build_workload(model_dir: Path, count: int, texts: Sequence[str], rng: np.random.Generator) -> Workload:
    """``count`` one-row requests for the model in ``model_dir`` (text inputs take
    ``texts`` in order, numeric inputs random values), run through its handler's
    ``preprocess`` where it has one.

    Raises:
        ValueError: a model without a batch dimension, a text input without texts, or a
            handler that does not give one engine row per request row.
    """
    spec = load_spec(model_dir)
    if not spec.batched:
        raise ValueError(f"model '{spec.name}' has no batch dimension (max_batch_size 0); "
                         "the benchmark drives batched models")
    handler: Any = load_handler(spec)
    requests = tuple({t.name: _request_input(t, i, texts, rng) for t in spec.inputs if not t.optional}
                     for i in range(count))
    segments: list[Tensors] = []
    for inputs in requests:
        # Without a handler the ONNX runtime's prepare() hands text to the engine as str.
        pre = handler.preprocess(inputs) if handler is not None else {
            name: np.vectorize(bytes.decode, otypes=[object])(arr) if arr.dtype == object else arr
            for name, arr in inputs.items()
        }
        for segment in [pre] if isinstance(pre, dict) else pre:
            if next(iter(segment.values())).shape[0] != 1:
                raise ValueError(f"model '{spec.name}': the benchmark needs one engine row per request row")
            segments.append(segment)
    if len(segments) != count:
        raise ValueError(f"model '{spec.name}': the handler made {len(segments)} engine rows of {count} request rows")
    return Workload(spec, requests, tuple(segments))
