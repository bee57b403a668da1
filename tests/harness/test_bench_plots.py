"""The bench's latency plot stays readable when the raw engine is orders of magnitude beyond the
served points (tiny: millions of raw rows/s and a 5 µs batch of one beside a few thousand served
rows/s at a millisecond): such a reference line is named in the legend, not drawn, so the axes fit
the served points; a raw line near them (minilm) is drawn."""

from __future__ import annotations

from trtserve.harness.benchlib.plots import latency_figure
from trtserve.harness.benchlib.report import Point, RawReference, RawSize


def _point(rows_per_s: float, p50_ms: float, callers: int) -> Point:
    return Point(model="m", mode="closed-unary", load=callers, fraction=None, deadline_ms=None, window_s=4.0,
                 requests=1000, ok=1000, rows_per_s=rows_per_s, requests_per_s=rows_per_s, p50_ms=p50_ms,
                 p90_ms=1.3 * p50_ms, p99_ms=2 * p50_ms, errors={}, deadline_misses=0, late_answers=0,
                 mean_batch=1.0, batch_hist={1: 1000}, ratio=None, server_cpu_us_per_request=None,
                 client_cpu_us_per_request=None, send_lag_p99_ms=None)


def _raw(batch1_us: float, best_batch: int, best_us: float) -> RawReference:
    return RawReference("m", (RawSize(1, (batch1_us,) * 10), RawSize(best_batch, (best_us,) * 10)))


def _axes_and_legend(points, raw):
    fig = latency_figure("m", points, raw)
    ax = fig.axes[0]
    return ax, [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_raw_engine_far_beyond_the_served_points_is_named_not_drawn():
    served = [_point(840, 1.2, 1), _point(1490, 2.6, 4), _point(2280, 6.7, 16), _point(2230, 27.0, 64)]
    ax, legend = _axes_and_legend(served, _raw(batch1_us=5.4, best_batch=64, best_us=11.0))  # 5.8 M rows/s
    assert ax.get_xlim()[1] < 10_000, ax.get_xlim()  # not stretched to the raw rows/s
    assert ax.get_ylim()[0] > 0.1, ax.get_ylim()  # nor down to the raw 0.005 ms
    assert sum("off the axis" in t for t in legend) == 2, legend


def test_a_raw_engine_near_the_served_points_is_drawn():
    served = [_point(92, 10.0, 1), _point(106, 37.0, 4), _point(146, 108.0, 16), _point(163, 290.0, 64)]
    ax, legend = _axes_and_legend(served, _raw(batch1_us=6460, best_batch=2, best_us=10900))  # 183 rows/s
    assert ax.get_xlim()[1] > 183 and ax.get_ylim()[0] < 6.46, (ax.get_xlim(), ax.get_ylim())
    assert not any("off the axis" in t for t in legend), legend
