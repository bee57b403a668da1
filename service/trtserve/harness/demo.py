"""``trtserve demo``: the main job on real data, end to end, on the CPU default.

1. Starts ``trtserve serve`` on 127.0.0.1 (a child process).
2. Streams every sentence of STS-B dev (``<data>/stsb/dev.tsv``) through ModelStreamInfer, one
   sentence per message, and prints the Spearman correlation of the pairs' cosine
   similarities with the gold scores next to the reference (:data:`REFERENCE_SPEARMAN`, the
   model's PyTorch implementation).
3. Embeds the first ``--count`` texts of a JSONL corpus (``{"id": ..., "text": ...}`` per line,
   gzip allowed) through the same kind of stream with a progress bar, and prints sentences/s,
   p50/p99 latency per message, the server's batch-size histogram and the batch cap it ended
   with (and why, from its log); then the same texts through ONNX Runtime directly, no server,
   at the batch sizes the server ran and around the knee, and the served rate as a share of the
   best of those raw rates.
4. Stops the server (SIGTERM: it drains and exits 0).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

REFERENCE_SPEARMAN = 0.8672
"""STS-B dev Spearman correlation of the model's PyTorch implementation's cosine similarities."""
MODEL = "minilm"
RAW_SIZES = (4, 8, 16, 32, 64)
"""Batch sizes raw ONNX Runtime runs at besides the server's own: the CPU knee lies among them."""
RAW_SAMPLE = 1000
"""Texts of the corpus each raw batch size runs (its first)."""
_CAP = re.compile(rf"model {MODEL} version \S+: batch cap (\d+) rows \((.*)\)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("../shared/data"),
                        help="data directory (default: ../shared/data)")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="JSONL(.gz) corpus with id and text "
                             "(default: <data>/corpus/multi30k_en_captions.jsonl.gz)")
    parser.add_argument("--count", type=int, default=20000, help="corpus texts to embed (default: 20000)")
    parser.add_argument("--inflight", type=int, default=64, help="unanswered messages per stream (default: 64)")


def read_stsb(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(sentence1s, sentence2s, gold scores 0..5) of an STS-B TSV with a header line."""
    first, second, gold = [], [], []
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            score, s1, s2 = line.rstrip("\n").split("\t")
            first.append(s1)
            second.append(s2)
            gold.append(float(score))
    return first, second, np.array(gold)


def read_corpus(path: Path, count: int) -> list[tuple[str, str]]:
    """The first ``count`` (id, text) pairs of a JSONL or JSONL.gz file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [(row["id"], row["text"]) for row in map(json.loads, itertools.islice(f, count))]


def spearman_of_cosines(a: np.ndarray, b: np.ndarray, gold: np.ndarray) -> float:
    """Spearman rank correlation between the row-wise cosine similarities of ``a`` and ``b``
    ([pairs, dims] each) and ``gold`` ([pairs]) — the STS Benchmark metric."""
    from scipy.stats import spearmanr

    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(spearmanr(cos, gold).statistic)


def embed_stream(
    client, texts: Iterable[tuple[str, str]], inflight: int, latencies: list[float] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (id, embedding [384]) for each (id, text), one text per stream message.

    Raises:
        RuntimeError: a message came back with an error.
    """
    sent: dict[str, float] = {}

    def items():
        for key, text in texts:
            sent[key] = time.perf_counter()
            yield key, {"TEXT": np.array([[text.encode()]], dtype=object)}

    for key, result in client.stream_infer(MODEL, items(), max_inflight=inflight):
        if latencies is not None:
            latencies.append(time.perf_counter() - sent.pop(key))
        if not isinstance(result, dict):
            raise RuntimeError(f"message {key} failed: {result.code}: {result.message}")
        yield key, result["EMBEDDING"][0]


def batch_histogram(client) -> dict[int, int]:
    """Batch size → engine runs of the demo model, from the ModelStatistics RPC."""
    from trtserve._proto.inference import grpc_service_pb2 as pb

    stats = client.stub.ModelStatistics(pb.ModelStatisticsRequest(name=MODEL)).model_stats[0]
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


def raw_throughput(model_dir: Path, texts: list[str], batch_size: int) -> float:
    """Sentences/s of the handler + ONNX Runtime, no server, in batches of ``batch_size``."""
    import onnxruntime as ort

    from trtserve.handlers import load_handler
    from trtserve.repository import load_spec
    from trtserve.runtimes.base import Batch, StagingBuffers, pack
    from trtserve.runtimes.onnxruntime import engine_tensors

    spec = load_spec(model_dir)
    handler = load_handler(spec)
    path = spec.version_dir / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    engine_inputs, _ = engine_tensors(session, True, path)
    staging = StagingBuffers()
    start = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        chunk = np.array([[t.encode()] for t in texts[i : i + batch_size]], dtype=object)
        segments = handler.preprocess({"TEXT": chunk})
        feed = pack(Batch(tuple(segments), len(segments)), engine_inputs, staging, 0.0)
        session.run(None, feed)
    return len(texts) / (time.perf_counter() - start)


def final_cap(server_log: Iterable[str]) -> str:
    """The batch cap the server ended with and why: its last ``batch cap`` log line."""
    found = [m for m in map(_CAP.search, server_log) if m]
    return f"{found[-1].group(1)} rows ({found[-1].group(2)})" if found else "not logged"


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    quiet = not sys.stderr.isatty()  # no progress bars in a log file

    from trtserve.client import Client
    from trtserve.testing import ServerProcess

    data: Path = args.data
    corpus_path = args.corpus or data / "corpus" / "multi30k_en_captions.jsonl.gz"
    missing = [str(p) for p in (data / "stsb" / "dev.tsv", corpus_path) if not p.is_file()]
    if missing:
        print(f"trtserve demo: data not found: {', '.join(missing)}; pass --data (make demo DATA=...) "
              "with the shared data directory (stsb/dev.tsv, corpus/multi30k_en_captions.jsonl.gz)", file=sys.stderr)
        return 2
    first, second, gold = read_stsb(data / "stsb" / "dev.tsv")
    corpus = read_corpus(corpus_path, args.count)

    print(f"starting trtserve on the CPU default ({args.model_repository})")
    with ServerProcess(args.model_repository) as server, Client(server.url) as client:
        sentences = [(str(i), s) for i, s in enumerate(first + second)]
        emb = dict(tqdm(embed_stream(client, sentences, args.inflight), total=len(sentences), desc="STS-B dev",
                        unit="sent", disable=quiet))
        vectors = np.stack([emb[str(i)] for i in range(len(sentences))])
        rho = spearman_of_cosines(vectors[: len(first)], vectors[len(first) :], gold)
        print(f"\nSTS-B dev Spearman (cosine): {rho:.4f}   reference {REFERENCE_SPEARMAN:.4f}   "
              f"difference {rho - REFERENCE_SPEARMAN:+.4f}")

        before = batch_histogram(client)
        latencies: list[float] = []
        start = time.perf_counter()
        done = sum(1 for _ in tqdm(embed_stream(client, corpus, args.inflight, latencies), total=len(corpus),
                                   desc="corpus", unit="sent", disable=quiet))
        elapsed = time.perf_counter() - start
        after = batch_histogram(client)
        server_code = server.stop()

    runs = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    runs = {size: n for size, n in sorted(runs.items()) if n}
    rows = sum(size * n for size, n in runs.items())
    lat_ms = np.array(latencies) * 1e3
    print(f"\nembedded {done} texts of {corpus_path.name} in {elapsed:.1f} s: {done / elapsed:.1f} sentences/s")
    print(f"latency per message: p50 {np.percentile(lat_ms, 50):.1f} ms, p99 {np.percentile(lat_ms, 99):.1f} ms")
    print(f"engine runs: {sum(runs.values())}, mean batch size {rows / max(sum(runs.values()), 1):.2f}")
    print("batch size histogram (rows: runs):  " + "  ".join(f"{size}: {n}" for size, n in runs.items()))

    print(f"batch cap at the end: {final_cap(server.output)}")

    common = max(runs, key=lambda size: runs[size] * size) if runs else 1
    sample = [t for _, t in corpus[:RAW_SAMPLE]]
    print("\nraw ONNX Runtime on the same texts, no server (handler + session.run):")
    raw = {}
    for size in sorted({common, max(runs, default=1), *RAW_SIZES}):
        raw[size] = raw_throughput(args.model_repository / MODEL, sample, size)
        print(f"  batch {size:3d}: {raw[size]:.1f} sentences/s")
    best = max(raw, key=raw.__getitem__)
    print(f"served {done / elapsed:.1f} sentences/s: {done / elapsed / raw[best]:.2f} of the raw best batch "
          f"({best} rows, {raw[best]:.1f}/s)")
    print(f"server stopped (exit code {server_code})")
    return 0 if server_code == 0 else 1
