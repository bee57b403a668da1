"""PNG plots of a run (matplotlib, Agg backend): latency percentiles against throughput, and
the batch sizes the server ran, per model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from trtserve.harness.benchlib.report import MODES, PERCENTILES, Point, RawReference, load_label  # noqa: E402


def _grid(modes: Sequence[str]) -> tuple[plt.Figure, dict[str, plt.Axes]]:
    cols = min(len(modes), 2)
    rows = (len(modes) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(modes):]:
        ax.set_visible(False)
    return fig, dict(zip(modes, axes.flat))


SPAN_FOR_LOG = 10.0
"""Values more than this many times apart: an axis spanning them is logarithmic, and a reference
line this far beyond the measured points is named in the legend instead of drawn."""


def _spans(a: float, b: float) -> bool:
    lo, hi = sorted((a, b))
    return lo <= 0 or hi > SPAN_FOR_LOG * lo


def _reference(ax: plt.Axes, value: float, measured: Sequence[float], vertical: bool, label: str) -> None:
    """A reference line at ``value``, drawn where it is within :data:`SPAN_FOR_LOG` of the
    ``measured`` values, else only named in the legend ("off the axis"), so that it cannot squeeze
    every measured point into one corner (tiny: millions of raw rows/s beside thousands served)."""
    style = {"color": "grey", "linestyle": "-." if vertical else ":"}
    near = measured and not (_spans(value, min(measured)) and _spans(value, max(measured)))
    if near:
        (ax.axvline if vertical else ax.axhline)(value, label=label, **style)
    else:
        ax.plot([], [], label=f"{label}: off the axis", **style)


def plot_latency(model: str, points: Sequence[Point], raw: RawReference | None, path: Path) -> None:
    """Write :func:`latency_figure` to ``path`` (PNG)."""
    fig = latency_figure(model, points, raw)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_figure(model: str, points: Sequence[Point], raw: RawReference | None) -> plt.Figure:
    """Per mode: p50/p90/p99 latency (ms, log scale) against achieved rows/s, one marker per
    sweep point joined in sweep order, with the raw engine's best rows/s (vertical) and
    batch-of-one latency (horizontal) as reference lines. A reference line more than
    :data:`SPAN_FOR_LOG` times beyond the served points is named in the legend, not drawn, and
    the rows/s axis is logarithmic where the served points span that much."""
    modes = [m for m in MODES if any(p.mode == m for p in points)]
    fig, axes = _grid(modes)
    for mode, ax in axes.items():
        rows = [p for p in points if p.mode == mode and p.p50_ms is not None]  # in sweep order
        x = [p.rows_per_s for p in rows]
        latencies = [getattr(p, f"p{q}_ms") for p in rows for q in PERCENTILES]
        for q, style in zip(PERCENTILES, ("o-", "s--", "^:")):
            ax.plot(x, [getattr(p, f"p{q}_ms") for p in rows], style, label=f"p{q}")
        for p in rows:
            ax.annotate(load_label(p), (p.rows_per_s, p.p50_ms), textcoords="offset points", xytext=(4, -10),
                        fontsize=7)
        if raw is not None:
            _reference(ax, raw.best.rows_per_s, x, True, f"raw best ({raw.best.rows_per_s:,.0f} rows/s)")
            _reference(ax, raw.batch1_ms, [v for v in latencies if v], False,
                       f"raw batch-of-one ({raw.batch1_ms:.3g} ms)")
        ax.set_yscale("log")
        if x and min(x) > 0 and _spans(min(x), max(x)):
            ax.set_xscale("log")
        ax.set_title(f"{model} · {mode}")
        ax.set_xlabel("achieved rows/s")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_batches(model: str, points: Sequence[Point], max_batch_size: int, path: Path) -> None:
    """Per mode: the share of engine runs at each batch size (from ModelStatistics), one
    step line per sweep point."""
    modes = [m for m in MODES if any(p.mode == m for p in points)]
    fig, axes = _grid(modes)
    edges = np.arange(0.5, max_batch_size + 1.5)
    for mode, ax in axes.items():
        for p in (p for p in points if p.mode == mode):
            counts = np.array([p.batch_hist.get(b, 0) for b in range(1, max_batch_size + 1)], dtype=float)
            if counts.sum() > 0:
                ax.stairs(counts / counts.sum(), edges, label=f"{load_label(p)}, mean {p.mean_batch:.1f}")
        ax.set_title(f"{model} · {mode}")
        ax.set_xlim(0.5, max_batch_size + 0.5)
        ax.set_xticks([1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size])
        ax.set_xlabel("batch size (rows)")
        ax.set_ylabel("share of engine runs")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:  # every request of the mode failed before it ran
            ax.text(0.5, 0.5, "no engine runs", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_overload(model: str, points: Sequence[Point], path: Path) -> None:
    """Overload sweep: goodput (answers OK within their deadline per second) against offered
    requests per second, one line per policy (and door, where the points have more than one),
    beside the ideal (every offered request in time)."""
    sweeps: dict[str, list[Point]] = {}
    doors = {p.door for p in points}
    for p in points:
        if p.classes:
            sweeps.setdefault((p.policy or "-") + (f" over {p.door}" if len(doors) > 1 else ""), []).append(p)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    top = max(p.load for p in points)
    ax.plot([0, top], [0, top], color="grey", linestyle=":", label="every request in time")
    for policy, sweep in sweeps.items():
        sweep = sorted(sweep, key=lambda p: p.load)
        ax.plot([p.load for p in sweep], [p.classes[0].goodput for p in sweep], "o-", label=policy)
    over = f" over {doors.pop()}" if len(doors) == 1 else ""
    ax.set_title(f"{model} · overload{over}, deadline {points[0].classes[0].deadline_ms:.1f} ms")
    ax.set_xlabel("offered requests/s")
    ax.set_ylabel("goodput (OK within deadline)/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
