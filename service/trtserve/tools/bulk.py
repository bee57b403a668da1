"""``trtserve bulk``: run a model over a whole file (JSONL, CSV, Parquet) through one or many
trtserve servers, or on a Ray cluster with ``--ray``, into a Parquet file.

::

    trtserve bulk --input corpus.jsonl.gz --model minilm --output emb.parquet \\
        --endpoint 10.0.0.1:8001 --endpoint 10.0.0.2:8001

The output has the id column and one column per model output (a fixed-size list per row).
Rows the server refuses for good (INVALID_ARGUMENT: bad text, wrong type or shape) go to the
errors file with the server's message and the job goes on. Rows still refused with a transient
code (RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED) after ``--max-retries`` are pending:
in neither file, and the final output is not written. Re-running the same command after a crash,
a kill or pending rows skips every id already committed or refused for good and finishes the
rest; every input id ends up exactly once in the output or the errors file
(:mod:`trtserve.tools.bulklib.sink` describes the files).
Exit status: 0 done; 1 the job did not finish (no server, stalled, interrupted, or rows pending
after their retries: re-run the same command to resume) or, with ``--fail-on-error``, some rows
were refused for good; 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

from trtserve.client import AUTH_TOKEN_ENV, Credentials

log = logging.getLogger("trtserve.bulk")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True,
                        help="JSONL (.jsonl, .jsonl.gz), CSV or Parquet file (with --ray also a URI such as s3://...)")
    parser.add_argument("--input-format", choices=("jsonl", "csv", "parquet"),
                        help="override the format from the file name")
    parser.add_argument("--model", default="minilm", help="model name (default: minilm)")
    parser.add_argument("--output", type=Path, required=True,
                        help="Parquet file to write (resumed if it or its parts exist)")
    parser.add_argument("--id-column", default="id", help="column with each row's unique id (default: id)")
    parser.add_argument("--input-column", action="append", default=None, metavar="[INPUT=]COLUMN",
                        help="column feeding a model input; COLUMN alone for a one-input model, INPUT=COLUMN "
                             "(repeat) otherwise (default: text)")
    parser.add_argument("--endpoint", action="append", default=None, metavar="HOST:PORT",
                        help="trtserve server; repeat for several (default: 127.0.0.1:8001)")
    parser.add_argument("--long-text", choices=("truncate", "chunk"), default="truncate",
                        help="a text longer than the model's window: cut at it (truncate, the default) or embedded "
                             "whole as overlapping windows pooled into one embedding (chunk; the request's long_text "
                             "parameter)")
    parser.add_argument("--errors", type=Path, help="JSONL file for refused rows (default: OUTPUT.errors.jsonl)")
    parser.add_argument("--ordered", action="store_true", help="write rows in input order (default: completion order)")
    parser.add_argument("--fail-on-error", action="store_true", help="exit 1 if any row is in the errors file")
    parser.add_argument("--max-inflight", type=int, default=8, help="unanswered messages per stream (default: 8)")
    parser.add_argument("--rows-per-message", type=int,
                        help="rows per request (default: the model's max_batch_size, at most 64)")
    parser.add_argument("--flush-rows", type=int, default=2048,
                        help="rows per committed part / row group (default: 2048)")
    parser.add_argument("--flush-seconds", type=float, default=30.0,
                        help="commit buffered rows at least this often (default: 30)")
    parser.add_argument("--max-retries", type=int, default=8,
                        help="retries of a message answered UNAVAILABLE/RESOURCE_EXHAUSTED/DEADLINE_EXCEEDED; "
                             "a row still refused after them is left for a re-run (exit 1) (default: 8)")
    parser.add_argument("--stall-timeout", type=float, default=300.0,
                        help="stop if no row is answered for this many seconds (default: 300)")
    parser.add_argument("--down-timeout", type=float, default=60.0,
                        help="stop (exit 1, committing what was answered: re-run to resume) once every endpoint has "
                             "been down this many seconds; meanwhile one line every few seconds names each down "
                             "endpoint and the rows pending; 0 waits for ever (default: 60)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is off anyway when stderr is not a TTY)")
    parser.add_argument("--summary-json", type=Path, help="also write the final summary as JSON here")
    secure = parser.add_argument_group("TLS and auth (a server started with --tls-cert / --auth-token-file)")
    secure.add_argument("--tls-ca", type=Path,
                        help="PEM of the CA that signed the servers' certificates: connect with TLS")
    secure.add_argument("--tls-cert", type=Path, help="PEM certificate of this client (mutual TLS; with --tls-key)")
    secure.add_argument("--tls-key", type=Path, help="PEM key of this client (mutual TLS; with --tls-cert)")
    secure.add_argument("--auth-token-file", type=Path,
                        help="file whose first line is the bearer token (default: $TRTSERVE_AUTH_TOKEN)")
    ray = parser.add_argument_group("Ray Data (pip install 'trtserve[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="run on Ray: actors host the model in-process (from --model-repository)")
    ray.add_argument("--ray-address",
                     help="an existing cluster (e.g. ray://head:10001 or auto); default: start a local Ray")
    ray.add_argument("--ray-actors", type=int, default=1, help="model actors (default: 1)")
    ray.add_argument("--ray-cpus-per-actor", type=float, default=1.0, help="CPUs reserved per actor (default: 1)")
    ray.add_argument("--ray-gpus-per-actor", type=float, default=0.0, help="GPUs per actor (default: 0)")
    ray.add_argument("--ray-num-cpus", type=int, default=2,
                     help="CPUs of the local Ray started without --ray-address (default: 2)")
    ray.add_argument("--ray-batch-rows", type=int, default=256, help="rows per map_batches call (default: 256)")


def run(args: argparse.Namespace) -> int:
    from trtserve.tools.bulklib.endpoints import BulkError
    from trtserve.tools.bulklib.job import JobConfig
    from trtserve.tools.bulklib.sink import ResumeError
    from trtserve.tools.bulklib.source import InputError
    from trtserve.tools.bulklib.summary import Summary

    if (args.tls_cert is None) != (args.tls_key is None):
        print("trtserve bulk: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.down_timeout < 0:
        print(f"trtserve bulk: --down-timeout must be a number of seconds >= 0 (0: wait for ever), "
              f"got {args.down_timeout:g}", file=sys.stderr)
        return 2
    try:
        credentials = Credentials.from_files(args.tls_ca, args.tls_cert, args.tls_key, args.auth_token_file)
        if credentials.token is None and os.environ.get(AUTH_TOKEN_ENV, "").strip():
            credentials = dataclasses.replace(credentials, token=os.environ[AUTH_TOKEN_ENV].strip())
    except OSError as exc:
        print(f"trtserve bulk: cannot read a TLS or token file: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"trtserve bulk: {exc}", file=sys.stderr)
        return 2
    cfg = JobConfig(
        input=Path(args.input),
        model=args.model,
        output=args.output,
        endpoints=args.endpoint or ["127.0.0.1:8001"],
        id_column=args.id_column,
        input_columns=args.input_column or ["text"],
        input_format=args.input_format,
        long_text=args.long_text,
        errors=args.errors,
        ordered=args.ordered,
        fail_on_error=args.fail_on_error,
        max_inflight=args.max_inflight,
        rows_per_message=args.rows_per_message,
        flush_rows=args.flush_rows,
        flush_seconds=args.flush_seconds,
        max_retries=args.max_retries,
        stall_timeout=args.stall_timeout,
        down_timeout=args.down_timeout,
        progress=not args.no_progress,
        credentials=credentials,
    )
    remote = args.ray and "://" in args.input
    if not remote and not cfg.input.exists():
        print(f"trtserve bulk: no such input file: {cfg.input}", file=sys.stderr)
        return 2
    try:
        if args.ray:
            from trtserve.tools.bulklib.ray import run_bulk

            summary: Summary = run_bulk(cfg, args)
        else:
            from trtserve.tools.bulklib.job import BulkJob

            summary = asyncio.run(BulkJob(cfg).run())
    except (InputError, ResumeError, ValueError) as exc:
        print(f"trtserve bulk: {exc}", file=sys.stderr)
        return 2
    except BulkError as exc:
        print(f"trtserve bulk: stopped: {exc}", file=sys.stderr)
        return 1
    print("\n".join(summary.lines()))
    if args.summary_json:
        args.summary_json.write_text(json.dumps(asdict(summary), indent=1, default=str))
    status = 0
    if summary.errors_total:
        print(f"{summary.errors_total} row(s) refused: see {cfg.errors_path}")
        if cfg.fail_on_error:
            status = 1
    if summary.pending:
        print(f"trtserve bulk: {summary.pending_note(None if args.ray else cfg.max_retries)}", file=sys.stderr)
        status = 1
    return status
