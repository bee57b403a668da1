"""The bulk job's output: a Parquet file written through committed part files, so a job killed at
any moment leaves only readable files and a re-run finishes it, every id exactly once.

Layout, for ``--output out.parquet``::

    out.parquet.parts/part-000000.parquet   one committed flush each (one row group)
    out.parquet.parts/part-000001.parquet
    out.parquet.parts/*.tmp                 a flush being written (ignored, removed on start)
    out.parquet.errors.jsonl                rows refused for good (``--errors``; one JSON a line)
    out.parquet                             the final file, written once every row is answered

A flush writes ``part-N.parquet.tmp`` with :class:`pyarrow.parquet.ParquetWriter`, fsyncs it and
renames it to ``part-N.parquet`` (``os.replace`` is atomic): a part either exists whole or not at
all, so the parts are the checkpoint. At the end the job streams the previous ``out.parquet`` (if
any) and the parts, a row group at a time, into ``out.parquet.tmp``, dropping any id already
written, renames that over ``out.parquet`` and deletes the parts. A re-run reads only the id
columns of ``out.parquet`` and of the parts, plus the ids of the errors file, and skips them.
A crash during the final merge leaves the old output and all parts, and the merge's de-duplication
makes a repeated merge harmless.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trtserve.spec import TensorSpec

MODEL_KEY = b"trtserve.model"


def arrow_type(tensor: TensorSpec) -> pa.DataType:
    """The output file's column type for a model output (dims without the batch): a scalar for
    dims () or (1,), else a list (fixed size unless a dim is variable); BYTES as binary."""
    value = pa.binary() if tensor.datatype.name == "BYTES" else pa.from_numpy_dtype(tensor.datatype.numpy)
    if tensor.dims == (1,) or tensor.dims == ():
        return value
    if -1 in tensor.dims:
        return pa.list_(value)
    return pa.list_(value, int(np.prod(tensor.dims)))


def to_arrow(tensor: TensorSpec, arr: np.ndarray) -> pa.Array:
    """Rows of ``arr`` ([rows, *dims]) as the output's column (each row flattened)."""
    rows = arr.shape[0]
    t = arrow_type(tensor)
    if tensor.datatype.name == "BYTES":
        if not pa.types.is_list(t) and not pa.types.is_fixed_size_list(t):
            return pa.array(list(arr.reshape(rows)), type=t)
        return pa.array([list(r.reshape(-1)) for r in arr], type=t)
    if not pa.types.is_list(t) and not pa.types.is_fixed_size_list(t):
        return pa.array(arr.reshape(rows))
    flat = np.ascontiguousarray(arr).reshape(rows, -1)
    if pa.types.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
    offsets = np.arange(rows + 1, dtype=np.int32) * flat.shape[1]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.reshape(-1)))


def output_schema(id_column: str, id_type: pa.DataType, outputs: Sequence[TensorSpec], model: str) -> pa.Schema:
    """The output file's schema: the id, then each output; the model name in the metadata."""
    names = [o.name for o in outputs]
    if id_column in names:
        raise ValueError(f"the id column '{id_column}' has the name of a model output; rename it")
    fields = [pa.field(id_column, id_type, nullable=False)] + [pa.field(o.name, arrow_type(o)) for o in outputs]
    return pa.schema(fields, metadata={MODEL_KEY: model.encode()})


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ResumeError(ValueError):
    """The existing output does not belong to this job (another model or id column)."""


class PartStore:
    """Committed part files next to ``output`` and the final merge (see the module docstring)."""

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.parts_dir = self.output.with_name(self.output.name + ".parts")
        self.schema: pa.Schema | None = None
        self.next_index = 0

    def parts(self) -> list[Path]:
        return sorted(self.parts_dir.glob("part-*.parquet")) if self.parts_dir.is_dir() else []

    def existing_schema(self) -> pa.Schema | None:
        """The schema of the previous output or of its first part (``None`` if neither exists)."""
        for path in ([self.output] if self.output.exists() else []) + self.parts():
            return pq.read_schema(path)
        return None

    def committed_ids(self, id_column: str, model: str) -> set:
        """Ids of every committed row (previous output and parts); removes stale ``*.tmp`` files.

        Raises:
            ResumeError: the existing files hold another model's output or lack ``id_column``.
        """
        leftovers = self.parts_dir.glob("*.tmp") if self.parts_dir.is_dir() else []
        for tmp in [self.output.with_name(self.output.name + ".tmp"), *leftovers]:
            tmp.unlink(missing_ok=True)
        ids: set = set()
        files = ([self.output] if self.output.exists() else []) + self.parts()
        for path in files:
            pf = pq.ParquetFile(path)
            meta = pf.schema_arrow.metadata or {}
            if MODEL_KEY in meta and meta[MODEL_KEY].decode() != model:
                raise ResumeError(
                    f"{path} holds output of model '{meta[MODEL_KEY].decode()}', not '{model}'; choose another --output"
                )
            if id_column not in pf.schema_arrow.names:
                raise ResumeError(f"{path} has no id column '{id_column}'; choose another --output")
            for batch in pf.iter_batches(columns=[id_column]):
                ids.update(batch.column(0).to_pylist())
        indices = [int(p.stem.split("-")[1]) for p in self.parts()]
        self.next_index = max(indices, default=-1) + 1
        return ids

    def write_part(self, table: pa.Table) -> Path:
        """Commit ``table`` as the next part file (atomically: tmp, fsync, rename)."""
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        path = self.parts_dir / f"part-{self.next_index:06d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        self.next_index += 1
        with open(tmp, "wb") as f:
            pq.write_table(table, f, row_group_size=max(table.num_rows, 1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.parts_dir)
        return path

    def finalize(self, id_column: str) -> int:
        """Merge the previous output and the parts into ``output`` (de-duplicated by id), then
        delete the parts. Returns the rows of the final file. Memory: one row group at a time."""
        parts = self.parts()
        if not parts:
            if self.parts_dir.is_dir():
                shutil.rmtree(self.parts_dir)
            return pq.ParquetFile(self.output).metadata.num_rows if self.output.exists() else 0
        sources = ([self.output] if self.output.exists() else []) + parts
        schema = pq.read_schema(sources[-1])
        tmp = self.output.with_name(self.output.name + ".tmp")
        seen: set = set()
        rows = 0
        with open(tmp, "wb") as f:
            writer = pq.ParquetWriter(f, schema)
            for path in sources:
                pf = pq.ParquetFile(path)
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g)
                    keep = []
                    for i, key in enumerate(table.column(id_column).to_pylist()):
                        if key not in seen:
                            seen.add(key)
                            keep.append(i)
                    if len(keep) != table.num_rows:
                        table = table.take(keep)
                    if table.num_rows:
                        writer.write_table(table.cast(schema), row_group_size=table.num_rows)
                        rows += table.num_rows
            writer.close()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.output)
        _fsync_dir(self.output.parent)
        shutil.rmtree(self.parts_dir)
        return rows


class ErrorLog:
    """The errors file: one JSON object per refused row, appended and flushed as it happens.

    A row in it is final: a re-run skips its id (delete the file, or its lines, to try again).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.file: TextIO | None = None
        self.written = 0

    def ids(self) -> tuple[set, int]:
        """(ids already in the file, lines); a torn last line from a crash is ignored."""
        ids: set = set()
        lines = 0
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    lines += 1
                    if record.get("id") is not None:
                        ids.add(record["id"])
        return ids, lines

    def write(self, record: dict) -> None:
        if self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")
            if self.file.tell() and not self._ends_with_newline():
                self.file.write("\n")  # a torn last line from a crash stays on its own line
        f = self.file
        f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        f.flush()
        self.written += 1

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def close(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None


class RowBuffer:
    """Answered rows collected in memory until the next flush (one part, one row group)."""

    def __init__(self, id_type: pa.DataType, outputs: Sequence[TensorSpec], schema: pa.Schema) -> None:
        self.id_type = id_type
        self.outputs = outputs
        self.schema = schema
        self.ids: list = []
        self.chunks: dict[str, list[np.ndarray]] = {o.name: [] for o in outputs}
        self.rows = 0

    def add(self, ids: Iterable, outputs: dict[str, np.ndarray]) -> None:
        ids = list(ids)
        self.ids.extend(ids)
        for o in self.outputs:
            self.chunks[o.name].append(outputs[o.name])
        self.rows += len(ids)

    def take(self) -> pa.Table:
        """The buffered rows as a table; empties the buffer."""
        columns = [pa.array(self.ids, type=self.id_type)]
        for o in self.outputs:
            columns.append(to_arrow(o, np.concatenate(self.chunks[o.name])))
        table = pa.Table.from_arrays(columns, schema=self.schema)
        self.ids = []
        self.chunks = {o.name: [] for o in self.outputs}
        self.rows = 0
        return table
