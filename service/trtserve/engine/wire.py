"""The messages between front ends and the engine core, over ZeroMQ (pyzmq).

A front end holds one DEALER socket connected to the engine core's ROUTER socket (``ipc://``
in a private directory). A message is a multipart ZeroMQ message: one *header* frame (a small
tuple of plain values: strings, numbers, tuples, this package's frozen dataclasses, pickled)
followed by zero or more *tensor*
frames, each the raw bytes of one array. Arrays are never pickled: a sender hands ZeroMQ the
array's own buffer (``copy=False``: frames above pyzmq's copy threshold, 64 KiB, go without a
copy) and a receiver views the frame as an array (``np.frombuffer``, no copy). BYTES tensors
(numpy object arrays) travel in the KServe raw form: per element a 4-byte little-endian length
and the bytes (``../shared/notes/protocol.md`` b2).

Header kinds (first item of the header tuple):

=================  =========================  =============================================
kind               direction                  rest of the header, then frames
=================  =========================  =============================================
``hello``          front end → core           pid (the core watches it: a dead front end's
                                              requests leave the queue), front-end index
``infer``          front end → core           id, model, version, priority, timeout (s or
                                              None), gRPC deadline (monotonic s or inf),
                                              layout; frames: the tensors
``cancel``         front end → core           id
``records``        front end → core           requests in flight at that front end,
                                              (model, status, seconds, refusal reason or
                                              None, finished_late) per answered request,
                                              and model → requests refused on their
                                              deadline before crossing
``query``          front end → core           id, what, argument (see ``EngineCore``)
``table``          core → front end           loaded?, ready?, strict readiness?, the
                                              models: (name, state, reason, per served
                                              version its spec and serialized config);
                                              sent again whenever a model changes
``result``         core → front end           id, deadline, layout, the version that
                                              answered, model, its queue
                                              (``batching.drain.QueueHint`` as a header
                                              of its own: pickled once per refresh);
                                              frames: the outputs
``error``          core → front end           id, error class name, message, and (when the
                                              model is known) model, its queue
``reply``          core → front end           id, ok?, value (or error class name, message)
=================  =========================  =============================================

A *layout* is one tuple per segment of ``(name, dtype, shape)`` per tensor, in frame order;
``dtype`` is numpy's ``dtype.str`` (``"<f4"``), the dtype's name where ``str`` does not
round-trip (``"bfloat16"``), or ``"BYTES"``. Both processes are this package, started by the
same supervisor, and the socket directory is private to the user (mode 0700), so the header's
pickle carries no foreign input.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import errors
from .._proto.inference import model_config_pb2 as mc
from ..protocol.codec import decode_raw, encode_bytes
from ..protocol.datatypes import DATATYPES
from ..spec import ModelSpec

Segment = dict[str, np.ndarray]
Layout = tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...]

BYTES = "BYTES"
_DTYPES: dict[str, np.dtype] = {}


def header(*items: Any) -> bytes:
    """The header frame of a message: ``items`` pickled (plain values only)."""
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


def read_header(frame: Any) -> tuple[Any, ...]:
    """The items of a header frame (``bytes`` or a ``zmq.Frame``)."""
    return pickle.loads(frame.buffer if hasattr(frame, "buffer") else frame)


def pack(segments: Sequence[Segment]) -> tuple[Layout, list[Any]]:
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


def unpack(layout: Layout, frames: Sequence[Any]) -> list[Segment]:
    """The segments that :func:`pack` made: arrays viewing the frames (read-only, no copy
    for numeric types)."""
    out: list[Segment] = []
    it = iter(frames)
    for entry in layout:
        segment: Segment = {}
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


def spec_out(spec: ModelSpec) -> tuple[ModelSpec, bytes]:
    """A model spec as it crosses in a ``table`` message: its ``config`` message serialized
    (protobuf classes of generated modules do not pickle by reference)."""
    return dataclasses.replace(spec, config=None), spec.config.SerializeToString() if spec.config is not None else b""


def spec_in(spec: ModelSpec, config: bytes) -> ModelSpec:
    """The spec that :func:`spec_out` sent."""
    return dataclasses.replace(spec, config=mc.ModelConfig.FromString(config))


def error_of(name: str, message: str) -> errors.TrtServeError:
    """The trtserve error named ``name`` (a class of :mod:`trtserve.errors`) with ``message``;
    an unknown name becomes :class:`~trtserve.errors.BackendError` (INTERNAL)."""
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.TrtServeError)):
        cls = errors.BackendError
    return cls(message)


def deadline_of(remaining: float | None, now: float) -> float:
    """A gRPC call's time remaining (seconds, ``None`` for no deadline) as an absolute
    monotonic deadline (``math.inf`` for none). CLOCK_MONOTONIC is system-wide on Linux, so
    the engine core compares it with its own clock."""
    return math.inf if remaining is None else now + remaining
