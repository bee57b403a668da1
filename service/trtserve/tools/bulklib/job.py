"""The bulk job: input rows → ModelStreamInfer streams on one or many servers → Parquet.

One ``grpc.aio`` channel and one ModelStreamInfer stream per endpoint. Rows are packed into
messages of up to ``rows_per_message`` rows (default: the model's ``max_batch_size``), each
message a request with its own id; the server answers in completion order and the answer is
matched back to its rows by that id.

* **Spreading**: a message goes to the live endpoint with the least outstanding rows among those
  with fewer than ``max_inflight`` messages unanswered (least outstanding work).
* **Backpressure**: at most ``max_inflight`` messages per stream, and a window of rows between
  the reader and the output; the reader stops when the window is full, so memory stays flat for
  any input size.
* **Retries**: a broken stream (server killed, connection lost) re-queues every unanswered
  message of that stream, for another endpoint or the same one once it is back (exponential
  backoff per endpoint, one probe message first). A message answered ``UNAVAILABLE``,
  ``RESOURCE_EXHAUSTED`` or ``DEADLINE_EXCEEDED`` (transient: :data:`RETRY_CODES`) is retried
  with exponential backoff, up to ``max_retries`` times; a row still refused that way after its
  retries is *pending*, never final: it goes neither to the output nor to the errors file, the
  job ends without writing the final file and exits 1, and a re-run sends it again.
  ``INVALID_ARGUMENT`` (and other per-request errors) are permanent and never retried: a
  multi-row message is split into one message per row, so only the bad row fails, and that row
  goes to the errors file with the server's message. ``NOT_FOUND``/``UNIMPLEMENTED`` stop the
  job. If no row is answered for ``stall_timeout`` seconds the job stops; what was committed
  stays committed and a re-run finishes the rest.
* **Exactly once**: see :mod:`.sink`. Within a run each id is planned once (a repeated input id
  is skipped and counted), each message id is used once (a re-send gets a new id, so a late
  answer can never be taken for another attempt's).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import CHANNEL_OPTIONS, Credentials, build_request, parse_response
from trtserve.datatypes import DATATYPES
from trtserve.spec import TensorSpec
from trtserve.tools.bulklib.sink import ErrorLog, PartStore, ResumeError, RowBuffer, output_schema
from trtserve.tools.bulklib.source import Row, RowEncoder, count_rows, detect_format, open_batches, parse_input_columns, stack_rows

log = logging.getLogger("trtserve.bulk")

# Transient refusals: retried, and never final (a row refused only with these is left for a re-run).
RETRY_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "ABORTED"})
FATAL_CODES = frozenset({"NOT_FOUND", "UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED"})
BULK_CHANNEL_OPTIONS = CHANNEL_OPTIONS + [
    # reconnect to a restarted server within seconds, not grpc's default of up to 2 minutes
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
]
LATENCY_SAMPLES = 200_000


class BulkError(RuntimeError):
    """The job cannot go on (no server, unknown model, stalled); committed rows stay committed."""


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Exponential backoff with full jitter: up to ``base * 2**(attempt-1)`` seconds, capped."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2 ** max(attempt - 1, 0))


@dataclass
class JobConfig:
    """Everything ``trtserve bulk`` needs (the CLI flags, parsed)."""

    input: Path
    model: str
    output: Path
    endpoints: Sequence[str] = ("127.0.0.1:8001",)
    id_column: str = "id"
    input_columns: Sequence[str] = ("text",)
    input_format: str | None = None
    errors: Path | None = None
    ordered: bool = False
    fail_on_error: bool = False
    max_inflight: int = 8
    rows_per_message: int | None = None
    flush_rows: int = 2048
    flush_seconds: float = 30.0
    max_retries: int = 8
    stall_timeout: float = 300.0
    progress: bool = True
    read_batch_rows: int = 4096
    credentials: Credentials = field(default_factory=Credentials)

    @property
    def errors_path(self) -> Path:
        return self.errors or self.output.with_name(self.output.name + ".errors.jsonl")


@dataclass
class Summary:
    """What a run did (``trtserve bulk`` prints it; ``--summary-json`` writes it)."""

    rows_read: int = 0
    rows_written: int = 0
    skipped: int = 0
    duplicates: int = 0
    errors: int = 0
    errors_total: int = 0
    pending: int = 0  # rows given up on after transient refusals: a re-run sends them again
    pending_codes: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    splits: int = 0
    broken_streams: int = 0
    wall_s: float = 0.0
    rows_per_s: float = 0.0
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    messages: int = 0
    mean_batch_size: float = math.nan
    output_rows: int = 0
    per_endpoint: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lines = [
            f"rows written {self.rows_written}  (read {self.rows_read}, skipped as already committed {self.skipped}, "
            f"duplicate ids {self.duplicates})",
            f"errors {self.errors} this run ({self.errors_total} in the errors file)  pending {self.pending}  "
            f"retries {self.retries}  broken streams {self.broken_streams}  split messages {self.splits}",
            f"wall {self.wall_s:.1f} s  {self.rows_per_s:.1f} rows/s",
        ]
        if self.messages:
            lines[-1] += (f"  latency per message p50 {self.latency_p50_ms:.1f} ms p99 {self.latency_p99_ms:.1f} ms "
                          f"({self.messages} messages)")
        if not math.isnan(self.mean_batch_size):
            lines.append(f"mean batch size {self.mean_batch_size:.2f} (servers' ModelStatistics, this run)")
        lines.append("rows per endpoint: " + ", ".join(f"{k}: {v}" for k, v in self.per_endpoint.items()))
        if self.pending:
            lines.append(f"output not final: {self.pending} row(s) pending (committed rows are kept in the parts)")
        else:
            lines.append(f"output rows {self.output_rows}")
        return lines

    def pending_note(self, max_retries: int | None) -> str:
        """The sentence ``trtserve bulk`` ends with when rows are pending ("" when none)."""
        if not self.pending:
            return ""
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.pending_codes.items()))
        after = f" after {max_retries} retries" if max_retries is not None else ""
        return (f"{self.pending} row(s) not done: refused with retryable codes ({codes}){after}; they are "
                "not in the errors file: re-run the same command to resume them")


@dataclass
class Message:
    """Rows sharing one request: resent whole on a broken stream, split on a per-row error."""

    rows: list[Row]
    inputs: dict[str, np.ndarray]
    attempts: int = 0
    sent_at: float = 0.0


class Endpoint:
    """One server: its channel, stream state and what it holds unanswered."""

    def __init__(self, url: str, credentials: Credentials) -> None:
        self.url = url
        tls = credentials.channel_credentials()
        self.channel = (grpc.aio.secure_channel(url, tls, options=BULK_CHANNEL_OPTIONS) if tls
                        else grpc.aio.insecure_channel(url, options=BULK_CHANNEL_OPTIONS))
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.metadata = credentials.metadata
        self.inflight: dict[str, Message] = {}
        self.outstanding_rows = 0
        self.send_q: asyncio.Queue[pb.ModelInferRequest] = asyncio.Queue()
        self.failures = 0
        self.down_until = 0.0
        self.last_error = ""
        self.sent = 0
        self.rows_done = 0
        self.task: asyncio.Task | None = None

    def capacity(self, max_inflight: int) -> int:
        """Messages it may hold: one probe while recovering from a failure."""
        return 1 if self.failures else max_inflight


class BulkJob:
    """One run of a bulk job (see the module docstring). ``await job.run()`` → :class:`Summary`."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.summary = Summary()
        self.latencies: list[float] = []
        self.ids = itertools.count()

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> Summary:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.endpoints = [Endpoint(url, cfg.credentials) for url in cfg.endpoints]
        self.work: asyncio.Queue[Message] = asyncio.Queue()
        self.capacity_changed = asyncio.Event()
        self.budget_changed = asyncio.Event()
        self.budget_used = 0
        self.unresolved = 0
        self.reader_done = False
        self.last_progress = time.monotonic()
        self.write_lock = asyncio.Lock()
        self.flush_pending = False
        self.last_flush = time.monotonic()
        self.ready: dict[int, tuple | None] = {}
        self.next_seq = 0
        tasks: list[asyncio.Task] = []
        start = time.perf_counter()
        self.progress = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._fail, BulkError(f"interrupted by {signal.Signals(sig).name}"))
            except (NotImplementedError, RuntimeError):
                pass
        try:
            await self._until_done(self._discover())
            self.fmt = detect_format(cfg.input, cfg.input_format)
            self.encoder = RowEncoder(self.inputs, self.mapping, cfg.id_column)
            self.store = PartStore(cfg.output)
            self.errors = ErrorLog(cfg.errors_path)
            committed = await asyncio.to_thread(self.store.committed_ids, cfg.id_column, cfg.model)
            error_ids, error_lines = await asyncio.to_thread(self.errors.ids)
            self.summary.errors_total = error_lines
            self.skip_ids = committed | error_ids
            self.seen: set = set()
            if self.skip_ids:
                log.info("resuming: %d ids already committed, %d in the errors file", len(committed), len(error_ids))
            total = await asyncio.to_thread(count_rows, cfg.input, self.fmt)
            self._open_progress(total)
            stats_before = await self._statistics()
            for ep in self.endpoints:
                ep.task = self._spawn(self._endpoint_loop(ep))
            tasks += [self._spawn(self._read()), self._spawn(self._schedule()), self._spawn(self._watchdog()),
                      self._spawn(self._timed_flush())]
            try:
                await self.done
            except BaseException:
                await self._flush()  # keep what was answered: a re-run starts from it
                raise
            await self._flush()
            self.errors.close()
            stats_after = await self._statistics()
            if not self.summary.pending:  # the final file is written once every row is done
                self.summary.output_rows = await asyncio.to_thread(self.store.finalize, cfg.id_column)
            self._finish_summary(start, stats_before, stats_after)
            return self.summary
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
            for t in tasks + [ep.task for ep in getattr(self, "endpoints", []) if ep.task]:
                t.cancel()
            await asyncio.gather(*tasks, *(ep.task for ep in self.endpoints if ep.task), return_exceptions=True)
            for ep in self.endpoints:
                await ep.channel.close()
            if getattr(self, "errors", None):
                self.errors.close()
            if self.progress is not None:
                self.progress.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)

        def check(t: asyncio.Task) -> None:
            exc = None if t.cancelled() else t.exception()
            if exc is not None:
                self._fail(exc)

        task.add_done_callback(check)
        return task

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def _check_done(self) -> None:
        if self.reader_done and self.unresolved == 0 and not self.done.done():
            self.done.set_result(None)

    # -- model discovery and statistics -----------------------------------------------------------

    async def _until_done(self, step: Awaitable[None]) -> None:
        """Run ``step``, but stop at once if the job fails meanwhile (a signal, see ``run``):
        raises the job's error then."""
        task = asyncio.ensure_future(step)
        await asyncio.wait((task, self.done), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.done.result()  # raises the failure that ended the wait
        task.result()

    async def _discover(self) -> None:
        """Read the model's inputs, outputs and max_batch_size from the first endpoint that answers.

        Raises:
            BulkError: the model is unknown, or no endpoint answered within ``stall_timeout``.
        """
        cfg = self.cfg
        deadline = time.monotonic() + cfg.stall_timeout
        attempt = 0
        while True:
            errors = []
            for ep in self.endpoints:
                try:
                    meta = await ep.stub.ModelMetadata(pb.ModelMetadataRequest(name=cfg.model), timeout=10, metadata=ep.metadata)
                    config = (await ep.stub.ModelConfig(pb.ModelConfigRequest(name=cfg.model), timeout=10, metadata=ep.metadata)).config
                except grpc.aio.AioRpcError as exc:
                    if exc.code().name in FATAL_CODES:  # retrying cannot help (unknown model, bad token, ...)
                        raise BulkError(f"{ep.url}: {exc.code().name}: {exc.details()}") from None
                    errors.append(f"{ep.url}: {exc.code().name}: {exc.details()}")
                    continue
                self.max_batch_size = config.max_batch_size
                batched = config.max_batch_size > 0
                self.batched = batched
                cut = 1 if batched else 0
                self.inputs = [TensorSpec(t.name, DATATYPES[t.datatype], tuple(t.shape[cut:])) for t in meta.inputs]
                self.outputs = [TensorSpec(t.name, DATATYPES[t.datatype], tuple(t.shape[cut:])) for t in meta.outputs]
                self.mapping = parse_input_columns(list(cfg.input_columns), [t.name for t in self.inputs])
                per_message = cfg.rows_per_message or max(config.max_batch_size, 1)
                self.rows_per_message = per_message if batched else 1
                self.window = max(2 * len(self.endpoints) * cfg.max_inflight * self.rows_per_message, 4 * self.rows_per_message)
                log.info("model %s version %s: inputs %s, outputs %s, %d rows per message",
                         cfg.model, meta.versions[0] if meta.versions else "?", [t.name for t in self.inputs],
                         [t.name for t in self.outputs], self.rows_per_message)
                return
            attempt += 1
            if time.monotonic() > deadline:
                raise BulkError("no endpoint answered: " + "; ".join(errors))
            log.warning("no endpoint answered yet (%s); retrying", "; ".join(errors))
            await asyncio.sleep(backoff(attempt, 0.5, 5.0))

    async def _statistics(self) -> dict[str, tuple[int, int] | None]:
        """Endpoint → (rows, engine runs) of the model from ModelStatistics (None if down)."""

        async def one(ep: Endpoint) -> tuple[int, int] | None:
            try:
                r = await ep.stub.ModelStatistics(pb.ModelStatisticsRequest(name=self.cfg.model), timeout=5, metadata=ep.metadata)
            except grpc.aio.AioRpcError:
                return None
            s = r.model_stats[0] if r.model_stats else None
            return (s.inference_count, s.execution_count) if s else None

        values = await asyncio.gather(*(one(ep) for ep in self.endpoints))
        return dict(zip((ep.url for ep in self.endpoints), values))

    def _finish_summary(self, start: float, before: dict, after: dict) -> None:
        s = self.summary
        s.wall_s = time.perf_counter() - start
        s.rows_per_s = s.rows_written / s.wall_s if s.wall_s > 0 else 0.0
        if self.latencies:
            lat = np.array(self.latencies) * 1e3
            s.latency_p50_ms, s.latency_p99_ms = (float(np.percentile(lat, q)) for q in (50, 99))
        rows = runs = 0
        for url, a in after.items():
            b = before.get(url)
            if a is None:
                continue
            if b is None or a[0] < b[0]:  # the server restarted during the run: its counts are since then
                b = (0, 0)
            rows += a[0] - b[0]
            runs += a[1] - b[1]
        s.mean_batch_size = rows / runs if runs else math.nan
        s.per_endpoint = {ep.url: ep.rows_done for ep in self.endpoints}
        s.errors_total += s.errors

    # -- reading and planning ---------------------------------------------------------------------

    async def _acquire(self, n: int) -> None:
        while self.budget_used and self.budget_used + n > self.window:
            self.budget_changed.clear()
            await self.budget_changed.wait()
        self.budget_used += n

    def _release(self, n: int) -> None:
        self.budget_used -= n
        self.budget_changed.set()

    async def _read(self) -> None:
        cfg = self.cfg
        batches = open_batches(cfg.input, self.fmt, self.encoder.columns, self.encoder.binary_columns(),
                               cfg.read_batch_rows, string_columns=[cfg.id_column])
        seq = 0
        group: list[Row] = []
        sentinel = object()

        def next_encoded(first: int):
            batch = next(batches, sentinel)
            if batch is sentinel:
                return None
            return batch, self.encoder.encode(batch, first)

        while (item := await asyncio.to_thread(next_encoded, seq)) is not None:
            batch, encoded = item
            if not hasattr(self, "schema"):
                self._set_schema(batch.schema.field(cfg.id_column).type)
            seq += batch.num_rows
            self.summary.rows_read += batch.num_rows
            for row_seq, key, row in encoded:
                if cfg.ordered:
                    # every row holds the window until it is written in order; send the rows
                    # gathered so far before waiting, or the head row might never be sent
                    if group and self.budget_used + 1 > self.window:
                        await self._plan(group)
                        group = []
                    await self._acquire(1)
                if key is not None and (key in self.skip_ids or key in self.seen):
                    if key in self.skip_ids:
                        self.summary.skipped += 1
                    else:
                        self.summary.duplicates += 1
                        if self.summary.duplicates == 1:
                            log.warning("input id %r appears again (input row %d); later copies are skipped", key, row_seq)
                    self._resolve_row(row_seq, None, planned=False)
                    continue
                if key is not None:
                    self.seen.add(key)
                if isinstance(row, str):
                    if not cfg.ordered:
                        await self._acquire(1)
                    self.unresolved += 1
                    self._record_error(key, row_seq, "INVALID_ARGUMENT", row, "client")
                    continue
                if group and (len(group) >= self.rows_per_message or row.signature() != group[0].signature()):
                    await self._plan(group)
                    group = []
                group.append(row)
        if group:
            await self._plan(group)
        self.reader_done = True
        self._check_done()

    def _set_schema(self, id_type: pa.DataType) -> None:
        cfg = self.cfg
        self.id_type = id_type
        self.schema = output_schema(cfg.id_column, id_type, self.outputs, cfg.model)
        existing = self.store.existing_schema()
        if existing is not None and not existing.remove_metadata().equals(self.schema.remove_metadata()):
            raise ResumeError(f"{cfg.output} (or its parts) has schema {existing.remove_metadata()}, but this job writes "
                              f"{self.schema.remove_metadata()}; choose another --output")
        self.buffer = RowBuffer(id_type, self.outputs, self.schema)

    async def _plan(self, rows: list[Row]) -> None:
        if not self.cfg.ordered:
            await self._acquire(len(rows))
        self.unresolved += len(rows)
        self.work.put_nowait(Message(rows, stack_rows(rows, self.batched)))

    # -- scheduling and streams -------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            msg = await self.work.get()
            ep = await self._pick()
            request_id = f"{next(self.ids)}"
            ep.inflight[request_id] = msg
            ep.outstanding_rows += len(msg.rows)
            ep.sent += 1
            msg.sent_at = time.perf_counter()
            ep.send_q.put_nowait(build_request(self.cfg.model, msg.inputs, request_id=request_id))

    async def _pick(self) -> Endpoint:
        """The live endpoint with a free slot and the least outstanding rows (waits for one)."""
        while True:
            now = time.monotonic()
            best = None
            for ep in self.endpoints:
                if now < ep.down_until or len(ep.inflight) >= ep.capacity(self.cfg.max_inflight):
                    continue
                if best is None or (ep.outstanding_rows, ep.sent) < (best.outstanding_rows, best.sent):
                    best = ep
            if best is not None:
                return best
            self.capacity_changed.clear()
            waits = [ep.down_until - now for ep in self.endpoints if ep.down_until > now]
            try:
                await asyncio.wait_for(self.capacity_changed.wait(), timeout=min(waits) if waits else None)
            except asyncio.TimeoutError:
                pass

    async def _endpoint_loop(self, ep: Endpoint) -> None:
        """Open a stream when there is something to send; on a break, hand its messages back."""
        while True:
            first = await ep.send_q.get()
            call = ep.stub.ModelStreamInfer(metadata=ep.metadata)
            reader = asyncio.ensure_future(self._read_stream(ep, call))
            writer = asyncio.ensure_future(self._write_stream(call, ep, first))
            try:
                done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                reader.cancel()
                writer.cancel()
                call.cancel()
            exc = next((t.exception() for t in (reader, writer) if t in done and not t.cancelled() and t.exception()), None)
            self._stream_broken(ep, exc)

    async def _write_stream(self, call, ep: Endpoint, first: pb.ModelInferRequest) -> None:
        await call.write(first)
        while True:
            await call.write(await ep.send_q.get())

    async def _read_stream(self, ep: Endpoint, call) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            self._on_response(ep, message)

    def _stream_broken(self, ep: Endpoint, exc: BaseException | None) -> None:
        if isinstance(exc, grpc.aio.AioRpcError):
            code, why = exc.code().name, f"{exc.code().name}: {exc.details()}"
            if code == "UNIMPLEMENTED":
                self._fail(BulkError(f"{ep.url} does not serve ModelStreamInfer: {exc.details()}"))
        elif exc is None:
            code, why = "EOF", "the server ended the stream"
        else:
            code, why = type(exc).__name__, repr(exc)
        lost = list(ep.inflight.values())
        ep.inflight.clear()
        ep.outstanding_rows = 0
        while not ep.send_q.empty():
            ep.send_q.get_nowait()
        ep.failures += 1
        delay = backoff(ep.failures)
        ep.down_until = time.monotonic() + delay
        ep.last_error = why
        self.summary.broken_streams += 1
        self.summary.retries += len(lost)
        if ep.failures == 1:
            log.warning("stream to %s broke (%s); re-sending %d unanswered message(s) elsewhere; retrying it in %.1f s",
                        ep.url, why, len(lost), delay)
        else:
            log.debug("%s still down (%s); next try in %.1f s", ep.url, why, delay)
        for msg in lost:
            self.work.put_nowait(msg)
        self.capacity_changed.set()

    def _on_response(self, ep: Endpoint, message: pb.ModelStreamInferResponse) -> None:
        response = message.infer_response
        msg = ep.inflight.pop(response.id, None)
        if msg is None:
            return  # not ours (any more)
        ep.outstanding_rows -= len(msg.rows)
        self.capacity_changed.set()
        if len(self.latencies) < LATENCY_SAMPLES:
            self.latencies.append(time.perf_counter() - msg.sent_at)
        else:
            self.latencies[random.randrange(LATENCY_SAMPLES)] = time.perf_counter() - msg.sent_at
        self.summary.messages += 1
        if message.error_message:
            code = response.parameters["error_code"].string_param if "error_code" in response.parameters else "UNKNOWN"
            self._on_message_error(ep, msg, code, message.error_message)
            return
        if ep.failures:
            log.info("%s answers again", ep.url)
            ep.failures = 0
        ep.rows_done += len(msg.rows)
        self._resolve_message(msg, parse_response(response))

    def _on_message_error(self, ep: Endpoint, msg: Message, code: str, text: str) -> None:
        if code in FATAL_CODES:
            self._fail(BulkError(f"{ep.url}: {code}: {text}"))
            return
        transient = code in RETRY_CODES
        if transient and msg.attempts < self.cfg.max_retries:
            msg.attempts += 1
            self.summary.retries += 1
            if code == "UNAVAILABLE":  # the server is going away (draining, model unloading): go elsewhere
                ep.failures += 1
                ep.down_until = time.monotonic() + backoff(ep.failures)
                ep.last_error = f"{code}: {text}"
                self.work.put_nowait(msg)
            else:
                self.loop.call_later(backoff(msg.attempts), self.work.put_nowait, msg)
            return
        if len(msg.rows) > 1:  # find the bad row(s): one message per row, the others succeed
            self.summary.splits += 1
            for row in msg.rows:
                self.work.put_nowait(Message([row], stack_rows([row], self.batched)))
            return
        row = msg.rows[0]
        if transient:  # not the row's fault: leave it for a re-run, never in the errors file
            self._leave_pending(row, code, text)
            return
        self._record_error(row.id, row.seq, code, text, ep.url)

    # -- results ------------------------------------------------------------------------------

    def _record_error(self, key: object, seq: int, code: str, text: str, where: str) -> None:
        self.errors.write({"id": key, "row": seq, "code": code, "message": text, "endpoint": where})
        self.summary.errors += 1
        self._resolve_row(seq, None, planned=True)

    def _leave_pending(self, row: Row, code: str, text: str) -> None:
        s = self.summary
        s.pending += 1
        s.pending_codes[code] = s.pending_codes.get(code, 0) + 1
        if s.pending == 1:
            log.warning("row %r still refused after %d retries (%s: %s); it is left for a re-run",
                        row.id, self.cfg.max_retries, code, text)
        self._resolve_row(row.seq, None, planned=True)

    def _resolve_message(self, msg: Message, outputs: dict[str, np.ndarray]) -> None:
        if self.cfg.ordered:
            for i, row in enumerate(msg.rows):
                self._resolve_row(row.seq, (row.id, {k: v[i : i + 1] for k, v in outputs.items()}), planned=True)
            return
        self.buffer.add((r.id for r in msg.rows), outputs)
        self.summary.rows_written += len(msg.rows)
        self._release(len(msg.rows))
        self._progressed(len(msg.rows), planned=len(msg.rows))

    def _resolve_row(self, seq: int, result: tuple | None, planned: bool) -> None:
        """One row is finished (answered: ``result``; refused or skipped: ``None``)."""
        if not self.cfg.ordered:
            if planned:
                self._release(1)
            self._progressed(1, planned=1 if planned else 0)
            return
        self.ready[seq] = result
        released = 0
        while self.next_seq in self.ready:
            entry = self.ready.pop(self.next_seq)
            self.next_seq += 1
            released += 1
            if entry is not None:
                self.buffer.add([entry[0]], entry[1])
                self.summary.rows_written += 1
        if released:
            self._release(released)
        self._progressed(1, planned=1 if planned else 0)

    def _progressed(self, rows: int, planned: int) -> None:
        self.unresolved -= planned
        if planned:
            self.last_progress = time.monotonic()
        if self.progress is not None:
            self.progress.update(rows)
        if hasattr(self, "buffer") and self.buffer.rows >= self.cfg.flush_rows and not self.flush_pending:
            self.flush_pending = True
            self._spawn(self._flush())
        self._check_done()

    async def _flush(self) -> None:
        """Commit the buffered rows as one part file (one row group)."""
        async with self.write_lock:
            self.flush_pending = False
            if not hasattr(self, "buffer") or not self.buffer.rows:
                return
            table = self.buffer.take()
            self.last_flush = time.monotonic()
            await asyncio.to_thread(self.store.write_part, table)
            if self.progress is not None:
                self.progress.set_postfix(errors=self.summary.errors, retries=self.summary.retries, refresh=False)

    async def _timed_flush(self) -> None:
        """Commit at least every ``flush_seconds`` (counted from the last commit), so a slow job
        still checkpoints."""
        while True:
            wait = self.last_flush + self.cfg.flush_seconds - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            await self._flush()
            if time.monotonic() - self.last_flush >= self.cfg.flush_seconds:  # there was nothing to write
                self.last_flush = time.monotonic()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.cfg.stall_timeout / 4))
            idle = time.monotonic() - self.last_progress
            if self.unresolved and idle > self.cfg.stall_timeout:
                states = "; ".join(f"{ep.url}: {ep.last_error or 'no error'}" for ep in self.endpoints)
                raise BulkError(f"no row was answered for {idle:.0f} s ({states}); committed rows are kept, "
                                "re-run the same command to finish")

    def _open_progress(self, total: int | None) -> None:
        if not self.cfg.progress or not sys.stderr.isatty():
            return
        from tqdm import tqdm

        self.progress = tqdm(total=total, unit="row", desc=f"bulk {self.cfg.model}", dynamic_ncols=True, smoothing=0.05)
