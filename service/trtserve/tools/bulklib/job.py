"""The bulk job: input rows → ModelStreamInfer streams on one or many servers → Parquet.

One ``grpc.aio`` channel and one ModelStreamInfer stream per endpoint (:mod:`.endpoints`).
Rows are packed into messages of up to ``rows_per_message`` rows (default: the model's
``max_batch_size``, at most :data:`MESSAGE_ROWS`), each message a request with its own id; the
server answers in completion order and the answer is matched back to its rows by that id.

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
* **Down endpoints**: while an endpoint is down (its stream broke or it answered UNAVAILABLE,
  and it has not answered since) one line every few seconds says which, for how long, and how
  many rows are pending; once every endpoint has been down for ``down_timeout`` seconds (0:
  wait for ever) the job commits what was answered and stops (exit 1, "re-run the same command
  to resume").
* **Exactly once**: see :mod:`.sink`. Within a run each id is planned once (a repeated input id
  is skipped and counted), each message id is used once (a re-send gets a new id, so a late
  answer can never be taken for another attempt's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
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
from trtserve.client import Credentials, build_request, parse_response
from trtserve.tools.bulklib.endpoints import (
    FATAL_CODES,
    BulkError,
    Counts,
    Endpoint,
    Message,
    backoff,
    discover,
    mean_batch_size,
    model_statistics,
    pick,
)
from trtserve.tools.bulklib.sink import ErrorLog, PartStore, ResumeError, RowBuffer, output_schema
from trtserve.tools.bulklib.source import (
    Row,
    RowEncoder,
    count_rows,
    detect_format,
    open_batches,
    parse_input_columns,
    stack_rows,
)
from trtserve.tools.bulklib.summary import RETRY_CODES, LatencySample, Summary

log = logging.getLogger("trtserve.bulk")

MESSAGE_ROWS = 64
"""The most rows of a message by default: enough that per-message work is a small share of a
row's, few enough that the dispatcher can interleave other callers' rows (a model whose cap the
server learns reports its hard limit, up to 1024, as ``max_batch_size``)."""


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
    long_text: str = "truncate"
    errors: Path | None = None
    ordered: bool = False
    fail_on_error: bool = False
    max_inflight: int = 8
    rows_per_message: int | None = None
    flush_rows: int = 2048
    flush_seconds: float = 30.0
    max_retries: int = 8
    stall_timeout: float = 300.0
    down_timeout: float = 60.0
    progress: bool = True
    read_batch_rows: int = 4096
    credentials: Credentials = field(default_factory=Credentials)

    @property
    def errors_path(self) -> Path:
        return self.errors or self.output.with_name(self.output.name + ".errors.jsonl")


class BulkJob:
    """One run of a bulk job (see the module docstring). ``await job.run()`` → :class:`Summary`."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.summary = Summary()
        self.latencies = LatencySample()
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
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._fail, BulkError(f"interrupted by {signal.Signals(sig).name}"))
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
            stats_before = await model_statistics(self.endpoints, cfg.model)
            for ep in self.endpoints:
                ep.task = self._spawn(ep.serve(functools.partial(self._on_response, ep),
                                               functools.partial(self._stream_broken, ep)))
            tasks += [self._spawn(self._read()), self._spawn(self._schedule()), self._spawn(self._watchdog()),
                      self._spawn(self._timed_flush())]
            try:
                await self.done
            except BaseException:
                await self._flush()  # keep what was answered: a re-run starts from it
                raise
            await self._flush()
            self.errors.close()
            stats_after = await model_statistics(self.endpoints, cfg.model)
            if not self.summary.pending:  # the final file is written once every row is done
                self.summary.output_rows = await asyncio.to_thread(self.store.finalize, cfg.id_column)
            self._finish_summary(start, stats_before, stats_after)
            return self.summary
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
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
        """Learn the model from the servers, and size the messages and the row window for it.

        Raises:
            BulkError: the model is unknown, or no endpoint answered within ``stall_timeout``.
        """
        cfg = self.cfg
        info = await discover(self.endpoints, cfg.model, cfg.stall_timeout)
        self.batched = info.batched
        self.inputs, self.outputs = info.inputs, info.outputs
        self.mapping = parse_input_columns(list(cfg.input_columns), [t.name for t in self.inputs])
        per_message = cfg.rows_per_message or min(max(info.max_batch_size, 1), MESSAGE_ROWS)
        self.rows_per_message = per_message if info.batched else 1
        self.window = max(2 * len(self.endpoints) * cfg.max_inflight * self.rows_per_message, 4 * self.rows_per_message)
        log.info("model %s version %s: inputs %s, outputs %s, %d rows per message", cfg.model, info.version,
                 [t.name for t in self.inputs], [t.name for t in self.outputs], self.rows_per_message)

    def _finish_summary(self, start: float, before: Counts, after: Counts) -> None:
        s = self.summary
        s.wall_s = time.perf_counter() - start
        s.rows_per_s = s.rows_written / s.wall_s if s.wall_s > 0 else 0.0
        s.latency_p50_ms, s.latency_p99_ms = self.latencies.percentiles_ms()
        s.mean_batch_size = mean_batch_size(before, after)
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
                            log.warning("input id %r appears again (input row %d); later copies are skipped",
                                        key, row_seq)
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
        self.schema = output_schema(cfg.id_column, id_type, self.outputs, cfg.model)
        existing = self.store.existing_schema()
        if existing is not None and not existing.remove_metadata().equals(self.schema.remove_metadata()):
            raise ResumeError(f"{cfg.output} (or its parts) has schema {existing.remove_metadata()}, but this job "
                              f"writes {self.schema.remove_metadata()}; choose another --output")
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
            ep = await pick(self.endpoints, self.cfg.max_inflight, self.capacity_changed)
            request_id = f"{next(self.ids)}"
            ep.send(request_id, msg, build_request(self.cfg.model, msg.inputs, request_id=request_id,
                                                     long_text=self.cfg.long_text))

    def _stream_broken(self, ep: Endpoint, exc: BaseException | None) -> None:
        if isinstance(exc, grpc.aio.AioRpcError):
            code, why = exc.code().name, f"{exc.code().name}: {exc.details()}"
            if code == "UNIMPLEMENTED":
                self._fail(BulkError(f"{ep.url} does not serve ModelStreamInfer: {exc.details()}"))
        elif exc is None:
            code, why = "EOF", "the server ended the stream"
        else:
            code, why = type(exc).__name__, repr(exc)
        lost = ep.drop_inflight()
        delay = ep.fail(why)
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
        msg = ep.answered(response.id)
        if msg is None:
            return  # not ours (any more)
        self.capacity_changed.set()
        self.latencies.add(time.perf_counter() - msg.sent_at)
        self.summary.messages += 1
        if message.error_message:
            code = response.parameters["error_code"].string_param if "error_code" in response.parameters else "UNKNOWN"
            self._on_message_error(ep, msg, code, message.error_message)
            return
        if ep.failures:
            log.info("%s answers again", ep.url)
            ep.recovered()
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
                ep.fail(f"{code}: {text}")
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
        cfg = self.cfg
        tick = min(5.0, cfg.stall_timeout / 4, *((cfg.down_timeout / 4,) if cfg.down_timeout > 0 else ()))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            idle = now - self.last_progress
            if self.unresolved and idle > cfg.stall_timeout:
                states = "; ".join(f"{ep.url}: {ep.last_error or 'no error'}" for ep in self.endpoints)
                raise BulkError(f"no row was answered for {idle:.0f} s ({states}); committed rows are kept, "
                                "re-run the same command to finish")
            down = {ep.url: (now - ep.down_since, ep.last_error) for ep in self.endpoints if ep.down_since is not None}
            if not (down and self.unresolved):
                continue
            states = "; ".join(f"{url} down for {seconds:.0f} s ({why})" for url, (seconds, why) in down.items())
            log.warning("%s; %d row(s) pending", states, self.unresolved)
            if len(down) == len(self.endpoints) and cfg.down_timeout > 0 and \
                    min(seconds for seconds, _ in down.values()) > cfg.down_timeout:
                raise BulkError(f"every endpoint has been down for more than {cfg.down_timeout:g} s (--down-timeout) "
                                f"({states}); the rows answered are committed, re-run the same command to resume")

    def _open_progress(self, total: int | None) -> None:
        if not self.cfg.progress or not sys.stderr.isatty():
            return
        from tqdm import tqdm

        self.progress = tqdm(total=total, unit="row", desc=f"bulk {self.cfg.model}", dynamic_ncols=True, smoothing=0.05)
