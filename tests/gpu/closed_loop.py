"""A closed loop of blocking gRPC callers in one process, for the GPU check's throughput figures.

Each of ``--callers`` threads sends one request of ``--rows`` texts, waits for its answer and sends
the next, for ``--warmup`` seconds unmeasured and then a window of ``--seconds``. The calls that
complete inside the window are counted. The GPU check starts several of these processes at once
(one Python process's client would be the limit long before a GPU is), each printing one JSON line:
``{"calls": N, "rows": R, "errors": E, "seconds": S}``.

Usage: python3 tests/gpu/closed_loop.py --url HOST:PORT --model NAME --text TEXT [--rows 8]
       [--callers 8] [--warmup 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import grpc
import numpy as np

from trtserve.client import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="the text every row carries")
    parser.add_argument("--rows", type=int, default=8, help="texts per request")
    parser.add_argument("--callers", type=int, default=8, help="threads, one request in flight each")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the window")
    parser.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    args = parser.parse_args(argv)
    batch = np.array([[args.text.encode()]] * args.rows, dtype=object)
    start = time.perf_counter() + args.warmup
    stop = start + args.seconds
    counts = {"calls": 0, "errors": 0}
    lock = threading.Lock()

    def caller(client: Client) -> None:
        while time.perf_counter() < stop:
            try:
                client.infer(args.model, {"TEXT": batch}, timeout=60)
                ok = True
            except grpc.RpcError:
                ok = False
            done = time.perf_counter()
            if start <= done <= stop:
                with lock:
                    counts["calls" if ok else "errors"] += 1

    with Client(args.url) as client:
        threads = [threading.Thread(target=caller, args=(client,)) for _ in range(args.callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps({**counts, "rows": counts["calls"] * args.rows, "seconds": args.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
