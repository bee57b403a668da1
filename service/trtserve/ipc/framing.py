"""Tensors as ZeroMQ frames: arrays travel as raw buffers, never pickled.

A sender hands ZeroMQ each array's own buffer (``copy=False``: frames above pyzmq's copy
threshold, 64 KiB, go without a copy) and a receiver views the frame as an array
(``np.frombuffer``, no copy). BYTES tensors (numpy object arrays) travel in the KServe raw
form: per element a 4-byte little-endian length, then the bytes.

A *layout* is one tuple per segment of ``(name, dtype, shape)`` per tensor, in frame order;
``dtype`` is numpy's ``dtype.str`` (``"<f4"``), the dtype's name where ``str`` does not
round-trip (``"bfloat16"``), or ``"BYTES"``. A *segment* is one engine-input (or output) name
→ array map with rows on axis 0; one request sends one or more (a handler may fan a request
out into several).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtserve.datatypes import DATATYPES, Tensors
from trtserve.protocol.codec import decode_raw, encode_bytes

Layout = tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...]
"""Per segment, ``(name, dtype, shape)`` per tensor, in frame order (see the module docstring)."""

BYTES = "BYTES"
_DTYPES: dict[str, np.dtype] = {}


def pack(segments: Sequence[Tensors]) -> tuple[Layout, list[Any]]:
    """The layout and the frames of ``segments`` (engine-input or output name → array with
    rows on axis 0, one dict per segment). Numeric arrays go as their own buffers (made
    C-contiguous first if they are not); object arrays as KServe raw BYTES."""
    layout: list[tuple[tuple[str, str, tuple[int, ...]], ...]] = []
    frames: list[Any] = []
    for segment in segments:
        entry = []
        for name, arr in segment.items():
            if arr.dtype.kind in "OSU":
                entry.append((name, BYTES, arr.shape))
                frames.append(encode_bytes(arr.reshape(-1)))
                continue
            dtype = arr.dtype.name if arr.dtype.kind == "V" else arr.dtype.str
            entry.append((name, dtype, arr.shape))
            # As bytes: the buffer protocol has no code for some dtypes (bfloat16).
            frames.append(np.ascontiguousarray(arr).reshape(-1).view(np.uint8) if arr.size else b"")
        layout.append(tuple(entry))
    return tuple(layout), frames


def unpack(layout: Layout, frames: Sequence[Any]) -> list[Tensors]:
    """The segments that :func:`pack` made: arrays viewing the frames (read-only, no copy
    for numeric types)."""
    out: list[Tensors] = []
    it = iter(frames)
    for entry in layout:
        segment: Tensors = {}
        for name, dtype, shape in entry:
            frame = next(it)
            data = frame.buffer if hasattr(frame, "buffer") else frame
            if dtype == BYTES:
                segment[name] = decode_raw(name, bytes(data), DATATYPES["BYTES"], shape)
            else:
                segment[name] = np.frombuffer(data, dtype=_dtype(dtype)).reshape(shape)
        out.append(segment)
    return out


def _dtype(text: str) -> np.dtype:
    dtype = _DTYPES.get(text)
    if dtype is None:
        dtype = _DTYPES[text] = np.dtype(text)  # "bfloat16" needs ml_dtypes, which datatypes imports
    return dtype
