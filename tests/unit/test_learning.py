"""The dispatcher learns: latency model, adaptive dispatch, adaptive cap, priorities, live
policy changes, length bucketing — on a fake clock and a scripted backend (trtserve.testing).
The same properties on whole simulated traces: tests/harness/test_simulate.py."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from trtserve.batching.dispatcher import Dispatcher
from trtserve.batching.latency import LatencyModel
from trtserve.config import BatchingPolicy
from trtserve.testing import FakeBackend, FakeClock, affine, rows, settle


def test_latency_model_converges_to_the_engine_curve_and_follows_drift():
    curve = affine(0.002, 0.0001)
    rng = np.random.default_rng(0)
    model = LatencyModel()
    for _ in range(400):
        b = int(rng.integers(1, 65))
        model.observe(b, curve(b) * rng.uniform(0.95, 1.05))
    for b in (1, 3, 8, 20, 64):
        assert model.predict(b) == pytest.approx(curve(b), rel=0.06)
    slower = affine(0.004, 0.0002)  # the engine gets twice as slow
    for _ in range(1000):
        b = int(rng.integers(1, 65))
        model.observe(b, slower(b))
    for b in (1, 8, 64):
        assert model.predict(b) == pytest.approx(slower(b), rel=0.05)


def test_latency_model_shrugs_off_an_outlier_and_scales_with_length():
    model = LatencyModel()
    for _ in range(50):
        model.observe(8, 0.010, length=32)
    assert model.predict(8, 64) == pytest.approx(0.020, rel=0.01)  # unmeasured length: proportional
    model.observe(8, 5.0, length=32)  # a 5 s stall
    assert model.predict(8, 32) < 0.015


def test_lower_bound_sits_at_the_fast_end_and_survives_a_slow_spell():
    """A noisy CPU engine: refusals read the low estimate, so a few slow batches (a busy
    moment) do not make the server refuse requests that a normal run would still answer."""
    rng = np.random.default_rng(1)
    model = LatencyModel()
    for _ in range(200):
        model.observe(1, 0.010 * rng.uniform(0.9, 1.3))
    assert 0.0088 < model.lower_bound(1) < 0.0100 < model.predict(1)
    for _ in range(5):
        model.observe(1, 0.040)  # a busy moment: four times slower
    assert model.predict(1) > 0.020
    assert model.lower_bound(1) < 0.013
    for _ in range(300):  # a lasting slowdown is followed by the low estimate too
        model.observe(1, 0.030 * rng.uniform(0.9, 1.3))
    assert 0.026 < model.lower_bound(1) < 0.030


def test_a_bucket_first_measured_in_a_slow_spell_is_bounded_by_the_others():
    """The warm-up measures one length; traffic brings the others one batch at a time. One
    slow first batch at a new length (or a new row bucket) must not make every later request
    of that length look hopeless: refused requests are never measured, so the server would
    refuse them for good (seen: 74 ms for one row of 17-32 tokens, beside 19 ms at 9-16)."""
    model = LatencyModel()
    for n in (1, 2, 4, 8, 16):  # the warm-up's length
        model.observe(n, 0.008 + 0.004 * n, length=16)
    model.observe(1, 0.074, length=32)  # one batch, in a busy moment
    assert model.lower_bound(1, 32) == pytest.approx(2 * 0.012)  # no more than in proportion to length
    model.observe(1, 0.060, length=8)
    assert model.lower_bound(1, 8) == pytest.approx(0.012)  # a shorter row is no slower
    model.observe(4, 0.030, length=64)
    model.observe(1, 0.200, length=64)
    assert model.lower_bound(1, 64) == pytest.approx(0.030)  # one row is no slower than four
    assert model.predict(1, 32) == pytest.approx(0.074)  # waits still read the cautious mean


async def test_requests_of_a_length_first_measured_slow_are_still_admitted():
    clock = FakeClock()
    backend = FakeBackend(clock, latency=lambda r: 0.010)
    latency = LatencyModel()
    latency.observe(1, 0.010, length=16)
    latency.observe(1, 0.074, length=32)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=4), clock=clock, latency=latency)
    d.start()
    future = d.submit(rows(1, length=32), deadline=clock.now() + 0.060)
    await clock.advance(0.010)
    assert future.done() and not future.exception()
    assert latency.predict(1, 32) < 0.074  # it ran, so its length is measured again


def test_on_a_noiseless_engine_the_low_estimate_is_the_curve():
    """Rows vary within each bucket, so centroids move; the low estimate moves with them and
    never drifts below the curve (else rows would be batched that then finish late)."""
    curve = affine(0.002, 0.0001)
    rng = np.random.default_rng(2)
    model = LatencyModel()
    for _ in range(2000):
        b = int(rng.integers(1, 17))
        model.observe(b, curve(b))
    for b in range(1, 17):
        assert model.lower_bound(b) == pytest.approx(model.predict(b), rel=1e-9)
        assert model.predict(b) == pytest.approx(curve(b), rel=1e-9)


async def test_a_request_the_mean_would_refuse_is_admitted_and_answered():
    clock = FakeClock()
    backend = FakeBackend(clock, latency=lambda r: 0.010)
    latency = LatencyModel()
    for seconds in (0.010, 0.030, 0.030, 0.030):  # measured 10 ms once, then a slow spell
        latency.observe(1, seconds)
    assert latency.predict(1) > 0.015
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=4), clock=clock, latency=latency)
    d.start()
    future = d.submit(rows(1), deadline=clock.now() + 0.015)
    await clock.advance(0.010)
    assert future.done() and not future.exception()


def knee_engine(rows: int) -> float:
    """1 ms up to 16 rows, then proportional: throughput peaks at 16 and stays flat."""
    return 0.001 * max(1.0, rows / 16)


async def test_a_live_cap_started_low_climbs_to_the_knee_under_a_backlog_and_holds_a_fixed_one():
    """adaptive_batch_size, the cap started at 2 (as a load on busy cores chooses): while more rows
    wait than it allows, the dispatcher probes and moves it to the knee (16, or 32 which runs the
    same rows/s), and later batches are that large; every request is answered. A fixed
    max_batch_size never moves."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=knee_engine)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=128, adaptive_batch_size=True), clock=clock)
    d.start()
    d.start_cap(2, "a low start")
    futures = []
    for _ in range(300):  # 64 rows every 10 ms: more than 2 rows ever run at once
        futures += [d.submit(rows(j)) for j in range(64)]
        await clock.advance(0.01)
    await clock.advance(1.0)
    assert d.cap.value in (16, 32) and d.cap.moves >= 3 and "while serving" in d.cap.reason
    assert all(f.done() and not f.exception() for f in futures)
    late = backend.sizes()[-40:]  # later batches are that large, but for a probe's few
    assert sum(size >= 16 for size in late) >= 0.75 * len(late)
    # Front ends see the cap in force (the queue door sizes its reads by it).
    assert d.hint().cap == d.cap.value == d.snapshot().cap
    fixed = Dispatcher(backend, BatchingPolicy(max_batch_size=4), clock=clock)
    fixed.start_cap(2, "ignored: the config fixes it")
    assert (fixed.cap.value, fixed.cap.live) == (4, False)


def gpu_engine(rows: int) -> float:
    """An H200's curve for minilm at 256 tokens (tests/gpu/test_torch_gpu.py measured it): 4.4 ms
    for a batch of one, then about 5 200 rows/s from 64 rows up (1 024 rows: 198 ms)."""
    return max(0.0044, 0.0015 + rows / 5200)


async def test_a_closed_loop_holding_one_batch_at_the_cap_is_served_at_the_engines_speed():
    """128 callers of 8 rows, each sending again 100 ms after its answer (front end, network,
    client), against a cap started at the hard limit (1 024 rows: what a load chose on short rows):
    the queue never holds more than the cap, so at that cap each batch waits for the last answers of
    the one before and the slot idles a third of the time. Probing half the cap while a full batch
    waits brings the cap down until one batch fills while another runs: the last 20 s of fake time
    serve >= 0.9 of the engine's best rows/s, and every call is answered."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=gpu_engine)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=1024, adaptive_batch_size=True), clock=clock)
    d.start()
    d.start_cap(1024, "the knee of a curve measured on short rows")
    served: list[float] = []

    async def caller(i: int) -> None:
        while True:
            await d.submit(rows(i, 8))
            served.append(clock.now())
            await clock.sleep_until(clock.now() + 0.100)

    start = clock.now()
    callers = [asyncio.ensure_future(caller(i)) for i in range(128)]
    await clock.advance(40.0)
    rate = 8 * sum(1 for t in served if t > start + 20.0) / 20.0
    for task in callers:
        task.cancel()
    best = max(n / gpu_engine(n) for n in (64, 128, 256, 512, 1024))
    assert rate >= 0.9 * best, (rate, best, d.cap.value, d.cap.reason)
    assert d.cap.value < 1024 and "shrank" in d.cap.reason


async def test_an_open_loop_below_capacity_leaves_the_cap_at_the_knee():
    """Poisson arrivals at 85 % of the engine's best rows/s, on a curve whose knee is at 16 rows and
    where 8 rows run 10 % fewer rows/s: both sizes of a probe keep up, so the phases measure the
    arrivals alike, and only the engine's curve keeps the cap from drifting below the knee (at 8
    the engine would run at 94 % of its rows/s and queue)."""
    clock = FakeClock()
    backend = FakeBackend(clock, latency=lambda n: 0.02 + 0.01 * n if n <= 16 else 0.18 * n / 16)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=1024, adaptive_batch_size=True), clock=clock)
    d.start()
    d.start_cap(16, "the knee of the warm-up's curve")
    rng = np.random.default_rng(3)
    futures, caps = [], set()
    for gap in rng.exponential(1 / (0.85 * 16 / 0.18), size=16_000):
        futures.append(d.submit(rows(len(futures))))
        await clock.advance(float(gap))
        caps.add(d.cap.value)
    await clock.advance(1.0)
    assert all(f.done() and not f.exception() for f in futures)
    assert caps <= {16, 32}, (caps, d.cap.reason)


async def test_high_priority_is_served_first_and_low_priority_still_completes():
    clock = FakeClock()
    backend = FakeBackend(clock, latency=lambda r: 0.010)
    policy = BatchingPolicy(max_batch_size=2, priority_levels=2, default_priority=2, priority_aging=0.5)
    d = Dispatcher(backend, policy, clock=clock)
    d.start()
    done: dict[tuple[int, int], float] = {}
    futures = []
    for step in range(100):  # overload: 4 rows arrive per 10 ms, 2 can run
        for k, level in enumerate((1, 1, 2, 2)):
            f = d.submit(rows(step * 10 + k), priority=level)
            t0 = clock.now()
            f.add_done_callback(lambda _f, key=(level, step * 10 + k), t0=t0: done.__setitem__(key, clock.now() - t0))
            futures.append(f)
        await clock.advance(0.010)
    for _ in range(300):
        await clock.advance(0.010)
    assert all(f.done() and f.exception() is None for f in futures)  # nothing starves or is lost
    high = [t for (level, _), t in done.items() if level == 1]
    low = [t for (level, _), t in done.items() if level == 2]
    assert len(low) == 200
    assert np.median(high) < 0.5 * np.median(low)


async def test_live_policy_change_applies_to_the_next_batch_and_loses_nothing():
    clock = FakeClock()
    backend = FakeBackend(clock)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=8), clock=clock)
    d.start()
    d.submit(rows(0))
    await settle()
    queued = [d.submit(rows(i)) for i in range(1, 13)]
    d.set_policy(BatchingPolicy(max_batch_size=3))
    for _ in range(6):
        await clock.advance(0.010)
    assert backend.sizes() == [1, 3, 3, 3, 3]
    assert [f.result()[0]["y"][0, 0] for f in queued] == [2.0 * i for i in range(1, 13)]


async def run_mixed_lengths(bucketing: bool) -> tuple[float, list[bool]]:
    clock = FakeClock()
    backend = FakeBackend(clock)
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=4, length_bucketing=bucketing), clock=clock)
    d.start()
    d.submit(rows(0))
    await settle()
    lengths = [2, 64, 3, 60, 2, 70, 4, 66, 3, 62, 2, 64, 5, 61, 2, 63]
    futures = [(n, d.submit(rows(i, length=n))) for i, n in enumerate(lengths, start=1)]
    for _ in range(8):
        await clock.advance(0.010)
    exact = []
    for i, (n, f) in enumerate(futures, start=1):
        expected = 2 * np.concatenate([[i], np.arange(1, n)]).astype(np.float32)
        exact.append(np.array_equal(f.result()[0]["y"][0], expected))
    return d.stats.padding_ratio, exact


async def test_length_bucketing_pads_less_and_changes_no_answer():
    with_buckets, exact_b = await run_mixed_lengths(True)
    without, exact_n = await run_mixed_lengths(False)
    assert all(exact_b) and all(exact_n)
    assert with_buckets < 0.2 < 0.4 < without  # share of padding in the elements run


async def test_rows_that_would_finish_late_are_not_run():
    clock = FakeClock()
    backend = FakeBackend(clock, latency=affine(0.002, 0.001))
    d = Dispatcher(backend, BatchingPolicy(max_batch_size=16), clock=clock)
    for b in (1, 2, 4, 8, 16):
        d.latency.observe(b, 0.002 + 0.001 * b)
    d.start()
    d.submit(rows(0))
    await settle()
    urgent = d.submit(rows(1), deadline=clock.now() + 0.003 + 0.0035)  # fits a batch of 1 after the first
    relaxed = [d.submit(rows(i), deadline=math.inf) for i in range(2, 14)]
    for _ in range(10):
        await clock.advance(0.003)
    assert all(f.done() for f in relaxed)
    # The urgent row could not finish inside the 13-row batch (15 ms): it was left out of it,
    # and answered DEADLINE_EXCEEDED or run alone in time — never run late.
    assert urgent.done()
    for start, batch in backend.batches:
        ids = [float(p["x"][r, 0]) for p in batch.parts for r in range(len(p["x"]))]
        if 1.0 in ids:
            assert start + 0.002 + 0.001 * batch.rows <= 1000.0 + 0.0065 + 1e-9
