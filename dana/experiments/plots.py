"""The report's PNG figures, each written atomically.

- ``error_curves.png``: test error against epochs, one panel per worker count, one line
  per algorithm (mean over seeds at each evaluation), the baseline dashed in each panel;
- ``error_vs_workers.png``: final test error against k, one line per algorithm, the
  baseline as a dashed line; an ``x`` at the top where every seed diverged;
- ``gap_vs_workers.png``: the mean gap against k (log scale);
- ``speedup_vs_workers.png``: the speed-up over ssgd in simulated time to the target.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from dana.atomic import atomic_path
from dana.experiments.results import Group, Results


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _colors(rows: list[str]) -> dict[str, str]:
    palette = [f"C{i}" for i in range(10)]
    return {row: palette[i % 10] for i, row in enumerate(rows)}


def mean_curve(group: Group) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, mean test error in %) over the group's runs, at each evaluation epoch
    where every run that got that far has a finite error (a diverged run ends early)."""
    by_epoch: dict[float, list[float]] = defaultdict(list)
    for run in group.runs:
        for row in run.metrics:
            if math.isfinite(row["test_error"]):
                by_epoch[round(row["epoch"], 6)].append(row["test_error"])
    epochs = np.array(sorted(by_epoch))
    return epochs, np.array([100 * np.mean(by_epoch[e]) for e in epochs])


def plot_error_curves(results: Results, path: Path) -> Path:
    plt = _pyplot()
    workers = [k for k in results.workers if k > 1] or results.workers
    cols = min(3, len(workers))
    nrows = math.ceil(len(workers) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False, sharey=True
    )
    colors = _colors(results.rows)
    base = results.baseline()
    for ax, k in zip(axes.flat, workers):
        if base is not None:
            ax.plot(*mean_curve(base), "k--", lw=1.2, label=f"{base.row} k=1 (baseline)")
        for row in results.rows:
            group = results.group(row, k)
            if group is None or group is base:
                continue
            epochs, errors = mean_curve(group)
            ax.plot(epochs, errors, color=colors[row], marker=".", label=row)
        ax.set(title=f"k = {k}", xlabel="epoch", ylabel="test error (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workers) :]:
        ax.axis("off")
    fig.tight_layout()
    handles, labels = _legend_entries(axes)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return _save(fig, path)


def _legend_entries(axes) -> tuple[list, list]:
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


def _by_workers(results: Results, value) -> dict[str, tuple[list[int], list[float], list[int]]]:
    """Per row: worker counts with a value, the values, and worker counts all diverged."""
    base = results.baseline()
    out = {}
    for row in results.rows:
        ks, vals, diverged = [], [], []
        for k in results.workers:
            group = results.group(row, k)
            if group is None or group is base or not group.results:
                continue
            v = value(group)
            if math.isfinite(v):
                ks.append(k)
                vals.append(v)
            elif group.diverged == len(group.results):
                diverged.append(k)
        out[row] = (ks, vals, diverged)
    return out


def _jitter(ks: list[int], index: int, count: int) -> list[float]:
    """Worker counts nudged sideways (on the log axis) so that equal values stay visible."""
    return [k * 2 ** (0.05 * (index - (count - 1) / 2)) for k in ks]


def _legend_outside(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))


def _workers_axis(ax, results: Results) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(results.workers, [str(k) for k in results.workers])
    ax.set_xlabel("workers k")
    ax.grid(alpha=0.3)


def plot_error_vs_workers(results: Results, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = _colors(results.rows)
    series = _by_workers(
        results, lambda g: 100 * float(np.mean(g.errors())) if len(g.errors()) else math.nan
    )
    top = max([v for ks, vals, _ in series.values() for v in vals] + [10.0]) * 1.05
    for i, (row, (ks, vals, diverged)) in enumerate(series.items()):
        ax.plot(_jitter(ks, i, len(series)), vals, marker="o", color=colors[row], label=row)
        if diverged:
            x = _jitter(diverged, i, len(series))
            ax.plot(x, [top] * len(diverged), "x", color=colors[row], ms=9)
    base = results.baseline()
    if base is not None and len(base.errors()):
        ax.axhline(100 * base.errors().mean(), color="k", ls="--", lw=1, label="baseline k=1")
    ax.set(ylabel="final test error (%)", title="final test error (x at top: diverged)")
    _workers_axis(ax, results)
    _legend_outside(ax)
    fig.tight_layout()
    return _save(fig, path)


def plot_gap_vs_workers(results: Results, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = _colors(results.rows)
    series = _by_workers(results, lambda g: float(g.gaps().mean()) if len(g.gaps()) else math.nan)
    for i, (row, (ks, vals, _)) in enumerate(series.items()):
        ax.plot(_jitter(ks, i, len(series)), vals, marker="o", color=colors[row], label=row)
    ax.set_yscale("log")
    ax.set(ylabel="mean gap RMS(theta - p_i)", title="mean gap (ssgd: 0, not shown)")
    _workers_axis(ax, results)
    _legend_outside(ax)
    fig.tight_layout()
    return _save(fig, path)


def plot_speedups(
    results: Results, speedups: dict[str, dict[int, float]], target: float, path: Path
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = _colors(results.rows)
    for row in results.rows:
        points = sorted(speedups.get(row, {}).items())
        if points:
            ax.plot(*zip(*points), marker="o", color=colors[row], label=row)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(
        ylabel="speed-up over ssgd (simulated time)",
        title=f"speed-up to {100 * target:.2f}% test error",
    )
    _workers_axis(ax, results)
    if ax.get_legend_handles_labels()[0]:
        _legend_outside(ax)
    else:
        ax.text(
            0.5,
            0.5,
            "no algorithm and ssgd both reached the target",
            ha="center",
            transform=ax.transAxes,
        )
    fig.tight_layout()
    return _save(fig, path)
