"""GPU checks: run by tests/gpu/run.sh on a machine with an NVIDIA GPU, never by `make test`.
Every test here skips (with the reason) where no GPU is present: ``nvidia-smi`` is missing or
lists none. Where ``nvidia-smi`` does list a GPU and cuda-python still cannot reach it (a
driver/cuda-python mismatch, a broken install), that is a failure, not a skip: a GPU machine on
which nothing ran must not pass."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def gpus_nvidia_smi_sees() -> list[str]:
    """The lines of ``nvidia-smi -L`` ("GPU 0: <name> (UUID: ...)"); empty where nvidia-smi is
    missing, fails or lists no GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU ")] if listed.returncode == 0 else []


@pytest.fixture(scope="session")
def device_info():
    from trtserve.runtimes import cuda

    try:
        return cuda.preflight(0)
    except cuda.GpuUnavailable as exc:
        seen = gpus_nvidia_smi_sees()
        if seen:
            pytest.fail(f"nvidia-smi sees {seen[0]!r} but the CUDA preflight failed: {exc}")
        pytest.skip(f"no GPU: {exc}")
