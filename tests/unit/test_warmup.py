"""The warm-up at load and the batch cap it starts from where the config leaves max_batch_size to
the server (trtserve.engine.warmup, through EngineModel.start), on a fake clock with a scripted
engine: which batch sizes it runs, where the search stops, where the live cap starts, and the hard
limit the served spec's policy and config report (the model file's, else SEARCH_CEILING)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import pytest

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.batching.policy import knee
from trtserve.config import BatchingPolicy
from trtserve.datatypes import DATATYPES
from trtserve.engine.model import EngineModel
from trtserve.engine.warmup import CHOICE_FLOOR, SEARCH_CEILING
from trtserve.spec import ModelSpec, TensorSpec
from trtserve.testing import FakeBackend, FakeClock

FP32 = DATATYPES["FP32"]


def knee_at_32(rows: int) -> float:
    """20 ms a batch up to 20 rows, then 1 ms a row: rows/s doubles up to 16, reaches its best
    (1000) at 32 and stays there."""
    return max(0.020, 0.001 * rows)


def spec(tmp_path: Path, max_batch_size: int = 0, *, choose: bool = True, budget_s: float | None = None) -> ModelSpec:
    policy = BatchingPolicy(max_batch_size=max_batch_size, **({"latency_budget": budget_s} if budget_s else {}))
    return ModelSpec(
        name="m", version="1", platform="onnxruntime_onnx",
        inputs=(TensorSpec("x", FP32, (-1,)),), outputs=(TensorSpec("y", FP32, (-1,)),),
        policy=policy, instances=1, model_dir=tmp_path, version_dir=tmp_path / "1",
        config=mc.ModelConfig(name="m", max_batch_size=max_batch_size), choose_batch_size=choose,
    )


async def load(model_spec: ModelSpec, latency, file_limit: int | None = None) -> tuple[EngineModel, FakeBackend]:
    """Build and start the model on a fake clock, moving time until the warm-up is done."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=latency)
    if file_limit is not None:
        backend.max_batch_rows = file_limit  # as a model file with a fixed batch axis
    model = EngineModel(model_spec, backend, clock=clock)
    task = asyncio.create_task(model.start())
    while not task.done():
        await clock.advance(0.005)
    await task
    return model, backend


def batches_of(backend: FakeBackend) -> list[int]:
    """Distinct batch sizes run, in order."""
    return list(dict.fromkeys(backend.sizes()))


async def test_the_choice_is_the_knee_of_the_measured_curve_and_the_model_reports_it(tmp_path):
    model, backend = await load(spec(tmp_path), knee_at_32)
    # Neither 64 nor 128 rows beats 32 by more than 5 %: the search stops after two such sizes.
    assert batches_of(backend) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert model.dispatcher.cap.value == 32 and model.dispatcher.cap.live and "knee" in model.dispatcher.cap.reason
    # The hard limit stays the file's (none here: the ceiling); the cap moves below it.
    assert model.spec.policy.max_batch_size == SEARCH_CEILING == model.spec.config.max_batch_size
    assert model.dispatcher.policy == model.spec.policy and model.spec.policy.adaptive_batch_size
    assert model.spec.choose_batch_size and model.dispatcher.stats.batches == 0  # the warm-up is not traffic


async def test_a_file_limit_bounds_the_search_and_the_choice(tmp_path):
    model, backend = await load(spec(tmp_path), knee_at_32, file_limit=12)
    assert batches_of(backend) == [1, 2, 4, 8, 12] and max(backend.sizes()) == 12
    assert model.spec.policy.max_batch_size == 12 and model.spec.config.max_batch_size == 12
    assert model.dispatcher.cap.value == 12


async def test_a_file_fixed_at_one_row_gives_one(tmp_path):
    model, backend = await load(spec(tmp_path), knee_at_32, file_limit=1)
    assert set(backend.sizes()) == {1} and model.spec.policy.max_batch_size == 1 == model.dispatcher.cap.value


async def test_without_a_bound_from_the_file_the_search_stops_at_the_ceiling(tmp_path):
    model, backend = await load(spec(tmp_path), lambda rows: 0.001 + 1e-6 * rows)  # still growing at 1024
    assert max(backend.sizes()) == SEARCH_CEILING == model.dispatcher.cap.value


async def test_a_slow_cheap_size_does_not_end_the_search(tmp_path):
    # Batches of 2 are slower than of 1 (say a busy moment), but short: the search goes on.
    model, backend = await load(spec(tmp_path), lambda rows: 0.004 if rows == 2 else knee_at_32(rows))
    assert batches_of(backend) == [1, 2, 4, 8, 16, 32, 64, 128] and model.dispatcher.cap.value == 32


async def test_a_load_on_busy_cores_is_not_stuck_with_a_batch_of_one(tmp_path):
    # Other work holds the cores while 1 and 2 rows are measured: both take over 50 ms and 2
    # rows look no faster than one. One such size does not end the search.
    busy = {1: 0.060, 2: 0.118}
    model, backend = await load(spec(tmp_path), lambda rows: busy.get(rows) or knee_at_32(rows))
    assert model.dispatcher.cap.value == 32


async def test_a_curve_with_no_gain_still_gets_the_floor(tmp_path):
    # Measured flat (rows/s the same at every size): the knee is 1, the choice the floor, 4.
    model, backend = await load(spec(tmp_path), lambda rows: 0.060 * rows)
    assert batches_of(backend) == [1, 2, 4] and model.dispatcher.cap.value == CHOICE_FLOOR == 4


async def test_the_search_does_not_start_a_batch_predicted_past_the_load_time_bound(tmp_path):
    # 100 ms + 50 ms a row: 4 rows take 0.3 s, so 8 would take up to 0.6 s at 4's time per row,
    # past SEARCH_RUN_LIMIT_S (0.5 s): not run, though it would still have been faster per row.
    model, backend = await load(spec(tmp_path), lambda rows: 0.100 + 0.050 * rows)
    assert batches_of(backend) == [1, 2, 4] and model.dispatcher.cap.value == 4


async def test_the_latency_budget_stops_the_search_and_bounds_the_choice(tmp_path):
    model, backend = await load(spec(tmp_path, budget_s=0.025), knee_at_32)
    assert batches_of(backend) == [1, 2, 4, 8, 16, 32]  # 32 rows take 32 ms, past the 25 ms budget
    assert model.dispatcher.cap.value == 16


async def test_an_explicit_max_batch_size_is_kept_and_warmed_up_to(tmp_path):
    model, backend = await load(spec(tmp_path, 16, choose=False), knee_at_32)
    assert batches_of(backend) == [1, 2, 4, 8, 16]
    assert backend.sizes() == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]  # each twice: one unmeasured, one measured
    assert model.spec.policy.max_batch_size == 16 and model.dispatcher.policy.max_batch_size == 16
    assert model.dispatcher.cap.value == 16 and not model.dispatcher.cap.live
    assert model.dispatcher.latency.top_rows(16) == 16


async def test_the_warm_up_does_not_wait_out_a_fixed_queue_delay_and_leaves_the_policy_as_configured(tmp_path):
    # Triton's fixed timer at 6 s: each warm-up size below the cap once waited it out (48 s a load).
    fixed = spec(tmp_path, 16, choose=False)
    policy = dataclasses.replace(fixed.policy, max_queue_delay=6.0, adaptive=False)
    model, backend = await load(dataclasses.replace(fixed, policy=policy), knee_at_32)
    assert backend.sizes() == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]
    assert model.clock.now() - 1000.0 < 1.0  # the fake clock starts at 1000 s: ten runs of 20 ms, no 6 s window
    assert model.dispatcher.policy == policy


@pytest.mark.parametrize(("curve", "budget", "expected"), [
    ({1: 0.02, 2: 0.02, 4: 0.02, 8: 0.02, 12: 0.02}, math.inf, 12),  # a size that is no power of two
    ({1: 0.02, 8: 0.02, 16: 0.02, 32: 0.032, 64: 0.064}, math.inf, 32),
    ({1: 0.02, 8: 0.02, 16: 0.02, 32: 0.032, 64: 0.064}, 0.025, 16),
    ({1: 0.0}, math.inf, None),
])
def test_the_knee_rule(curve, budget, expected):
    assert knee(curve, budget) == expected
