"""What the dispatcher measures for its policy: host cost and busy share, arrival rate, the
tight end of the deadline budgets. Exact, on hand-driven counters and times."""

from __future__ import annotations

import math

import pytest

from trtserve.batching.budgets import DeadlineBudgets
from trtserve.batching.host import HostMeter
from trtserve.batching.rate import ArrivalRate


class Counter:
    """A CPU-time counter the test moves by hand."""

    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


def test_host_meter_follows_the_per_batch_cost():
    meter = HostMeter(Counter(), alpha=0.5)
    assert meter.per_batch == 0.0
    meter.observe_batch(0.000100)
    assert meter.per_batch == pytest.approx(0.000100)  # the first sample is taken whole
    meter.observe_batch(0.000300)
    assert meter.per_batch == pytest.approx(0.000200)


def test_host_meter_busy_share_and_the_part_batches_explain():
    cpu = Counter()
    meter = HostMeter(cpu, window=0.010, alpha=1.0)
    assert meter.share(0.0) == (0.0, 0.0)
    for _ in range(20):  # 20 batches of 200 µs and 4 ms of other work in 10 ms
        meter.observe_batch(0.000200)
    cpu.value = 0.008
    busy, batches = meter.share(0.010)
    assert busy == pytest.approx(0.8) and batches == pytest.approx(0.4)
    assert meter.share(0.015) == (busy, batches)  # mid-window: unchanged


def test_host_meter_forgets_at_once_after_a_long_idle_gap():
    cpu = Counter()
    meter = HostMeter(cpu, window=0.010, alpha=0.1)
    meter.share(0.0)
    cpu.value = 0.010
    meter.share(0.010)
    assert meter.share(5.0)[0] == pytest.approx(0.0)  # no CPU for 5 s: idle, not 0.1 × idle


def test_arrival_rate_over_the_last_arrivals():
    rate = ArrivalRate(window=4)
    assert rate.rate(0.0) == 0.0
    rate.observe(0.0, 1)
    assert rate.rate(0.0) == 0.0  # one arrival is no rate
    for t in (0.001, 0.002, 0.003, 0.004):  # 1000/s; the window forgets t = 0
        rate.observe(t, 1)
    assert rate.rate(0.004) == pytest.approx(3 / 0.003)


def test_arrival_rate_falls_with_the_gap_since_the_last_arrival():
    rate = ArrivalRate(window=16)
    for i in range(16):
        rate.observe(i * 0.001, 2)  # 2000 rows/s
    assert rate.rate(0.015) == pytest.approx(30 / 0.015)
    assert rate.rate(0.115) == pytest.approx(2 / 0.100)  # then 100 ms of silence: one arrival per 100 ms


def test_arrival_rate_after_an_idle_spell_is_low():
    rate = ArrivalRate()
    rate.observe(0.0, 1)
    rate.observe(100.0, 1)
    assert rate.rate(100.0) == pytest.approx(0.01)


def test_deadline_budgets_tight_end():
    budgets = DeadlineBudgets(size=100, quantile=0.1, every=10)
    assert budgets.tight == math.inf
    for i in range(100):
        budgets.observe(0.010 if i % 2 else 0.200)
    assert budgets.tight == 0.010  # half the traffic is tight: protected
    for _ in range(95):
        budgets.observe(0.200)
    assert budgets.tight == 0.200  # 5 % tight: below the quantile, not worth shrinking every batch


def test_deadline_budgets_without_deadlines_are_infinite_and_early_ones_count():
    budgets = DeadlineBudgets(size=64, every=32)
    budgets.observe(0.050)
    assert budgets.tight == 0.050  # recomputed on every observation until the first ``every``
    for _ in range(63):
        budgets.observe(math.inf)
    assert budgets.tight == math.inf
