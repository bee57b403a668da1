"""The overload and mixed-deadline modes' pure parts: deadline classes (goodput, misses,
refusals by status), the targets of issue 16 and the Markdown tables. Exact answers from
small fixed inputs; nothing here times anything."""

from __future__ import annotations

import numpy as np
import pytest

from trtserve.harness.benchlib.deadlines import DeadlineClass, deadline_class, deadline_us
from trtserve.harness.benchlib.overload import (
    MIXED_MODE,
    OVERLOAD_MODE,
    format_mixed_table,
    format_overload_table,
    mixed_deadlines_us,
    mixed_targets,
    overload_targets,
)
from trtserve.harness.benchlib.report import Measurement, Point, Snapshot, summarize


def test_deadlines_scale_with_the_batch_of_one_and_never_fall_below_the_floor():
    assert deadline_us(3.5, 10.0) == 35_000
    assert deadline_us(0.02, 10.0) == 5_000  # tiny: 0.2 ms would be below one RPC
    assert deadline_us(0.02, 10.0, floor_ms=1.0) == 1_000
    assert mixed_deadlines_us(35_000) == {"tight": 35_000, "loose": 350_000}  # 10x and 100x batch of one
    assert mixed_deadlines_us(5_000) == {"tight": 5_000, "loose": 50_000}  # floored: loose stays 10x tight


def test_a_deadline_class_counts_goodput_misses_and_refusals_by_status():
    latency = np.array([1000.0, 2000.0, 12_000.0, 3000.0, 10_000.0, 500.0, 4000.0])
    codes = ["OK", "OK", "OK", "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"]
    late = np.array([False, False, True, False, False, False, False])
    c = deadline_class("tight", 10_000, 2.0, latency, codes, late)
    assert (c.requests, c.good, c.late, c.misses) == (7, 2, 1, 5)
    assert c.refused == {"RESOURCE_EXHAUSTED": 1, "DEADLINE_EXCEEDED": 2, "other": 1}
    assert c.refused_early == 1  # answered DEADLINE_EXCEEDED at 3 ms, before its 10 ms passed
    assert c.goodput == 1.0 and c.miss_share == pytest.approx(5 / 7) and c.deadline_ms == 10.0
    assert c.p50_ms == 2.0 and c.p99_ms == pytest.approx(11.8)  # of the OK answers, the late one included
    empty = deadline_class("loose", 50_000, 2.0, np.array([]), [], np.array([], dtype=bool))
    assert empty.miss_share == 0.0 and empty.p50_ms is None and empty.goodput == 0.0


def cls(name: str = "all", good: int = 100, requests: int | None = None, window_s: float = 1.0,
        deadline_ms: float = 5.0, late: int = 0, exhausted: int = 0, expired: int = 0) -> DeadlineClass:
    requests = good + late + exhausted + expired if requests is None else requests
    refused = {"RESOURCE_EXHAUSTED": exhausted, "DEADLINE_EXCEEDED": expired, "other": 0}
    return DeadlineClass(name, deadline_ms, requests, good, late, refused, 0, window_s, 1.0, 4.0)


def point(mode: str, multiple: float, classes: tuple[DeadlineClass, ...], policy: str = "adaptive", model: str = "tiny",
          rss: tuple[float, float] = (600.0, 610.0), door: str = "grpc") -> Point:
    good = sum(c.good for c in classes)
    return summarize(Measurement(
        model=model, mode=mode, load=1000.0 * multiple, fraction=multiple, window_s=1.0, rows_per_request=1,
        latency_us=np.full(good, 1000.0), codes=["OK"] * good, late=0, deadline_us=5000, send_lag_us=np.array([]),
        before=Snapshot(0.0, 0.0, 0, 0, {}, server_rss_mib=rss[0]),
        after=Snapshot(0.0, 0.0, 0, 0, {}, server_rss_mib=rss[1]),
        policy=policy, classes=classes, door=door,
    ), 1000.0)


def sweep(policy: str, goodputs: dict[float, int], rss_end: dict[float, float], door: str = "grpc") -> list[Point]:
    return [point(OVERLOAD_MODE, m, (cls(good=g, expired=int(1000 * m) - g),), policy=policy, rss=(600.0, rss_end[m]),
                  door=door) for m, g in goodputs.items()]


def test_overload_goodput_at_two_and_three_times_capacity_against_the_sweeps_peak():
    rss = {0.5: 600.0, 1.0: 640.0, 2.0: 700.0, 3.0: 790.0}
    holds = sweep("adaptive", {0.5: 500, 1.0: 900, 2.0: 760, 3.0: 720}, rss)  # 0.84 and 0.80 of the peak
    collapses = sweep("fixed 2 ms", {0.5: 500, 1.0: 880, 2.0: 450, 3.0: 20}, {**rss, 3.0: 801.0})
    targets = overload_targets([*holds, *collapses])
    by_name = {t.name: t for t in targets}
    two = by_name["tiny overload adaptive at 2x capacity: goodput >= 0.8 x peak"]
    assert two.verdict == "PASS" and "760/s of 2000/s offered vs peak 900/s at 1x = 0.84" in two.detail
    assert by_name["tiny overload adaptive at 3x capacity: goodput >= 0.8 x peak"].verdict == "PASS"  # exactly 0.80
    assert by_name["tiny overload fixed 2 ms at 2x capacity: goodput >= 0.8 x peak"].verdict == "MISS"
    assert "DEADLINE_EXCEEDED 2980" in by_name["tiny overload fixed 2 ms at 3x capacity: goodput >= 0.8 x peak"].detail
    memory = [t for t in targets if "RSS" in t.name]
    assert [t.verdict for t in memory] == ["PASS", "MISS"]  # 790 / 640 = 1.23; 801 / 640 = 1.25+
    assert "790 MiB after 3x vs 640 MiB after 1x = 1.23" in memory[0].detail
    partial = overload_targets(sweep("adaptive", {0.5: 500, 1.0: 900}, rss))
    assert [t.verdict for t in partial] == ["SKIP", "SKIP", "SKIP"]


def test_mixed_targets_hold_each_class_to_its_own_miss_limit():
    ok = point(MIXED_MODE, 0.65,
               (cls("tight", good=96, late=2, expired=2), cls("loose", good=99, expired=1, deadline_ms=50.0)))
    missed = point(MIXED_MODE, 0.65,
                   (cls("tight", good=94, expired=6), cls("loose", good=98, exhausted=2, deadline_ms=50.0)),
                   policy="fixed 2 ms")
    targets = mixed_targets([ok, missed])
    assert [t.verdict for t in targets] == ["PASS", "PASS", "MISS", "MISS"]
    assert targets[0].name == "tiny mixed adaptive at 65% capacity, tight (5.0 ms): misses <= 5%"
    assert targets[0].detail.startswith("4 of 100 (4.0%): late 2, refused RESOURCE_EXHAUSTED 0, DEADLINE_EXCEEDED 2")
    assert targets[3].name.endswith("loose (50.0 ms): misses <= 1%") and "RESOURCE_EXHAUSTED 2" in targets[3].detail


def test_tables_are_markdown_with_a_row_per_point_and_class():
    rss = {0.5: 600.0, 1.0: 640.0, 2.0: 700.0, 3.0: 790.0}
    overload = sweep("adaptive", {0.5: 500, 1.0: 900, 2.0: 760, 3.0: 720}, rss)
    mixed = point(MIXED_MODE, 0.65, (cls("tight", good=96, expired=4), cls("loose", good=100, deadline_ms=50.0)))
    table = format_overload_table([*overload, mixed]).splitlines()
    assert len([line for line in table if line.startswith("| tiny |")]) == 4
    assert "| tiny | adaptive | grpc | 3000 (3x) | 5.0 | 720 | 0 | 0 | 2280 (0) | 0 |" in table[-1]
    assert table[-1].endswith("| 600 → 790 |")
    rows = [line for line in format_mixed_table([*overload, mixed]).splitlines() if line.startswith("| tiny |")]
    assert rows[0].startswith("| tiny | adaptive | grpc | 650 (65%) | tight | 5.0 | 96 | 4.0% |")
    assert rows[1].startswith("| tiny | adaptive | grpc | 650 (65%) | loose | 50.0 | 100 | 0.0% |")
    assert format_overload_table([mixed]) == "" and format_mixed_table(overload) == ""


def test_a_sweep_over_the_http_door_is_its_own_sweep_and_says_so():
    rss = {1.0: 640.0, 2.0: 700.0, 3.0: 790.0}
    grpc = sweep("adaptive", {1.0: 900, 2.0: 760, 3.0: 720}, rss)
    http = sweep("adaptive", {1.0: 600, 2.0: 300, 3.0: 200}, rss, door="http")
    by_name = {t.name: t for t in overload_targets([*grpc, *http])}
    assert by_name["tiny overload adaptive at 2x capacity: goodput >= 0.8 x peak"].verdict == "PASS"
    over_http = by_name["tiny overload adaptive over HTTP at 2x capacity: goodput >= 0.8 x peak"]
    assert over_http.verdict == "MISS" and "vs peak 600/s at 1x = 0.50" in over_http.detail  # its own peak
    rows = [line for line in format_overload_table([*grpc, *http]).splitlines() if line.startswith("| tiny |")]
    assert [row.split(" | ")[2] for row in rows] == ["grpc"] * 3 + ["http"] * 3
    mixed = point(MIXED_MODE, 0.65, (cls("tight", good=90, expired=10), cls("loose", good=100)), door="http")
    tight = "tiny mixed adaptive over HTTP at 65% capacity, tight (5.0 ms): misses <= 5%"
    assert mixed_targets([mixed])[0].name == tight
