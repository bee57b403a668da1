"""The benchmark's pure parts: statistics, ratios, target checks, tables, arrival schedules.
Small fixed inputs, exact answers; nothing here times anything."""

from __future__ import annotations

import numpy as np
import pytest

from trtserve.harness.benchlib.compare import ONE_CONNECTION_MODE, anchor_targets, comparison_rows, format_comparison
from trtserve.harness.benchlib.deadlines import open_deadline_us
from trtserve.harness.benchlib.policies import (
    CLOSED_MODE,
    OPEN_MODE,
    PolicyChoice,
    format_policy_table,
    goodput,
    miss_share,
    parse_policies,
    policy_targets,
)
from trtserve.harness.benchlib.proctree import tree_cpu_seconds_of, tree_rss_bytes_of
from trtserve.harness.benchlib.protocols import HTTP_MODE, format_protocol_table, parse_protocols, protocol_targets
from trtserve.harness.benchlib.raw import batch_sizes
from trtserve.harness.benchlib.report import (
    Measurement,
    Point,
    RawReference,
    RawSize,
    Snapshot,
    batch_delta,
    check_targets,
    format_row,
    format_tables,
    percentiles_ms,
    ratio,
    summarize,
)
from trtserve.harness.benchlib.workload import poisson_arrivals


def snap(cpu: float = 0.0, client: float = 0.0, rows: int = 0, runs: int = 0,
         batches: dict[int, int] | None = None) -> Snapshot:
    return Snapshot(cpu, client, rows, runs, batches or {})


def measurement(**kw) -> Measurement:
    fields = dict(
        model="minilm", mode="closed-unary", load=4, fraction=None, window_s=2.0, rows_per_request=1,
        latency_us=np.array([1000.0, 2000.0, 3000.0, 4000.0, 500.0]),
        codes=["OK", "OK", "OK", "OK", "RESOURCE_EXHAUSTED"], late=0, deadline_us=None,
        send_lag_us=np.array([]), before=snap(), after=snap(),
    )
    fields.update(kw)
    return Measurement(**fields)


def raw_ref(model: str = "minilm", batch1_us: float = 5000.0, best: tuple[int, float] = (16, 200.0)) -> RawReference:
    """A reference whose batch of one takes ``batch1_us`` and whose best is ``best`` (batch, rows/s)."""
    batch, rows_per_s = best
    return RawReference(model, (RawSize(1, (batch1_us,) * 3), RawSize(batch, (batch / rows_per_s * 1e6,) * 2)))


def test_percentiles_interpolate_linearly_in_ms():
    us = np.array([1000.0, 2000.0, 3000.0, 4000.0, 5000.0])
    assert percentiles_ms(us) == {50: 3.0, 90: 4.6, 99: pytest.approx(4.96)}
    assert percentiles_ms(np.array([]), (50, 99)) == {50: None, 99: None}


def test_ratio_of_served_to_raw():
    assert ratio(180.0, 200.0) == pytest.approx(0.9)
    assert ratio(10.0, 0.0) is None


def test_batch_delta_counts_runs_between_snapshots():
    before = snap(batches={1: 5, 4: 2})
    after = snap(batches={1: 5, 4: 7, 16: 3})
    assert batch_delta(before, after) == {4: 5, 16: 3}


def test_raw_reference_best_and_batch_of_one():
    raw = RawReference("m", (RawSize(1, (2000.0, 3000.0, 4000.0)), RawSize(2, (2000.0, 2000.0)), RawSize(4, (8000.0,))))
    assert raw.batch1_ms == 3.0
    assert raw.sizes[0].rows_per_s == pytest.approx(3 / 0.009)
    assert raw.best.batch == 2 and raw.best.rows_per_s == pytest.approx(1000.0)
    assert raw.summary()["best_batch"] == 2


def test_open_loop_deadline_covers_two_runs_of_the_capacity_batch():
    """minilm-like: 6 ms batch of one, 80 ms batch of 16. At capacity the closed loop ran
    batches of ~12 rows, so the open loop's deadline is 2 x the raw batch of 16, not 4 x 6 ms
    (below one such batch: no server could meet it at 80 % load)."""
    raw = RawReference("m", (RawSize(1, (6000.0,)), RawSize(8, (40000.0,)), RawSize(16, (80000.0,))))
    assert raw.run_ms(11.7) == 80.0 and raw.run_ms(1) == 6.0 and raw.run_ms(64) == 80.0
    assert open_deadline_us(raw.batch1_ms, 4.0, raw.run_ms(11.7)) == 160_000
    assert open_deadline_us(0.005, 4.0, 0.02) == 5_000  # tiny: the 5 ms floor


def test_summarize_counts_ok_rows_errors_batches_and_cpu():
    m = measurement(
        before=snap(cpu=1.0, client=0.5, rows=10, runs=10, batches={1: 10}),
        after=snap(cpu=1.5, client=0.6, rows=14, runs=12, batches={1: 10, 2: 2}),
    )
    p = summarize(m, raw_best_rows_per_s=4.0)
    assert p.requests == 5 and p.ok == 4
    assert p.rows_per_s == 2.0 and p.requests_per_s == 2.0
    assert p.p50_ms == 2.5  # errors are left out of the percentiles
    assert p.errors == {"RESOURCE_EXHAUSTED": 1}
    assert p.deadline_misses == 0
    assert p.mean_batch == 2.0 and p.batch_hist == {2: 2}
    assert p.ratio == 0.5
    assert p.server_cpu_us_per_request == pytest.approx(100_000.0)
    assert p.client_cpu_us_per_request == pytest.approx(20_000.0)
    assert p.send_lag_p99_ms is None


def test_deadline_misses_are_rejections_plus_late_answers():
    m = measurement(mode="open-unary", fraction=0.8, deadline_us=20_000, late=2,
                    codes=["OK", "DEADLINE_EXCEEDED", "OK", "DEADLINE_EXCEEDED", "OK"])
    p = summarize(m, 100.0)
    assert p.deadline_misses == 4 and p.late_answers == 2 and p.deadline_ms == 20.0
    assert p.mean_batch is None  # no engine run in the window


def point(**kw):
    return summarize(measurement(**kw), 200.0)


def test_targets_pass():
    points = [
        point(load=1, latency_us=np.full(5, 5500.0), codes=["OK"] * 5),
        point(load=16, window_s=5 / 190, codes=["OK"] * 5),  # 190 rows/s
        point(model="tiny", load=64, window_s=0.001, codes=["OK"] * 5),
        point(model="tiny", mode="closed-stream", load=64, window_s=0.001, codes=["OK"] * 5),
        point(mode="open-unary", load=150, fraction=0.8, deadline_us=20_000, codes=["OK"] * 5),
    ]
    verdicts = {t.name.split(":")[0]: t.verdict for t in check_targets(points, {"minilm": raw_ref()})}
    assert list(verdicts.values()) == ["PASS", "PASS", "INFO", "INFO", "PASS"]
    tiny = [t for t in check_targets(points, {"minilm": raw_ref()}) if t.name.startswith("tiny unary")][0]
    assert tiny.detail.startswith("5000 req/s")


def test_targets_miss():
    points = [
        point(load=1, latency_us=np.full(5, 6100.0), codes=["OK"] * 5),  # p50 6.1 > 5 + 1 ms
        point(load=64, window_s=5 / 170, codes=["OK"] * 5),  # 170 / 200 = 0.85
        point(mode="open-stream", load=150, fraction=0.8, deadline_us=20_000, late=1, codes=["OK"] * 5),  # 20 % missed
    ]
    targets = check_targets(points, {"minilm": raw_ref()})
    verdicts = [t.verdict for t in targets]
    assert verdicts == ["MISS", "MISS", "SKIP", "SKIP", "MISS"]
    assert "= 0.850" in targets[0].detail and "(closed-unary c=64)" in targets[0].detail
    assert "1 of 5 (20.0%)" in targets[4].detail


def test_targets_skip_without_measurements():
    assert {t.verdict for t in check_targets([], {})} == {"SKIP"}


def test_tables_hold_every_point():
    points = [point(load=1), point(mode="open-unary", load=150.0, fraction=0.8, deadline_us=20_000)]
    text = format_tables(points, {"minilm": raw_ref(batch1_us=10_000.0)})
    assert "minilm · closed-unary" in text and "minilm · open-unary, deadline 20.00 ms" in text
    assert "raw ONNX Runtime best 200.0 rows/s at batch 16" in text
    assert format_row(points[1]).startswith("150/s (80%)")
    assert "RESOURCE_EXHAUSTED 1" in format_row(points[0])


def test_poisson_arrivals_are_sorted_inside_the_span_at_the_rate():
    times = poisson_arrivals(1000.0, 10.0, np.random.default_rng(0))
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < 10.0
    assert abs(len(times) - 10_000) < 500  # 5 standard deviations
    np.testing.assert_array_equal(times, poisson_arrivals(1000.0, 10.0, np.random.default_rng(0)))


def test_batch_sizes_double_up_to_the_maximum():
    assert batch_sizes(16) == [1, 2, 4, 8, 16]
    assert batch_sizes(12) == [1, 2, 4, 8, 12]
    assert batch_sizes(1) == [1]


def stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, name: str = "python -m (x)",
         rss_pages: int = 0) -> str:
    return (f"{pid} ({name}) S {ppid} 2 3 4 5 6 7 8 9 10 {utime} {stime} {cutime} {cstime} "
            f"20 0 4 0 100 4096 {rss_pages} 99")


def test_tree_cpu_seconds_sum_the_root_and_every_descendant():
    stats = {
        10: stat(10, 1, 100, 50, cutime=30, cstime=20),  # root; 0.5 s of reaped children
        11: stat(11, 10, 200, 0, name="tritonserver"),
        12: stat(12, 11, 0, 100, name="stub) S 10 ("),  # a name that looks like fields
        20: stat(20, 1, 999, 999),  # not in the tree
    }
    assert tree_cpu_seconds_of(stats, 10, ticks_per_s=100) == 5.0
    assert tree_cpu_seconds_of(stats, 11, ticks_per_s=100) == 3.0
    assert tree_cpu_seconds_of(stats, 99, ticks_per_s=100) == 0.0


def test_tree_rss_sums_the_live_processes_of_the_tree():
    stats = {
        10: stat(10, 1, 0, 0, rss_pages=100),
        11: stat(11, 10, 0, 0, rss_pages=50, name="engine) S 1 ("),
        12: stat(12, 11, 0, 0, rss_pages=25),
        20: stat(20, 1, 0, 0, rss_pages=1000),  # not in the tree
    }
    assert tree_rss_bytes_of(stats, 10, page_size=4096) == 175 * 4096
    assert tree_rss_bytes_of(stats, 12, page_size=4096) == 25 * 4096
    assert tree_rss_bytes_of(stats, 99, page_size=4096) == 0


def sweep_point(server: str, model: str, callers: int, requests: int, p50_us: float, mode: str = "closed-unary",
                cpu_s: float = 0.0, connections: int = 8, client_s: float = 0.0, codes: tuple[str, ...] = ()) -> Point:
    """``requests`` OK answers in a 1 s window, all at ``p50_us`` (then ``codes``, answered as fast)."""
    answers = ["OK"] * requests + list(codes)
    return summarize(measurement(model=model, mode=mode, load=callers, window_s=1.0, codes=answers,
                                 latency_us=np.full(len(answers), p50_us), before=snap(),
                                 after=snap(cpu=cpu_s, client=client_s), server=server, connections=connections),
                     200.0)


def test_comparison_rows_pair_the_servers_per_caller_count_with_ratios():
    points = [
        sweep_point("trtserve", "tiny", 1, 900, 1000.0), sweep_point("trtserve", "tiny", 64, 2000, 30_000.0),
        sweep_point("trtserve", "tiny", 64, 1800, 32_000.0, mode=ONE_CONNECTION_MODE, connections=1),
        sweep_point("triton", "tiny", 1, 300, 3000.0), sweep_point("triton", "tiny", 64, 2500, 20_000.0),
    ]
    rows = comparison_rows(points, "tiny", "triton")
    assert [r.callers for r in rows] == [1, 64]
    assert rows[0].one_connection is None and rows[1].one_connection.requests_per_s == 1800
    assert rows[0].throughput_ratio == pytest.approx(3.0) and rows[0].p50_ratio == pytest.approx(1 / 3)
    assert rows[1].throughput_ratio == pytest.approx(0.8) and rows[1].p50_ratio == pytest.approx(1.5)
    assert comparison_rows(points, "tiny", None)[0].throughput_ratio is None
    text = format_comparison(points)
    assert "trtserve over 8 connections, over 1, and triton" in text
    assert "0.80" in text and "1.50" in text
    assert format_comparison([sweep_point("trtserve", "tiny", 1, 900, 1000.0)]) == ""  # nothing to compare


def test_anchor_targets_against_triton_and_the_raw_engine():
    raw = {"minilm": raw_ref(batch1_us=5000.0, best=(16, 250.0))}
    points = [
        sweep_point("trtserve", "tiny", 16, 2400, 5000.0),
        sweep_point("trtserve", "tiny", 64, 2300, 20_000.0, cpu_s=0.92),
        sweep_point("triton", "tiny", 64, 1900, 25_000.0, cpu_s=1.14),
        sweep_point("trtserve", "minilm", 1, 150, 5800.0), sweep_point("trtserve", "minilm", 64, 240, 300_000.0),
        sweep_point("triton", "minilm", 1, 140, 6600.0), sweep_point("triton", "minilm", 64, 200, 300_000.0),
    ]
    peak, saturation, one, cpu = anchor_targets(points, raw)
    assert peak.verdict == "PASS" and "2400 (c=16) / 1900 (c=64) = 1.26" in peak.detail
    assert saturation.verdict == "PASS"
    assert "240.0 / 250.0 (raw batch 16) = 0.96; triton 200.0 = 0.80" in saturation.detail
    assert one.verdict == "PASS" and one.detail.endswith("triton 6.60 ms")
    assert cpu.verdict == "INFO" and cpu.detail == "trtserve 400 us vs triton 600 us"
    slower = [*points, sweep_point("triton", "tiny", 16, 2100, 7000.0)]  # 2400 / 2100 < 1.2
    assert anchor_targets(slower, raw)[0].verdict == "MISS"


def test_anchor_targets_without_a_peer():
    points = [sweep_point("trtserve", "minilm", 1, 150, 6500.0), sweep_point("trtserve", "minilm", 64, 150, 300_000.0)]
    peak, saturation, one, cpu = anchor_targets(points, {"minilm": raw_ref()})
    assert peak.verdict == "SKIP" and "--peer triton" in peak.detail
    assert saturation.verdict == "MISS" and "triton" not in saturation.detail  # 150 / 200 = 0.75
    assert one.verdict == "MISS" and cpu.verdict == "SKIP"


def test_trtserve_tables_and_targets_leave_the_peer_out():
    points = [sweep_point("triton", "minilm", 1, 500, 1000.0)]
    assert "minilm · closed-unary" not in format_tables(points, {})
    assert {t.verdict for t in check_targets(points, {})} == {"SKIP"}


def policy_point(policy: str, ok: int, late: int = 0, refused: int = 0, fraction: float = 0.8) -> Point:
    codes = ["OK"] * ok + ["DEADLINE_EXCEEDED"] * refused
    return summarize(measurement(mode=OPEN_MODE, load=100.0, fraction=fraction, window_s=5.0, codes=codes,
                                 latency_us=np.full(len(codes), 20_000.0), late=late, deadline_us=90_000,
                                 policy=policy), 200.0)


def test_policy_items_parse_to_adaptive_and_fixed_timers():
    assert parse_policies("adaptive, fixed:0.5,fixed:10") == [
        PolicyChoice("adaptive", True, 0),
        PolicyChoice("fixed 0.5 ms", False, 500),
        PolicyChoice("fixed 10 ms", False, 10_000),
    ]
    for bad in ("fixed", "fixed:-1", "timer:2", "fixed:x"):
        with pytest.raises(ValueError, match="expected 'adaptive' or 'fixed"):
            parse_policies(bad)


def test_goodput_counts_only_answers_within_the_deadline():
    p = policy_point("adaptive", ok=400, late=25, refused=75)
    assert goodput(p) == pytest.approx((400 - 25) / 5.0)
    assert miss_share(p) == pytest.approx(100 / 475)


def test_adaptive_against_the_best_fixed_timer_within_two_standard_errors():
    # Rounds of the best fixed timer: 130 and 120/s (5 s windows); adaptive steady.
    best = [policy_point("fixed 0.5 ms", ok=650), policy_point("fixed 0.5 ms", ok=600)]
    others = [*best, policy_point("fixed 10 ms", ok=500, refused=125), policy_point("fixed 10 ms", ok=520, refused=105)]
    spread = 5.0  # sample deviation of (130, 120) is 7.07; / sqrt(2) = 5.0, above the counting error
    # 114/s; its s.e. is counting, sqrt(1140)/10
    steady = [policy_point("adaptive", ok=570), policy_point("adaptive", ok=570)]
    noise = (spread**2 + 1140 / 100) ** 0.5
    (target,) = policy_targets([*steady, *others])
    assert target.verdict == "PASS" and "(fixed 0.5 ms)" in target.detail  # 11/s behind, within 2 x 6.0
    assert f"difference -11.0 ± {noise:.1f}/s" in target.detail and "over 2 rounds" in target.detail
    # 108/s: 17 behind
    behind = [policy_point("adaptive", ok=540, refused=85), policy_point("adaptive", ok=540, refused=85)]
    (target,) = policy_targets([*behind, *others])
    assert target.verdict == "MISS"
    half = [policy_point("adaptive", ok=100, fraction=0.5), policy_point("fixed 2 ms", ok=200, fraction=0.5)]
    (other_rate,) = policy_targets(half)
    # every row has the target
    assert other_rate.verdict == "MISS" and other_rate.name.startswith("minilm open-stream 100/s (50%)")
    table = format_policy_table([*steady, *others])
    assert "fixed 10 ms" in table and "102.0" in table and "100 / 104" in table
    assert "18.4%" in table  # misses (125 + 105) / 1250


def closed_policy_point(policy: str, callers: int, ok: int, model: str = "tiny") -> Point:
    return summarize(measurement(model=model, mode=CLOSED_MODE, load=callers, window_s=1.0, codes=["OK"] * ok,
                                 latency_us=np.full(ok, 5000.0), policy=policy), 200.0)


def test_closed_loop_rows_of_the_policy_comparison_get_a_target_each():
    points = [
        closed_policy_point("adaptive", 16, 800), closed_policy_point("fixed 2 ms", 16, 1250),
        closed_policy_point("adaptive", 16, 820), closed_policy_point("fixed 2 ms", 16, 1230),
        closed_policy_point("adaptive", 64, 1240), closed_policy_point("fixed 2 ms", 64, 1250),
        closed_policy_point("adaptive", 64, 1200), closed_policy_point("fixed 2 ms", 64, 1260),
        policy_point("adaptive", ok=600), policy_point("fixed 2 ms", ok=600),  # an open-loop row of minilm
    ]
    targets = policy_targets(points)
    assert [t.name for t in targets] == [
        "tiny closed-unary c=16: adaptive >= best fixed timer within 2 s.e.",
        "tiny closed-unary c=64: adaptive >= best fixed timer within 2 s.e.",
        "minilm open-stream 100/s (80%): adaptive >= best fixed timer within 2 s.e.",
    ]
    assert [t.verdict for t in targets] == ["MISS", "PASS", "PASS"]
    assert "(rounds 800 / 820 vs 1250 / 1230)" in targets[0].detail  # the rounds' spread beside the verdict
    table = format_policy_table(points)
    assert "closed-unary c=64" in table and "1220.0" in table and "1240 / 1200" in table
    assert "minilm · adaptive vs fixed queue delay" in table and "open-stream 100/s (80%)" in table


def test_protocol_items_parse_to_the_doors_in_order():
    assert parse_protocols("grpc,http") == ["grpc", "http"]
    assert parse_protocols(" HTTP , grpc,http") == ["http", "grpc"]
    for bad in ("grpc,ftp", ",", "rest"):
        with pytest.raises(ValueError, match=f"expected grpc and/or http separated by commas, got '{bad}'"):
            parse_protocols(bad)


def door_points() -> list[Point]:
    """tiny at 64 callers: trtserve 1 000 us of server CPU per call over gRPC, 300 over HTTP."""
    return [
        sweep_point("trtserve", "tiny", 64, 2000, 20_000.0, cpu_s=2.0, client_s=0.4),
        sweep_point("trtserve", "tiny", 1, 800, 1200.0, mode=HTTP_MODE, cpu_s=0.4, connections=1),
        sweep_point("trtserve", "tiny", 64, 3000, 15_000.0, mode=HTTP_MODE, cpu_s=0.9, client_s=0.3, connections=64),
    ]


def test_protocol_targets_pass_on_cheaper_http_and_a_higher_http_peak():
    points = [*door_points(), sweep_point("triton", "tiny", 64, 2400, 20_000.0, mode=HTTP_MODE, connections=64),
              sweep_point("triton", "tiny", 64, 9000, 5000.0)]  # the peer's gRPC peak is not its HTTP peak
    cpu, peak = protocol_targets(points)
    assert cpu.verdict == "PASS" and cpu.name.startswith("tiny at 64 callers: server CPU per call over HTTP <= 0.4")
    assert cpu.detail == "300/1000 us = 0.30; bench client CPU per call 100/200 us = 0.50"
    assert peak.verdict == "PASS" and peak.name == "tiny peak rows/s over HTTP >= 1.2 x triton's HTTP peak"
    assert peak.detail == "3000 (c=64) / 2400 (c=64) = 1.25"


def test_protocol_targets_miss_and_skip():
    dear = [*door_points()[:2], sweep_point("trtserve", "tiny", 64, 2500, 15_000.0, mode=HTTP_MODE, cpu_s=1.25)]
    points = [*dear, sweep_point("triton", "tiny", 16, 2200, 7000.0, mode=HTTP_MODE)]
    cpu, peak = protocol_targets(points)
    assert cpu.verdict == "MISS" and cpu.detail.startswith("500/1000 us = 0.50")  # 0.5 > 0.4
    assert peak.verdict == "MISS" and peak.detail == "2500 (c=64) / 2200 (c=16) = 1.14"
    cpu, peak = protocol_targets(door_points()[1:])  # no gRPC sweep, no peer
    assert cpu.verdict == "SKIP" and "--protocol grpc,http" in cpu.detail
    assert peak.verdict == "SKIP" and peak.name.endswith("the peer's HTTP peak")


def test_the_door_table_labels_every_row_and_gives_the_http_to_grpc_ratios():
    points = [*door_points(), sweep_point("triton", "tiny", 64, 2400, 20_000.0, mode=HTTP_MODE, codes=("HTTP 503",))]
    lines = format_protocol_table(points).splitlines()
    rows = [line.split()[:3] for line in lines if line.startswith(("trtserve", "triton"))]
    assert rows == [["trtserve", "grpc", "c=64"], ["trtserve", "http", "c=1"], ["trtserve", "http", "c=64"],
                    ["triton", "http", "c=64"]]
    assert "HTTP 503 1" in next(line for line in lines if line.startswith("triton"))
    (ratios,) = [line for line in lines if "http/grpc" in line]  # only c=64 ran over both doors
    assert ratios.split() == ["c=64", "trtserve", "http/grpc:", "server", "CPU", "per", "call", "300/1000", "us", "=",
                              "0.30,", "client", "CPU", "per", "call", "100/200", "us", "=", "0.50,", "rows/s",
                              "3000/2000", "=", "1.50"]
    assert format_protocol_table(door_points()[:1]) == ""  # no HTTP point, no table
