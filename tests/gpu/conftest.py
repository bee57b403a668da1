"""GPU checks: run by tests/gpu/run.sh on a machine with an NVIDIA GPU, never by `make test`.
Every test here skips (with the reason) where cuda-python cannot reach a CUDA device."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def device_info():
    from trtserve.runtimes import cuda

    try:
        return cuda.preflight(0)
    except cuda.GpuUnavailable as exc:
        pytest.skip(f"no GPU: {exc}")
