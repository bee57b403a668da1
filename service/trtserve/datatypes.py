"""KServe v2 tensor datatypes: names, numpy dtypes, sizes and the typed-contents fields.

The table follows the Open Inference Protocol's tensor datatype list (BOOL, UINT8..UINT64,
INT8..INT64, FP16, BF16, FP32, FP64, BYTES) and the ``InferTensorContents`` field each one uses
when sent typed rather than raw. FP16 and BF16 have no typed field: they travel only as raw
little-endian bytes. BF16 is held as
``ml_dtypes.bfloat16`` so raw bytes round-trip bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

Tensors = dict[str, np.ndarray]
"""Tensor name → array: a request's inputs or outputs, or one segment of engine rows (rows on
axis 0). The one name for this type on both sides of the contract."""


@dataclass(frozen=True)
class Datatype:
    """One KServe datatype.

    Attributes:
        name: the protocol string, e.g. ``"FP32"``.
        config_name: the ``DataType`` enum name in ``config.pbtxt``, e.g. ``"TYPE_FP32"``
            (BYTES is ``TYPE_STRING`` there, as in Triton).
        numpy: the numpy dtype of a decoded tensor (``object`` of ``bytes`` for BYTES).
        itemsize: bytes per element in raw form; 0 for BYTES (length-prefixed, variable).
        contents_field: the ``InferTensorContents`` field for typed data, or ``None`` when
            the type can only travel raw.
    """

    name: str
    config_name: str
    numpy: np.dtype
    itemsize: int
    contents_field: str | None


def _dt(name: str, config: str, dtype: object, field: str | None) -> Datatype:
    np_dtype = np.dtype(dtype)
    itemsize = 0 if np_dtype == np.dtype(object) else np_dtype.itemsize
    return Datatype(name, config, np_dtype, itemsize, field)


DATATYPES: dict[str, Datatype] = {
    d.name: d
    for d in (
        _dt("BOOL", "TYPE_BOOL", np.bool_, "bool_contents"),
        _dt("UINT8", "TYPE_UINT8", np.uint8, "uint_contents"),
        _dt("UINT16", "TYPE_UINT16", np.uint16, "uint_contents"),
        _dt("UINT32", "TYPE_UINT32", np.uint32, "uint_contents"),
        _dt("UINT64", "TYPE_UINT64", np.uint64, "uint64_contents"),
        _dt("INT8", "TYPE_INT8", np.int8, "int_contents"),
        _dt("INT16", "TYPE_INT16", np.int16, "int_contents"),
        _dt("INT32", "TYPE_INT32", np.int32, "int_contents"),
        _dt("INT64", "TYPE_INT64", np.int64, "int64_contents"),
        _dt("FP16", "TYPE_FP16", np.float16, None),
        _dt("BF16", "TYPE_BF16", ml_dtypes.bfloat16, None),
        _dt("FP32", "TYPE_FP32", np.float32, "fp32_contents"),
        _dt("FP64", "TYPE_FP64", np.float64, "fp64_contents"),
        _dt("BYTES", "TYPE_STRING", object, "bytes_contents"),
    )
}

BY_CONFIG_NAME: dict[str, Datatype] = {d.config_name: d for d in DATATYPES.values()}
BY_NUMPY: dict[np.dtype, Datatype] = {d.numpy: d for d in DATATYPES.values()}


def from_numpy(dtype: np.dtype) -> Datatype:
    """The KServe datatype of a numpy dtype.

    Raises:
        KeyError: numpy dtype with no KServe equivalent (e.g. complex64, str_).
    """
    dtype = np.dtype(dtype)
    if dtype.kind in ("U", "S"):
        return DATATYPES["BYTES"]
    return BY_NUMPY[dtype]
