"""What a TensorRT plan must match, checked without TensorRT or a GPU: its sidecar
(``model.plan.json``, written by :mod:`~trtserve.tools.build`) against this machine's TensorRT
version and GPU, its I/O types against the KServe datatypes, and a batch's or a request's shapes
against the plan's optimization profile. :mod:`.tensorrt` runs these before any device call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtserve.datatypes import DATATYPES, Datatype
from trtserve.errors import BackendError, InvalidRequest

log = logging.getLogger(__name__)

PLAN_FILE = "model.plan"
SIDECAR_SUFFIX = ".json"  # model.plan → model.plan.json
REBUILD = "rebuild with make engine"

# TensorRT DataType member name → KServe datatype. TensorRT's FP8/INT4/FP4/E8M0 have no
# KServe or numpy equivalent: an engine with such an I/O tensor is refused at load.
TRT_TYPES: dict[str, str] = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}


@dataclass(frozen=True)
class ProfileBounds:
    """The shapes one optimization profile accepts for one engine input (batch axis included
    when the model is batched); static dims have min == max."""

    name: str
    min: tuple[int, ...]
    max: tuple[int, ...]


def _violation(name: str, shape: Sequence[int], bounds: ProfileBounds, first_axis: int, batched: bool) -> str | None:
    if len(shape) != len(bounds.max):
        return f"input '{name}' has {len(shape)} dims, the plan expects {len(bounds.max)}"
    for axis in range(first_axis, len(shape)):
        size, lo, hi = shape[axis], bounds.min[axis], bounds.max[axis]
        what = "batch of" if batched and axis == 0 else f"dim {axis} of"
        if size > hi:
            return f"{what} input '{name}' is {size}, beyond the plan's profile maximum {hi}"
        if size < lo:
            return f"{what} input '{name}' is {size}, below the plan's profile minimum {lo}"
    return None


def check_profile(
    shapes: Mapping[str, Sequence[int]], bounds: Mapping[str, ProfileBounds], *, batched: bool = True
) -> None:
    """Refuse a batch whose input shapes fall outside the profile, before any device call.

    Args:
        shapes: engine-input name → the batch's shape (as passed to ``set_input_shape``).
        bounds: the slot's profile bounds for every input.

    Raises:
        BackendError: naming the tensor, the axis and the limit.
    """
    for name, shape in shapes.items():
        problem = _violation(name, shape, bounds[name], 0, batched)
        if problem:
            raise BackendError(f"TensorRT refused the batch: {problem}")


def check_request(
    segment: Mapping[str, np.ndarray], bounds: Mapping[str, ProfileBounds], *, batched: bool = True
) -> None:
    """Refuse one request whose non-batch dims fall outside the profile (at admission, so it
    fails alone). ``segment`` arrays carry rows on axis 0 (one row for an unbatched model).

    Raises:
        InvalidRequest: naming the tensor, the axis and the limit.
    """
    for name, arr in segment.items():
        b = bounds.get(name)
        if b is None:
            continue
        shape = arr.shape if batched else arr.shape[1:]
        problem = _violation(name, shape, b, 1 if batched else 0, batched)
        if problem:
            raise InvalidRequest(problem)


def sidecar_problems(plan: Path, recorded: Mapping[str, Any], live: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """Compare a plan's sidecar with this machine.

    Args:
        plan: the plan file (for the message).
        recorded: the sidecar's JSON object (``tensorrt_version``, ``gpu.name``,
            ``gpu.compute_capability``, ``build.version_compatible``,
            ``build.hardware_compatibility``).
        live: ``tensorrt_version``, ``gpu_name``, ``compute_capability`` of this machine.

    Returns:
        (error, warnings): ``error`` is one sentence saying which mismatch makes the plan
        unusable here, ending "rebuild with make engine", or ``None``; ``warnings`` are
        differences that do not prevent loading (another GPU model of the same compute
        capability).
    """
    build = recorded.get("build", {}) or {}
    gpu = recorded.get("gpu", {}) or {}
    built_trt = str(recorded.get("tensorrt_version", ""))
    built_cc = str(gpu.get("compute_capability", ""))
    built_name = str(gpu.get("name", ""))
    live_trt, live_cc, live_name = live["tensorrt_version"], live["compute_capability"], live["gpu_name"]
    clauses: list[str] = []
    if built_trt and built_trt != live_trt:
        if not build.get("version_compatible"):
            clauses.append(f"with TensorRT {built_trt} but this server runs TensorRT {live_trt}")
        elif _version_tuple(live_trt)[:2] < _version_tuple(built_trt)[:2]:
            clauses.append(f"with TensorRT {built_trt} (version-compatible plans run only on that version or "
                           f"newer) but this server runs TensorRT {live_trt}")
    level = str(build.get("hardware_compatibility", "none")).lower()
    if built_cc and built_cc != live_cc:
        if level == "ampere_plus":
            if _version_tuple(live_cc)[:1] < (8,):
                clauses.append(f"for Ampere or newer GPUs but this GPU ({live_name}) has compute capability {live_cc}")
        else:
            clauses.append(f"for compute capability {built_cc} ({built_name or 'unknown GPU'}) but this GPU "
                           f"({live_name}) has compute capability {live_cc}")
    warnings: list[str] = []
    if not clauses and built_name and built_name != live_name and level != "ampere_plus":
        warnings.append(
            f"{plan} was built on a {built_name} and runs on a {live_name} of the same compute capability; "
            f"it should work but may be slower ({REBUILD} on this GPU for its best kernels)"
        )
    if clauses:
        return f"{plan} was built " + " and ".join(clauses) + f"; {REBUILD}", warnings
    return None, warnings


def _version_tuple(v: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in v.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def read_sidecar(plan: Path) -> dict[str, Any] | None:
    """The plan's sidecar as a dict, or ``None`` if there is none or it cannot be read
    (a warning is logged then: the plan is still tried)."""
    path = plan.with_name(plan.name + SIDECAR_SUFFIX)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        log.warning("%s has no sidecar %s: cannot check its TensorRT version and GPU before loading", plan, path.name)
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s (%s): loading %s unchecked", path, exc, plan)
        return None
    return data if isinstance(data, dict) else None


def trt_datatype(type_name: str, tensor: str, plan: Path) -> Datatype:
    """The KServe datatype of a TensorRT ``DataType`` member name.

    Raises:
        BackendError: a type with no KServe/numpy equivalent (FP8, INT4, FP4, E8M0).
    """
    kserve = TRT_TYPES.get(type_name)
    if kserve is None:
        raise BackendError(
            f"{plan}: tensor '{tensor}' is TensorRT {type_name}, which has no KServe datatype; "
            "keep the engine's inputs and outputs in FP32/FP16/BF16/INT8/INT32/INT64/BOOL/UINT8"
        )
    return DATATYPES[kserve]


__all__ = [
    "PLAN_FILE",
    "REBUILD",
    "SIDECAR_SUFFIX",
    "TRT_TYPES",
    "ProfileBounds",
    "check_profile",
    "check_request",
    "read_sidecar",
    "sidecar_problems",
    "trt_datatype",
]
