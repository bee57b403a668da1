"""What ``trtserve build`` builds a TensorRT plan with: the options from its flags, and the
(min, opt, max) shapes of the optimization profile they give each input. Pure: nothing here
needs TensorRT, ONNX or a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtserve.errors import BackendError

PRECISIONS = ("fp32", "fp16", "bf16")
HARDWARE_COMPATIBILITY = ("none", "ampere_plus", "same_compute_capability")
DEFAULT_DIM_RANGE = (1, 128, 256)


class BuildError(BackendError):
    """A plan could not be built; the message says why (parser or builder errors included)."""


@dataclass(frozen=True)
class BuildOptions:
    """How to build plans (from ``trtserve build``'s flags).

    Attributes:
        precision: ``fp32``, ``fp16`` or ``bf16``; reduced precision is made in the ONNX graph
            before the build, keeping FP32 inputs and outputs.
        dim_range: (min, opt, max) for every dynamic axis other than the batch axis, e.g. the
            sequence length.
        opt_batch: the batch size the kernels are tuned for; 0 picks the largest preferred
            batch size of the config, else its ``max_batch_size``.
        workspace_mib: builder workspace limit in MiB; 0 leaves TensorRT's default (all of the
            device's memory).
        optimization_level: TensorRT's builder optimization level, 0..5 (default 3).
        timing_cache: the timing cache file read before and written after each build; ``None``
            for none.
        hardware_compatibility: ``none`` (only this GPU's architecture), ``ampere_plus`` or
            ``same_compute_capability`` (both slower; see the TensorRT docs).
        version_compatible: embed a lean runtime so newer TensorRT versions can run the plan.
        profile_per_slot: one identical profile per execution slot instead of one shared by all
            slots (fallback if concurrent contexts on one profile misbehave).
        device: the CUDA device to build on.
    """

    precision: str = "fp32"
    dim_range: tuple[int, int, int] = DEFAULT_DIM_RANGE
    opt_batch: int = 0
    workspace_mib: int = 0
    optimization_level: int = 3
    timing_cache: Path | None = None
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    profile_per_slot: bool = False
    device: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        lo, opt, hi = self.dim_range
        if not 1 <= lo <= opt <= hi:
            raise ValueError(f"dim range must satisfy 1 <= min <= opt <= max, got {lo}:{opt}:{hi}")
        if self.opt_batch < 0 or self.workspace_mib < 0:
            raise ValueError("opt batch and workspace must be >= 0")
        if not 0 <= self.optimization_level <= 5:
            raise ValueError(f"optimization level must be 0..5, got {self.optimization_level}")
        if self.hardware_compatibility not in HARDWARE_COMPATIBILITY:
            raise ValueError(f"hardware compatibility must be one of {HARDWARE_COMPATIBILITY}, "
                             f"got {self.hardware_compatibility!r}")

    def recorded(self) -> dict[str, Any]:
        """The options as the sidecar records them (what makes a plan differ)."""
        d = asdict(self)
        d.pop("timing_cache")
        d.pop("device")
        d["dim_range"] = list(self.dim_range)
        return d


def parse_range(text: str) -> tuple[int, int, int]:
    """``"1:128:256"`` → (1, 128, 256).

    Raises:
        ValueError: not three integers separated by colons.
    """
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"expected MIN:OPT:MAX, e.g. 1:128:256, got {text!r}")
    lo, opt, hi = (int(p) for p in parts)
    return lo, opt, hi


def opt_batch_size(max_batch_size: int, preferred: Sequence[int], requested: int = 0) -> int:
    """The batch size to tune for: ``requested`` if given, else the largest preferred batch size
    not above ``max_batch_size``, else ``max_batch_size``."""
    if requested:
        return min(requested, max_batch_size)
    fitting = [p for p in preferred if 0 < p <= max_batch_size]
    return max(fitting) if fitting else max_batch_size


Shape = tuple[int, ...]


def profile_shapes(
    inputs: Sequence[tuple[str, Shape]],
    *,
    batched: bool,
    max_batch_size: int,
    opt_batch: int,
    dim_range: tuple[int, int, int],
) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shapes of every input for one optimization profile.

    Args:
        inputs: (name, shape) with -1 for each dynamic dim (as TensorRT's network reports it).
        batched: axis 0 is the batch (it must then be dynamic).

    Raises:
        BuildError: a batched input with a fixed axis 0.
    """
    shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
    for name, shape in inputs:
        lo: list[int] = []
        opt: list[int] = []
        hi: list[int] = []
        for axis, dim in enumerate(shape):
            if batched and axis == 0:
                if dim != -1:
                    raise BuildError(f"input '{name}' has a fixed batch axis ({dim}) but the config batches; "
                                     "export it with a dynamic batch dim")
                bounds = (1, opt_batch, max_batch_size)
            elif dim == -1:
                bounds = dim_range
            else:
                bounds = (dim, dim, dim)
            lo.append(bounds[0])
            opt.append(bounds[1])
            hi.append(bounds[2])
        shapes[name] = (tuple(lo), tuple(opt), tuple(hi))
    return shapes


__all__ = [
    "DEFAULT_DIM_RANGE",
    "HARDWARE_COMPATIBILITY",
    "PRECISIONS",
    "BuildError",
    "BuildOptions",
    "Shape",
    "opt_batch_size",
    "parse_range",
    "profile_shapes",
]
