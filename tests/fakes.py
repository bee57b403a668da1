"""Test doubles for dispatcher-policy tests: the simulator's scripted engine on a fake clock.

Nowhere else does a fake stand in for a real component: server tests use real grpc servers
on 127.0.0.1, real onnxruntime and real clients.
"""

from __future__ import annotations

import numpy as np

from trtserve.batching.simulator import SimEngine as FakeBackend
from trtserve.datatypes import Tensors

__all__ = ["FakeBackend", "rows"]


def rows(request_id: float, n: int = 1, length: int = 1) -> list[Tensors]:
    """One segment of ``n`` rows of ``length`` values, each row starting with ``request_id``."""
    x = np.full((n, length), request_id, dtype=np.float32)
    x[:, 1:] = np.arange(1, length, dtype=np.float32)
    return [{"x": x}]
