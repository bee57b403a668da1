"""A staged batch runs on its slot's thread as soon as the batch before it returns, before the
event loop has delivered that batch's answers (``batching/dispatcher.py``), so a runtime's
outputs must not live in the slot's buffers that the next batch writes. The pytorch runtime on
the CPU, with a program that returns its input (or a view of it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from trtserve.datatypes import DATATYPES
from trtserve.runtimes.base import Batch
from trtserve.spec import TensorSpec

torch = pytest.importorskip("torch", reason="the pytorch runtime needs torch (the export extra)")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Passthrough(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x[:, :1]


def two_requests(value: float) -> Batch:
    """A batch of two requests' rows (packed into the slot's staging buffers), all ``value``."""
    part = {"x": np.full((2, 3), value, dtype=np.float32)}
    return Batch((part, dict(part)), 4)


async def test_a_staged_batch_leaves_the_answers_of_the_torch_batch_before_it_as_they_were(tmp_path: Path):
    from trtserve.runtimes.torch import TorchBackend

    version = tmp_path / "passthrough" / "1"
    version.mkdir(parents=True)
    torch.jit.script(Passthrough()).save(str(version / "model.pt"))
    fp32 = DATATYPES["FP32"]
    backend = TorchBackend(version, config_inputs=[TensorSpec("x", fp32, (-1,))],
                           config_outputs=[TensorSpec("OUTPUT__0", fp32, (-1,)), TensorSpec("OUTPUT__1", fp32, (1,))])
    try:
        running = asyncio.ensure_future(backend.run(0, two_requests(1.0)))
        staged = asyncio.ensure_future(backend.run(0, two_requests(7.0)))  # queued behind it on the slot
        first, second = await running, await staged
    finally:
        await backend.aclose()
    np.testing.assert_array_equal(first["OUTPUT__0"], np.full((4, 3), 1.0))
    np.testing.assert_array_equal(first["OUTPUT__1"], np.full((4, 1), 1.0))
    np.testing.assert_array_equal(second["OUTPUT__0"], np.full((4, 3), 7.0))
