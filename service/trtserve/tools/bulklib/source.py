"""Reading a bulk job's input with pyarrow, in record batches (never the whole file), and turning
each row's columns into the model's input tensors.

Formats (from the file name, or ``--input-format``): JSON Lines (``.jsonl``, ``.ndjson``,
``.json``, optionally ``.gz``/``.bz2``/``.zst``), CSV (``.csv``, optionally compressed) and
Parquet (``.parquet``, ``.pq``). Text columns that feed a BYTES input are read as raw bytes
where the format allows it (CSV, Parquet), so a row that is not valid UTF-8 reaches the server
and is refused there, alone, with the server's message, instead of failing the whole read.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from trtserve.spec import TensorSpec

FORMATS = ("jsonl", "csv", "parquet")
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
READ_BLOCK_BYTES = 1 << 20


class InputError(ValueError):
    """The input file or the column mapping cannot be used; the message says why."""


def detect_format(path: Path, explicit: str | None = None) -> str:
    """``jsonl``, ``csv`` or ``parquet`` from ``explicit`` or the file name.

    Raises:
        InputError: an unknown extension and no explicit format.
    """
    if explicit:
        return explicit
    suffixes = [s.lower() for s in Path(path).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSED:
        suffixes.pop()
    ext = suffixes[-1] if suffixes else ""
    for fmt, exts in (("jsonl", (".jsonl", ".ndjson", ".json")), ("csv", (".csv",)), ("parquet", (".parquet", ".pq"))):
        if ext in exts:
            return fmt
    raise InputError(f"cannot tell the format of {path} from its name; pass --input-format {{{','.join(FORMATS)}}}")


def open_batches(path: Path, fmt: str, columns: Sequence[str], binary_columns: Sequence[str] = (),
                 batch_rows: int = 4096, string_columns: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    """Record batches holding only ``columns`` (in that order), streamed from ``path``.

    ``binary_columns`` are read as raw bytes and ``string_columns`` as text (an id such as
    ``00042`` stays as written) where the format allows it: CSV. Parquet and JSON keep their
    own types.

    Raises:
        InputError: the file lacks one of ``columns``.
        pyarrow.ArrowInvalid: the file is malformed (the message names the place).
    """
    columns = list(dict.fromkeys(columns))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        _check_columns(path, pf.schema_arrow.names, columns)
        yield from pf.iter_batches(batch_size=batch_rows, columns=columns)
        return
    if fmt == "csv":
        import pyarrow.csv as pcsv

        types = {c: pa.string() for c in string_columns}
        types.update({c: pa.binary() for c in binary_columns})
        reader = pcsv.open_csv(
            str(path),
            read_options=pcsv.ReadOptions(block_size=READ_BLOCK_BYTES),
            convert_options=pcsv.ConvertOptions(
                include_columns=columns,
                column_types=types,
                strings_can_be_null=False,
            ),
        )
        _check_columns(path, reader.schema.names, columns)
        for batch in reader:
            yield batch.select(columns)
        return
    if fmt == "jsonl":
        import pyarrow.json as pjson

        reader = pjson.open_json(str(path), read_options=pjson.ReadOptions(block_size=READ_BLOCK_BYTES))
        _check_columns(path, reader.schema.names, columns)
        for batch in reader:
            yield batch.select(columns)
        return
    raise InputError(f"unknown input format '{fmt}'; use one of {', '.join(FORMATS)}")


def _check_columns(path: Path, have: Sequence[str], want: Sequence[str]) -> None:
    missing = [c for c in want if c not in have]
    if missing:
        raise InputError(f"{path} has no column {', '.join(repr(c) for c in missing)}; its columns are {list(have)}")


def count_rows(path: Path, fmt: str) -> int | None:
    """Rows in the input for the progress bar: Parquet metadata, or a streamed line count for
    JSONL/CSV (CSV: minus the header; a quoted field spanning lines is counted twice)."""
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        opener = gzip.open if str(path).endswith(".gz") else open
        if str(path).endswith(_COMPRESSED) and not str(path).endswith(".gz"):
            return None
        lines = 0
        last = b"\n"
        with opener(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        lines += last != b"\n"
        return lines - 1 if fmt == "csv" else lines
    except OSError:
        return None


# -- row → tensors ------------------------------------------------------------------------------


def parse_input_columns(values: Sequence[str], model_inputs: Sequence[str]) -> dict[str, str]:
    """Model input name → column name, from ``--input-column`` values ``COL`` (a model with one
    input) or ``INPUT=COL``.

    Raises:
        InputError: a bare column for a multi-input model, an unknown input, or an input left
            without a column.
    """
    mapping: dict[str, str] = {}
    for value in values:
        if "=" in value:
            name, column = value.split("=", 1)
            if name not in model_inputs:
                raise InputError(
                    f"--input-column {value}: the model has no input '{name}'; its inputs are {list(model_inputs)}"
                )
        else:
            if len(model_inputs) != 1:
                raise InputError(
                    f"--input-column {value}: the model has inputs {list(model_inputs)}; map each with INPUT=COLUMN"
                )
            name, column = model_inputs[0], value
        mapping[name] = column
    missing = [n for n in model_inputs if n not in mapping]
    if missing:
        raise InputError(f"no --input-column for the model's input(s) {missing}; map each with INPUT=COLUMN")
    return mapping


class RowError(Exception):
    """A row that cannot be turned into tensors on the client (a null id or value)."""


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _shape(count: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    """``dims`` with its -1 filled in for ``count`` elements, or ``(count,)`` when they do not
    fit (the server then refuses the row with its shape message)."""
    known = math.prod(d for d in dims if d != -1)
    free = sum(d == -1 for d in dims)
    if free == 0:
        return dims if count == known else (count,)
    if free == 1 and known and count % known == 0:
        return tuple(count // known if d == -1 else d for d in dims)
    return (count,)


class ColumnEncoder:
    """Per-row tensors of one input from one Arrow column.

    The column's own type decides what goes on the wire: text/binary → BYTES; numbers → the
    model's dtype when the model input is numeric (the cast a user expects: JSON numbers come as
    float64), else their own dtype; lists of numbers → one tensor per row shaped to the input's
    dims. A mismatch (text for a numeric input, a list of the wrong length) is sent as it is, so
    the server refuses it with its own message.
    """

    def __init__(self, spec: TensorSpec, column: str) -> None:
        self.spec = spec
        self.column = column

    def wire_dtype(self, values: pa.DataType) -> np.dtype:
        if _is_text(values):
            return np.dtype(object)
        if _is_number(values):
            if self.spec.datatype.numpy != np.dtype(object) and self.spec.datatype.numpy.kind in "biuf":
                return self.spec.datatype.numpy
            return values.to_pandas_dtype() if not pa.types.is_boolean(values) else np.dtype(bool)
        return np.dtype(object)

    def rows(self, arr: pa.Array) -> list[np.ndarray | None]:
        """One array per row (``None`` for a null)."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        t = arr.type
        dims = self.spec.dims
        if _is_text(t) or _is_number(t):
            dtype = self.wire_dtype(t)
            if dtype == np.dtype(object):
                values = [v.encode() if isinstance(v, str) else v for v in arr.to_pylist()]
                flat = np.empty(len(values), dtype=object)
                flat[:] = values
            else:
                flat = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
            shape = _shape(1, dims)
            return [flat[i : i + 1].reshape(shape) if valid[i] else None for i in range(len(arr))]
        if _is_list(t) and (_is_number(t.value_type) or _is_text(t.value_type)):
            dtype = self.wire_dtype(t.value_type)
            values = arr.values if not pa.types.is_fixed_size_list(t) else arr.flatten()
            if pa.types.is_fixed_size_list(t):
                offsets = np.arange(len(arr) + 1, dtype=np.int64) * t.list_size
            else:
                offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
                base = offsets[0]
                values = values.slice(base, offsets[-1] - base)
                offsets = offsets - base
            if dtype == np.dtype(object):
                flat = np.empty(len(values), dtype=object)
                flat[:] = [v.encode() if isinstance(v, str) else v for v in values.to_pylist()]
            else:
                flat = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
            out: list[np.ndarray | None] = []
            for i in range(len(arr)):
                if not valid[i]:
                    out.append(None)
                    continue
                row = flat[offsets[i] : offsets[i + 1]]
                out.append(row.reshape(_shape(len(row), dims)))
            return out
        # anything else (nested lists, structs): the slow, general path
        rows: list[np.ndarray | None] = []
        for v in arr.to_pylist():
            if v is None:
                rows.append(None)
                continue
            a = np.asarray(v)
            if a.dtype.kind in "biuf" and self.spec.datatype.numpy.kind in "biuf":
                a = a.astype(self.spec.datatype.numpy)
            elif a.dtype.kind in "US":
                a = np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(a)
            rows.append(a.reshape(_shape(a.size, dims)) if a.ndim <= 1 else a)
        return rows


@dataclass
class Row:
    """One input row ready to send: its position in the input, id, and per-input tensors."""

    seq: int
    id: object
    tensors: dict[str, np.ndarray]

    def signature(self) -> tuple:
        return tuple((name, t.shape, t.dtype.str) for name, t in self.tensors.items())


class RowEncoder:
    """Rows of record batches → :class:`Row` (or a client-side error per row).

    Args:
        specs: the model's inputs.
        mapping: model input name → column name.
        id_column: the column holding each row's id.
    """

    def __init__(self, specs: Sequence[TensorSpec], mapping: dict[str, str], id_column: str) -> None:
        self.encoders = [ColumnEncoder(s, mapping[s.name]) for s in specs]
        self.id_column = id_column

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys([self.id_column, *(e.column for e in self.encoders)]))

    def binary_columns(self) -> list[str]:
        """Columns to read as raw bytes: those feeding a BYTES input."""
        return [e.column for e in self.encoders if e.spec.datatype.name == "BYTES"]

    def encode(self, batch: pa.RecordBatch, first_seq: int) -> list[tuple[int, object, Row | str]]:
        """(seq, id, Row or an error message) for each row of ``batch``."""
        ids = batch.column(self.id_column).to_pylist()
        per_input = [(e, e.rows(batch.column(e.column))) for e in self.encoders]
        out: list[tuple[int, object, Row | str]] = []
        for i, key in enumerate(ids):
            seq = first_seq + i
            if key is None:
                out.append((seq, None, f"the id column '{self.id_column}' is null in input row {seq}"))
                continue
            tensors: dict[str, np.ndarray] = {}
            error = ""
            for enc, rows in per_input:
                value = rows[i]
                if value is None:
                    error = f"column '{enc.column}' (input '{enc.spec.name}') is null"
                    break
                tensors[enc.spec.name] = value
            out.append((seq, key, error or Row(seq, key, tensors)))
        return out


def stack_rows(rows: Sequence[Row], batched: bool) -> dict[str, np.ndarray]:
    """The request tensors of rows that share one signature (batch on axis 0 if ``batched``)."""
    if not batched:
        assert len(rows) == 1
        return dict(rows[0].tensors)
    return {name: np.stack([r.tensors[name] for r in rows]) for name in rows[0].tensors}
