"""``trtserve check MODEL``: is the model (with its handler) batch-safe?

Runs sample requests through the model in-process, first one at a time (each a batch of its
own), then all at once so the dispatcher batches them together, padding rows of different
lengths to the longest. Reports the largest absolute difference per output and exits 1 when
any exceeds ``--atol``, naming those outputs. A principle of the design: batching never changes
an answer, so an output that reports the batch (its size, a row count) fails by design; every
shipped example passes.

Samples are synthesised from the model's input spec (random values; variable dims of random
length 1..24; BYTES as random words), unless the handler defines ``samples(n, rng)``
returning a list of request input dicts.
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtserve.spec import ModelSpec
from trtserve.tools import ToolError, fail, model_dir, model_failure

WORDS = "a man woman dog cat runs jumps over the lazy quick brown fox on red blue street park plays guitar".split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model name in the repository")
    parser.add_argument("--samples", type=int, default=32, help="sample requests (default: 32)")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest allowed absolute difference (default: 1e-5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for synthesised samples")


@dataclass(frozen=True)
class CheckReport:
    """Result of a batch-safety check.

    Attributes:
        max_diff: output name → largest |alone − batched| over all samples (``inf`` when a
            shape differs).
        mean_batch_size: mean rows per engine run while the samples ran together.
        atol: the tolerance.
    """

    max_diff: dict[str, float]
    mean_batch_size: float
    atol: float

    @property
    def ok(self) -> bool:
        return all(d <= self.atol for d in self.max_diff.values())


def synthesize(spec: ModelSpec, count: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """``count`` one-row requests for ``spec`` with random contents and variable lengths."""
    requests = []
    for _ in range(count):
        request = {}
        for t in spec.inputs:
            shape = [int(rng.integers(1, 25)) if d == -1 else d for d in t.dims]
            if spec.batched:
                shape = [1, *shape]
            n = int(np.prod(shape))
            dtype = t.datatype.numpy
            if t.datatype.name == "BYTES":
                values = [" ".join(rng.choice(WORDS, int(rng.integers(1, 40)))).encode() for _ in range(n)]
                arr = np.array(values, dtype=object)
            elif dtype.kind == "b":
                arr = rng.integers(0, 2, n).astype(bool)
            elif dtype.kind in "iu":
                arr = rng.integers(0, 100, n).astype(dtype)
            else:
                arr = rng.standard_normal(n).astype(dtype)
            request[t.name] = arr.reshape(shape)
        requests.append(request)
    return requests


async def check_model(root: Path, name: str, *, samples: int = 32, atol: float = 1e-5, seed: int = 0) -> CheckReport:
    """Load ``root/name`` and compare each sample's outputs alone vs batched.

    Raises:
        ToolError: no such repository or model, the model does not load, or it fails on a
            sample request (the message says which, with the reason).
    """
    from trtserve import runtimes
    from trtserve.clock import MonotonicClock
    from trtserve.engine.local import LocalEngine
    from trtserve.engine.model import EngineModel
    from trtserve.frontend.pipeline import FrontendModel
    from trtserve.repository import load_spec

    directory = model_dir(root, name)
    pool = ThreadPoolExecutor(2)
    backend = served = None
    try:
        try:
            spec = load_spec(directory)
            backend = await asyncio.to_thread(runtimes.create, spec)
            served = EngineModel(spec, backend, clock=MonotonicClock())
            await served.start()
            model = FrontendModel(spec, LocalEngine(lambda _name, _version: served), pool=pool)  # type: ignore[arg-type]
        except Exception as exc:  # whatever stops it loading is the user's one line
            raise model_failure(name, "cannot load", exc) from exc
        try:
            rng = np.random.default_rng(seed)
            sample_fn = getattr(model.handler, "samples", None)
            requests = sample_fn(samples, rng) if sample_fn else synthesize(spec, samples, rng)
            alone = [(await model.infer(r))[0] for r in requests]
            stats = served.dispatcher.stats
            runs, rows = stats.batches, stats.rows
            together = [out for out, _deadline, _version in await asyncio.gather(*(model.infer(r) for r in requests))]
            mean_batch = (stats.rows - rows) / max(stats.batches - runs, 1)
        except Exception as exc:  # the engine or the handler failing on a sample
            raise model_failure(name, "failed on a sample request", exc) from exc
    finally:
        if served is not None:
            await served.aclose()
        elif backend is not None:
            await backend.aclose()
        pool.shutdown()
    max_diff: dict[str, float] = {}
    for a, b in zip(alone, together):
        for out, x in a.items():
            y = b[out]
            if x.shape != y.shape:
                diff = float("inf")
            elif x.dtype == np.dtype(object):
                diff = 0.0 if x.tolist() == y.tolist() else float("inf")
            else:
                diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
            max_diff[out] = max(max_diff.get(out, 0.0), diff)
    return CheckReport(max_diff, mean_batch, atol)


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 batch-safe, 1 not, 2 the check could not run (one line on stderr)."""
    try:
        report = asyncio.run(check_model(args.model_repository, args.model, samples=args.samples, atol=args.atol,
                                         seed=args.seed))
    except ToolError as exc:
        return fail("check", exc)
    print(f"{args.model}: {args.samples} samples alone vs batched together "
          f"(mean batch size {report.mean_batch_size:.1f})")
    for out, diff in report.max_diff.items():
        verdict = "ok" if diff <= report.atol else "DIFFERS"
        print(f"  {out:20s} max |alone - batched| = {diff:.3g}  (atol {report.atol:g})  {verdict}")
    if report.ok:
        print("batch-safe")
        return 0
    differ = ", ".join(out for out, diff in report.max_diff.items() if diff > report.atol)
    print(f"NOT batch-safe: batching changes {differ}. A row's answer must not depend on the rows batched with it:"
          " look for padding leaking into the result, or an output that reports the batch itself (its size, a row"
          " count), which differs by design (ModelStatistics batch_stats already say which batch sizes ran)")
    return 1
