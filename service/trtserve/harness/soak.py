"""``python -m trtserve.harness.soak``: a long run of mixed traffic against a real server process,
watching for leaks, stalls and wrong answers (``make soak``, not part of CI).

It starts ``trtserve serve`` on a repository holding only the chosen model (default ``minilm``)
and, for ``--duration`` seconds, runs at once:

* unary workers: one to four texts per request, 30 s deadline; a quarter of the requests carry
  a 2 ms ``timeout`` parameter instead (expected DEADLINE_EXCEEDED, or OK when they get in);
* stream workers: streams of 20-200 texts, read to the end;
* a cancelling worker: unary calls cancelled after 0-50 ms, and streams cancelled half-way;
* a malformed worker: invalid UTF-8, wrong datatypes, shapes and byte lengths, zero-size
  tensors, broken BYTES prefixes, unknown models and outputs.

Every OK answer of a few fixed probe sentences is compared with the first one seen (batching
and time must not change an answer). The server's RSS is read from /proc every
``--sample-every`` seconds. The report gives requests served, errors by status and traffic
kind, RSS at start, at every 5 minutes and at the end, the growth after warm-up (the median
RSS over the last minute against the median over the minute after the warm-up, by default the
first 20% of the run: ONNX Runtime's arena grows in steps until the largest padded batch
shapes have come up) and the RSS trend over the second half of the run (least squares, MiB per
minute). It exits 1 if any answer was UNKNOWN or INTERNAL, a well-formed request failed for a
reason other than its deadline, a probe answer changed, traffic stalled, or RSS grew by
``--max-growth`` (5%) or more after warm-up.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import grpc
import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import Client, build_request, parse_response
from trtserve.testing import ServerProcess

PROBES = ["A man is playing a guitar.", "Two dogs run across a snowy field.", "The stock market fell sharply today."]
EXPECTED_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND"}  # of the malformed worker
FATAL = {"UNKNOWN", "INTERNAL"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-repository", type=Path, default=Path("engines"),
                        help="repository with the model (default: engines)")
    parser.add_argument("--model", default="minilm",
                        help="model to soak; its input must be TEXT (BYTES [1]) (default: minilm)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic (default: 600)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"),
                        help="data directory for real sentences (default: ../shared/data)")
    parser.add_argument("--unary-workers", type=int, default=4)
    parser.add_argument("--stream-workers", type=int, default=2)
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS samples (default: 10)")
    parser.add_argument("--max-growth", type=float, default=0.05,
                        help="largest allowed RSS growth after warm-up (default: 0.05)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of warm-up before RSS growth is measured (default: 20%% of --duration)")
    parser.add_argument("--report", type=Path, help="also write the report as JSON here")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `trtserve serve` flag (repeatable)")


def sentences(data: Path, count: int = 20000) -> list[str]:
    """Real captions from ``<data>/corpus`` if present, else synthetic sentences."""
    corpus = data / "corpus" / "multi30k_en_captions.jsonl.gz"
    if corpus.is_file():
        with gzip.open(corpus, "rt") as f:
            return [json.loads(line)["text"] for line in itertools.islice(f, count)]
    rng = random.Random(0)
    words = "the a man woman dog cat plays runs under over red blue quickly slowly river street city music ball".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))).capitalize() + "." for _ in range(count)]


def texts(rows: list[str]) -> dict[str, np.ndarray]:
    return {"TEXT": np.array([[t.encode()] for t in rows], dtype=object)}


class Soak:
    """The traffic, the counters and the RSS samples of one run."""

    def __init__(self, url: str, model: str, corpus: list[str], deadline: float) -> None:
        self.url, self.model, self.corpus, self.deadline = url, model, corpus, deadline
        self.lock = threading.Lock()
        self.codes: dict[str, Counter[str]] = defaultdict(Counter)  # kind -> status -> count
        self.problems: list[str] = []
        self.reference: dict[str, np.ndarray] = {}
        self.last_ok = time.monotonic()
        self.served = 0

    def count(self, kind: str, code: str, detail: str = "") -> None:
        with self.lock:
            self.codes[kind][code] += 1
            if code == "OK":
                self.served += 1
                self.last_ok = time.monotonic()
            if code in FATAL:
                self.problems.append(f"{kind}: {code} {detail[:200]}")

    def check_probe(self, text: str, embedding: np.ndarray) -> None:
        with self.lock:
            first = self.reference.setdefault(text, embedding.copy())
        if float(np.abs(first - embedding).max()) > 1e-4:
            with self.lock:
                self.problems.append(f"the answer for {text!r} changed by {float(np.abs(first - embedding).max()):.2e}")

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    # -- workers ---------------------------------------------------------------------------

    def unary(self, seed: int) -> None:
        rng = random.Random(seed)
        with Client(self.url) as c:
            while self.running():
                rows = [rng.choice(self.corpus) for _ in range(rng.randint(1, 4))]
                if rng.random() < 0.1:
                    rows[0] = rng.choice(PROBES)
                short = rng.random() < 0.25
                kind = "unary (2 ms timeout)" if short else "unary"
                request = build_request(self.model, texts(rows), timeout_us=2000 if short else None)
                try:
                    response = c.stub.ModelInfer(request, timeout=30)
                except grpc.RpcError as exc:
                    code = exc.code().name
                    self.count(kind, code, exc.details() or "")
                    if code != "DEADLINE_EXCEEDED":
                        with self.lock:
                            self.problems.append(f"{kind}: {code} {exc.details()}")
                    continue
                out = parse_response(response)["EMBEDDING"]
                if rows[0] in PROBES:
                    self.check_probe(rows[0], out[0])
                self.count(kind, "OK")

    def stream(self, seed: int) -> None:
        rng = random.Random(seed)
        with Client(self.url) as c:
            while self.running():
                n = rng.randint(20, 200)
                items = [(str(i), texts([rng.choice(self.corpus + PROBES)])) for i in range(n)]
                sent = {i: x["TEXT"][0, 0].decode() for i, x in items}
                seen = set()
                try:
                    for rid, result in c.stream_infer(self.model, items, max_inflight=32):
                        if rid in seen:
                            with self.lock:
                                self.problems.append(f"stream: id {rid} answered twice")
                        seen.add(rid)
                        if hasattr(result, "code"):
                            self.count("stream", result.code, result.message)
                            with self.lock:
                                self.problems.append(f"stream: {result.code} {result.message}")
                        else:
                            self.count("stream", "OK")
                            if sent[rid] in PROBES:
                                self.check_probe(sent[rid], result["EMBEDDING"][0])
                except grpc.RpcError as exc:
                    self.count("stream (whole call)", exc.code().name, exc.details() or "")
                    continue
                if len(seen) != n:
                    with self.lock:
                        self.problems.append(f"stream: {n - len(seen)} of {n} messages never answered")

    def cancelling(self, seed: int) -> None:
        rng = random.Random(seed)
        with Client(self.url) as c:
            while self.running():
                if rng.random() < 0.7:
                    request = build_request(self.model, texts([rng.choice(self.corpus)]))
                    future = c.stub.ModelInfer.future(request, timeout=30)
                    time.sleep(rng.uniform(0, 0.05))
                    future.cancel()
                    self.count("cancelled unary", future.code().name)
                else:
                    call = c.stub.ModelStreamInfer(iter([build_request(self.model, texts([t]), request_id=str(i))
                                                         for i, t in enumerate(rng.sample(self.corpus, 40))]))
                    got = 0
                    for _ in call:
                        got += 1
                        if got == 10:
                            call.cancel()
                            break
                    self.count("cancelled stream", call.code().name)

    def malformed(self, seed: int) -> None:
        rng = random.Random(seed)
        with Client(self.url) as c:
            while self.running():
                request = self._malformed(rng)
                try:
                    c.stub.ModelInfer(request, timeout=30)
                    code, details = "OK", ""
                except grpc.RpcError as exc:
                    code, details = exc.code().name, exc.details() or ""
                self.count("malformed", code, details)
                if code not in EXPECTED_ERRORS:
                    with self.lock:
                        self.problems.append(f"malformed: {code} {details}")
                time.sleep(0.05)

    def _malformed(self, rng: random.Random) -> pb.ModelInferRequest:
        kind = rng.randrange(8)
        good = build_request(self.model, texts([rng.choice(self.corpus)]))
        if kind == 0:  # invalid UTF-8
            return build_request(self.model, {"TEXT": np.array([[b"\xff\xfe bad"]], dtype=object)})
        if kind == 1:  # wrong datatype
            return build_request(self.model, {"TEXT": np.ones((1, 1), np.float32)})
        if kind == 2:  # wrong rank
            return build_request(self.model, {"TEXT": np.array([b"no batch dim"], dtype=object)})
        if kind == 3:  # zero-size
            good.inputs[0].shape[:] = [0, 1]
            good.raw_input_contents[0] = b""
            return good
        if kind == 4:  # broken BYTES length prefix
            good.raw_input_contents[0] = struct.pack("<I", 1 << 30) + good.raw_input_contents[0][4:]
            return good
        if kind == 5:  # unknown model
            good.model_name = "no_such_model"
            return good
        if kind == 6:  # unknown output
            good.outputs.add(name="LOGITS")
            return good
        good.raw_input_contents.append(b"extra")  # more raw entries than inputs
        return good


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="trtserve-soak-"))
    (root / args.model).symlink_to((args.model_repository / args.model).resolve(), target_is_directory=True)
    corpus = sentences(args.data)
    mib = 1 << 20
    with ServerProcess(root, *args.server_arg) as server:
        start_rss = rss(server.pid)
        started = time.monotonic()
        soak = Soak(server.url, args.model, corpus, started + args.duration)
        workers = (
            [threading.Thread(target=soak.unary, args=(i,)) for i in range(args.unary_workers)]
            + [threading.Thread(target=soak.stream, args=(100 + i,)) for i in range(args.stream_workers)]
            + [threading.Thread(target=soak.cancelling, args=(200,)),
               threading.Thread(target=soak.malformed, args=(300,))]
        )
        for w in workers:
            w.start()
        samples: list[tuple[float, int]] = [(0.0, start_rss)]
        stalls = 0
        print(f"soak: {args.model} on {server.url} (pid {server.pid}) for {args.duration:.0f} s; "
              f"RSS at start {start_rss / mib:.1f} MiB", flush=True)
        while soak.running():
            time.sleep(min(args.sample_every, max(0.0, soak.deadline - time.monotonic())))
            now = time.monotonic() - started
            samples.append((now, rss(server.pid)))
            if time.monotonic() - soak.last_ok > 10:
                stalls += 1
            print(f"  t={now:6.0f} s  served {soak.served:8d}  RSS {samples[-1][1] / mib:7.1f} MiB", flush=True)
        for w in workers:
            w.join(60)
        alive = server.proc is not None and server.proc.poll() is None
        exit_code = server.stop()

    warmup = args.warmup if args.warmup is not None else 0.2 * args.duration
    window = max(min(60.0, args.duration / 5), args.sample_every)
    after_warmup = [r for t, r in samples if warmup <= t <= warmup + window] or [samples[-1][1]]
    last = [r for t, r in samples if t >= samples[-1][0] - window] or [samples[-1][1]]
    baseline, final = statistics.median(after_warmup), statistics.median(last)
    growth = final / baseline - 1
    half = [(t, r) for t, r in samples if t >= samples[-1][0] / 2]
    slope = float(np.polyfit([t for t, _ in half], [r for _, r in half], 1)[0]) * 60 if len(half) >= 3 else 0.0
    checkpoints = {"start": start_rss}
    for minute in range(5, int(args.duration // 60) + 1, 5):
        near = min(samples, key=lambda s: abs(s[0] - 60 * minute))
        checkpoints[f"{minute} min"] = near[1]
    checkpoints["end"] = samples[-1][1]
    report = {
        "model": args.model,
        "duration_s": round(time.monotonic() - started, 1),
        "requests_served": soak.served,
        "by_kind": {kind: dict(codes) for kind, codes in sorted(soak.codes.items())},
        "errors_by_status": dict(sum((Counter({k: v for k, v in c.items() if k != "OK"}) for c in soak.codes.values()),
                                     Counter())),
        "rss_mib": {k: round(v / mib, 1) for k, v in checkpoints.items()},
        "rss_after_warmup_mib": round(baseline / mib, 1),
        "rss_final_mib": round(final / mib, 1),
        "rss_growth_after_warmup": round(growth, 4),
        "warmup_s": warmup,
        "rss_trend_second_half_mib_per_min": round(slope / mib, 3),
        "rss_samples_mib": [[round(t), round(r / mib, 1)] for t, r in samples],
        "stalled_samples": stalls,
        "server_alive_at_end": alive,
        "server_exit_code": exit_code,
        "problems": soak.problems[:50],
        "problem_count": len(soak.problems),
    }
    print(json.dumps(report, indent=2))
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    ok = not soak.problems and growth < args.max_growth and stalls == 0 and alive and exit_code == 0
    print(f"soak: {'PASS' if ok else 'FAIL'}: {soak.served} requests served, "
          f"RSS {baseline / mib:.1f} -> {final / mib:.1f} MiB "
          f"({growth * 100:+.2f}% after warm-up), {len(soak.problems)} problem(s)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtserve.harness.soak", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
