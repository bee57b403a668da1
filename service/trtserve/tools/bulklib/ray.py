"""Bulk inference on Ray Data: the same model, hosted in-process by Ray actors (``pip install 'trtserve[ray]'``).

:class:`TrtserveModel` is a callable class for ``Dataset.map_batches``: each actor loads one model
of a trtserve repository (engine + batching dispatcher + handler, exactly as ``trtserve serve``
runs it) on a background asyncio loop, validates every request with the server's own codec and
submits the rows of a Ray batch as concurrent requests of up to ``max_batch_size`` rows, so the
dispatcher batches them as a server would. A request refused as a whole (one bad row) is re-run
row by row, so only the bad row fails; its error goes in the ``trtserve_error_code`` /
``trtserve_error`` columns (null for good rows), with the server's message.

On an existing cluster::

    import ray, trtserve.ray
    ray.init(address="auto")
    ds = ray.data.read_json("s3://bucket/corpus/", lines=True)
    out = trtserve.ray.embed_dataset(ds, "/shared/engines", "minilm", input_columns=["text"],
                                 actors=8, cpus_per_actor=4)
    out.write_parquet("s3://bucket/embeddings/")

The repository directory must exist at that path on every node (a shared filesystem, or ship
it with ``ray.init(runtime_env={"working_dir": ...})`` and a relative path).

``trtserve bulk --ray`` (:func:`run_bulk`) does the same from the command line and writes the
driver-side resumable Parquet output of :mod:`trtserve.tools.bulklib.sink` (same file, same
resume and exactly-once rules as the server path).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trtserve.spec import TensorSpec
from trtserve.tools.bulklib.sink import to_arrow
from trtserve.tools.bulklib.source import Row, RowEncoder, parse_input_columns, stack_rows

ERROR_CODE_COLUMN = "trtserve_error_code"
ERROR_COLUMN = "trtserve_error"


def model_io(model_repository: Path, model: str) -> tuple[Any, list[TensorSpec], list[TensorSpec]]:
    """(spec, inputs, outputs) of a repository model, read from its config (no engine loaded)."""
    from trtserve.repository import load_spec

    spec = load_spec(Path(model_repository) / model)
    inputs, outputs = list(spec.inputs), list(spec.outputs)
    return spec, inputs, outputs


class TrtserveModel:
    """``map_batches`` callable: one trtserve model served in-process, pyarrow batches in and out.

    Args:
        model_repository: the repository directory (``engines/``), readable on the actor's node.
        model: the model to load.
        input_columns: ``--input-column`` values: ``COLUMN`` or ``INPUT=COLUMN``.
        id_column: the id column, passed through.
        intra_op_threads: ONNX Runtime threads (0: one per core of the node).
        cpu_workers: threads for the handler's pre/post-processing.
        long_text: ``"truncate"`` or ``"chunk"`` (each long text embedded whole), the requests'
            ``long_text`` parameter.

    Raises:
        RuntimeError: the model did not load (with the reason).
    """

    def __init__(self, model_repository: str, model: str, input_columns: Sequence[str] = ("text",),
                 id_column: str = "id", intra_op_threads: int = 0, cpu_workers: int = 2,
                 long_text: str = "truncate") -> None:
        from trtserve import runtimes
        from trtserve.clock import MonotonicClock
        from trtserve.engine.registry import ModelRegistry
        from trtserve.serving.inprocess import local_model

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="trtserve-loop", daemon=True)
        self.thread.start()
        self.pool = ThreadPoolExecutor(cpu_workers, thread_name_prefix="trtserve-cpu")
        options = runtimes.RuntimeOptions(intra_op_threads=intra_op_threads)
        self.registry = ModelRegistry(Path(model_repository), clock=MonotonicClock(),
                                     backend_factory=partial(runtimes.create, options=options))
        entry = self._run(self.registry.load(model))
        if entry.served is None:
            raise RuntimeError(f"model '{model}' did not load from {model_repository}: {entry.reason}")
        self.served = local_model(self.registry, model, self.pool)
        self.spec, inputs, self.outputs = model_io(Path(model_repository), model)
        mapping = parse_input_columns(list(input_columns), [t.name for t in inputs])
        self.encoder = RowEncoder(inputs, mapping, id_column)
        self.id_column = id_column
        self.long_text = long_text
        self.rows_per_request = max(self.spec.policy.max_batch_size, 1)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __call__(self, batch: pa.Table) -> pa.Table:
        encoded = self.encoder.encode(batch, 0)
        groups: list[list[Row]] = []
        for _, _, row in encoded:
            if isinstance(row, Row):
                if groups and len(groups[-1]) < self.rows_per_request and groups[-1][0].signature() == row.signature():
                    groups[-1].append(row)
                else:
                    groups.append([row])
        results: dict[int, dict[str, np.ndarray] | tuple[str, str]] = {}
        for rows, result in self._run(self._infer_all(groups)):
            if isinstance(result, tuple):
                results[rows[0].seq] = result
            else:
                for i, row in enumerate(rows):
                    results[row.seq] = {k: v[i] for k, v in result.items()}
        return self._table(batch, encoded, results)

    async def _infer_all(self, groups: list[list[Row]]) -> list:
        done = await asyncio.gather(*(self._infer_group(g) for g in groups))
        return [item for part in done for item in part]

    async def _infer_group(self, rows: list[Row]) -> list:
        from trtserve.client import build_request
        from trtserve.errors import TrtServeError
        from trtserve.frontend.grpc.status import status_for
        from trtserve.protocol import codec

        try:
            request = build_request(self.spec.name, stack_rows(rows, self.spec.batched))
            inputs, _ = codec.decode_inputs(request, self.spec)
            return [(rows, (await self.served.infer(inputs, long_text=self.long_text))[0])]
        except TrtServeError as exc:
            if len(rows) > 1:
                parts = await asyncio.gather(*(self._infer_group([r]) for r in rows))
                return [item for part in parts for item in part]
            return [(rows, (status_for(exc).name, str(exc)))]

    def _table(self, batch: pa.Table, encoded: list, results: dict) -> pa.Table:
        n = len(encoded)
        codes: list[str | None] = [None] * n
        texts: list[str | None] = [None] * n
        ok = np.zeros(n, dtype=bool)
        columns: dict[str, np.ndarray] = {}
        for o in self.outputs:
            shape = tuple(1 if d == -1 else d for d in o.dims)
            columns[o.name] = np.zeros((n, *shape), dtype=o.datatype.numpy)
        for i, (seq, _key, row) in enumerate(encoded):
            if isinstance(row, str):
                codes[i], texts[i] = "INVALID_ARGUMENT", row
                continue
            result = results[seq]
            if isinstance(result, tuple):
                codes[i], texts[i] = result
                continue
            ok[i] = True
            for o in self.outputs:
                columns[o.name][i] = result[o.name]
        arrays = [batch.column(self.id_column)]
        names = [self.id_column]
        valid = pa.array(ok)
        for o in self.outputs:
            arr = to_arrow(o, columns[o.name])
            arrays.append(pc.if_else(valid, arr, pa.nulls(n, arr.type)))
            names.append(o.name)
        arrays += [pa.array(codes, pa.string()), pa.array(texts, pa.string())]
        names += [ERROR_CODE_COLUMN, ERROR_COLUMN]
        return pa.Table.from_arrays(arrays, names=names)

    def __del__(self) -> None:
        try:
            self._run(self.registry.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.pool.shutdown(wait=False)
        except Exception:
            pass


def _drop_ids(batch: pa.Table, id_column: str, ids: pa.Array) -> pa.Table:
    return batch.filter(pc.invert(pc.is_in(batch.column(id_column), value_set=ids)))


def read_dataset(path: str | Path, fmt: str, columns: Sequence[str], binary_columns: Sequence[str] = (),
                 string_columns: Sequence[str] = ()) -> Any:
    """``ray.data.read_*`` of the input, keeping only ``columns`` (text read as bytes in CSV, as
    :func:`trtserve.tools.bulklib.source.open_batches` does)."""
    import ray.data

    columns = list(dict.fromkeys(columns))
    if fmt == "parquet":
        return ray.data.read_parquet(str(path), columns=columns)
    if fmt == "csv":
        import pyarrow.csv as pcsv

        types = {c: pa.string() for c in string_columns}
        types.update({c: pa.binary() for c in binary_columns})
        options = pcsv.ConvertOptions(include_columns=columns, column_types=types)
        ds = ray.data.read_csv(str(path), convert_options=options)
        return ds.select_columns(columns)
    return ray.data.read_json(str(path), lines=True).select_columns(columns)


def embed_dataset(ds: Any, model_repository: str | Path, model: str, *, input_columns: Sequence[str] = ("text",),
                  id_column: str = "id", actors: int = 1, cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0,
                  batch_rows: int = 256, intra_op_threads: int = 0, long_text: str = "truncate") -> Any:
    """``ds.map_batches`` with :class:`TrtserveModel` on a pool of ``actors`` actors.

    The result has ``id_column``, one column per model output (a fixed-size list per row; null
    for a refused row) and ``trtserve_error_code`` / ``trtserve_error`` (null for good rows).
    """
    import ray.data

    return ds.map_batches(
        TrtserveModel,
        fn_constructor_kwargs={
            "model_repository": str(Path(model_repository).resolve()),
            "model": model,
            "input_columns": list(input_columns),
            "id_column": id_column,
            "intra_op_threads": intra_op_threads,
            "long_text": long_text,
        },
        batch_size=batch_rows,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=cpus_per_actor,
        num_gpus=gpus_per_actor or None,
    )


LOCAL_ENV = {
    # Ray reads this when it is imported: with 0, a local node uses 127.0.0.1 for every
    # address (GCS, raylet, workers) instead of the machine's outward-facing IP.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def init_local(num_cpus: int = 2) -> None:
    """Start a local, single-node Ray whose connections all stay on 127.0.0.1 (no dashboard, no
    usage stats). Call it before anything imports ``ray``, or set :data:`LOCAL_ENV` yourself."""
    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray._private.ray_constants.ENABLE_RAY_CLUSTER:
        logging.getLogger(__name__).warning(
            "ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set: the local node may "
            "listen on this machine's network address, not only 127.0.0.1")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus,
             log_to_driver=False, configure_logging=True, logging_level=logging.WARNING)


def run_bulk(cfg: Any, args: Any) -> Any:
    """``trtserve bulk --ray``: read with Ray Data, run :class:`TrtserveModel` actors, write the
    resumable Parquet output on the driver. Returns a :class:`~trtserve.tools.bulklib.summary.Summary`."""
    if not args.ray_address:
        for key, value in LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    import ray

    from trtserve.tools.bulklib.sink import ErrorLog, PartStore, ResumeError, output_schema
    from trtserve.tools.bulklib.source import count_rows, detect_format
    from trtserve.tools.bulklib.summary import RETRY_CODES, Summary

    started = False
    if not ray.is_initialized():
        if args.ray_address:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=args.ray_address, log_to_driver=False)
        else:
            init_local(args.ray_num_cpus)
        started = True
    try:
        start = time.perf_counter()
        summary = Summary()
        repository = Path(args.model_repository)
        spec, inputs, outputs = model_io(repository, cfg.model)
        mapping = parse_input_columns(list(cfg.input_columns), [t.name for t in inputs])
        encoder = RowEncoder(inputs, mapping, cfg.id_column)
        fmt = detect_format(cfg.input, cfg.input_format)
        store = PartStore(cfg.output)
        errors = ErrorLog(cfg.errors_path)
        committed = store.committed_ids(cfg.id_column, cfg.model)
        error_ids, summary.errors_total = errors.ids()
        skip = committed | error_ids

        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = cfg.ordered
        ctx.enable_progress_bars = cfg.progress and sys.stderr.isatty()
        remote = "://" in str(args.input)
        source = args.input if remote else str(cfg.input.resolve())
        ds = read_dataset(source, fmt, encoder.columns, encoder.binary_columns(), [cfg.id_column])
        total = None if remote else count_rows(cfg.input, fmt)
        if skip:
            ds = ds.map_batches(_drop_ids, batch_format="pyarrow", batch_size=None,
                                fn_kwargs={"id_column": cfg.id_column, "ids": pa.array(list(skip))})
        ds = embed_dataset(ds, repository, cfg.model, input_columns=cfg.input_columns, id_column=cfg.id_column,
                           actors=args.ray_actors, cpus_per_actor=args.ray_cpus_per_actor,
                           gpus_per_actor=args.ray_gpus_per_actor, batch_rows=args.ray_batch_rows,
                           long_text=cfg.long_text)
        schema = None
        seen: set = set()
        pending: list[pa.Table] = []
        pending_rows = 0
        last_flush = time.monotonic()
        names = [cfg.id_column] + [o.name for o in outputs]
        for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            if schema is None:
                schema = output_schema(cfg.id_column, table.schema.field(cfg.id_column).type, outputs, cfg.model)
                existing = store.existing_schema()
                if existing is not None and not existing.remove_metadata().equals(schema.remove_metadata()):
                    raise ResumeError(f"{cfg.output} (or its parts) has another schema; choose another --output")
            ids = table.column(cfg.id_column).to_pylist()
            codes = table.column(ERROR_CODE_COLUMN).to_pylist()
            messages = table.column(ERROR_COLUMN).to_pylist()
            keep = []
            for i, key in enumerate(ids):
                if key is not None and key in seen:
                    summary.duplicates += 1
                    continue
                seen.add(key)
                if codes[i] in RETRY_CODES:  # transient (a full queue): left for a re-run, never final
                    summary.pending += 1
                    summary.pending_codes[codes[i]] = summary.pending_codes.get(codes[i], 0) + 1
                elif codes[i] is not None:
                    errors.write({"id": key, "code": codes[i], "message": messages[i], "endpoint": "ray"})
                    summary.errors += 1
                else:
                    keep.append(i)
            summary.rows_read += len(ids)
            if keep:
                good = table.select(names).take(keep).cast(schema)
                pending.append(good)
                pending_rows += good.num_rows
                summary.rows_written += good.num_rows
            if pending_rows >= cfg.flush_rows or (pending and time.monotonic() - last_flush > cfg.flush_seconds):
                store.write_part(pa.concat_tables(pending).combine_chunks())
                pending, pending_rows, last_flush = [], 0, time.monotonic()
        if pending:
            store.write_part(pa.concat_tables(pending).combine_chunks())
        errors.close()
        summary.skipped = (total - summary.rows_read) if total is not None and skip else 0
        summary.rows_read += summary.skipped
        if not summary.pending:  # the final file is written once every row is done
            summary.output_rows = store.finalize(cfg.id_column)
        summary.wall_s = time.perf_counter() - start
        summary.rows_per_s = summary.rows_written / summary.wall_s if summary.wall_s else 0.0
        summary.errors_total += summary.errors
        summary.per_endpoint = {f"ray ({args.ray_actors} actor(s))": summary.rows_written}
        return summary
    finally:
        if started:
            ray.shutdown()
