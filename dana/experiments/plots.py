"""The report's PNG figures, each written atomically.

Each shows the report's metric (:class:`~dana.experiments.results.Metric`): the test
error in %, or the test loss where there is no error to compare (a language model's
with its perplexity, ``exp(loss)``, on a second axis).

- ``error_curves.png``: test error against epochs, one panel per worker count, one line
  per algorithm (mean over seeds at each evaluation), the baseline dashed in each panel;
- ``error_vs_workers.png``: final test error against k, one line per algorithm, the
  baseline as a dashed line;
- ``gap_vs_workers.png``: the mean gap against k (log scale);
- ``speedup_vs_workers.png``: per target, the speed-up over ssgd in simulated time to
  it (a hollow triangle: at least this much, where ssgd never reached the target), and
  a grid of every cell's speed-up or why it has none; drawn only when some cell has a
  speed-up or a bound (the report says why there is none otherwise);
- ``error_vs_time.png`` (runs on a cluster): test error against simulated time (log
  scale), one panel per cluster (and data split) and k, the targets dotted;
- ``class_shares.png`` (runs with the bias meter): each class's share of the applied
  updates minus its share of the data.

In the two plots against k, a value with a diverged seed is an ``x`` (at the top edge
when every seed diverged), and the y-axis ends at a robust limit (:func:`robust_top`: a
multiple of the largest per-k median of the values without a diverged seed), so that
one absurd value cannot flatten the others: a value above it is a ``^`` at the top edge
("off scale").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dana.atomic import atomic_path
from dana.experiments.results import Group, Metric, Results
from dana.experiments.targets import Target, speedup_bounds, speedup_cells
from dana.figures import subplots


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return path


#: The one-worker baseline's curve in every plot that draws one, and its legend label
#: (one label, so that the figure's legend lists it once over all panels).
BASELINE_STYLE = {"color": "k", "ls": "--", "lw": 1.2}


def baseline_label(row: str) -> str:
    return f"{row} k=1 (baseline)"


#: Line styles, one per pass through the ten colours: rows 11 to 20 are dashed, and so
#: on, so that no two of up to 40 rows look alike.
LINE_STYLES = ("-", "--", ":", "-.")
#: Markers, one per row (cycled with a period prime to the colours'): a method is told
#: apart by its marker too, in print and for readers who do not tell colours apart.
MARKERS = "osD^vP*Xh<>p8"


def _styles(rows: list[str]) -> dict[str, dict[str, str]]:
    """Each row's ``color``, ``ls`` and ``marker`` (matplotlib's keywords), distinct for
    up to 40 rows: the ten default colours, then again with the next line style, and a
    marker of its own."""
    return {
        row: {
            "color": f"C{i % 10}",
            "ls": LINE_STYLES[(i // 10) % len(LINE_STYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, row in enumerate(rows)
    }


def _by_epoch(group: Group) -> dict[float, list[float]]:
    """The group's finite values of the metric (scaled: % for an error) at each
    evaluation epoch."""
    by_epoch: dict[float, list[float]] = defaultdict(list)
    key, scale = group.metric.key, group.metric.scale
    for run in group.runs:
        for row in run.metrics:
            if math.isfinite(row[key]):
                by_epoch[round(row["epoch"], 6)].append(scale * row[key])
    return by_epoch


def mean_curve(group: Group) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, mean of the metric: test error in %, or test loss) over the group's
    runs, at each evaluation epoch where every run that got that far has a finite
    value (a diverged run ends early)."""
    by_epoch = _by_epoch(group)
    epochs = np.array(sorted(by_epoch))
    return epochs, np.array([np.mean(by_epoch[e]) for e in epochs])


def seed_band(group: Group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epochs, lowest, highest seed) at each evaluation epoch two or more seeds reached."""
    by_epoch = _by_epoch(group)
    epochs = np.array([e for e in sorted(by_epoch) if len(by_epoch[e]) > 1])
    low = np.array([min(by_epoch[e]) for e in epochs])
    return epochs, low, np.array([max(by_epoch[e]) for e in epochs])


def heading(results: Results) -> str:
    """What a plot's titles name: the study (its folder), and its cluster and data split
    where it has them."""
    config = results.runs[0].config if results.runs else {}
    parts = [results.path.name]
    cluster = config.get("cluster")
    if cluster:
        parts.append(
            f"cluster {cluster.get('name', 'custom') if isinstance(cluster, dict) else cluster}"
        )
    if cluster or config.get("partition", "iid") != "iid":
        parts.append(f"{config.get('partition', 'iid')} data")
    return ", ".join(parts)


def _band(ax, group: Group, color: str) -> None:
    """The group's seed spread as a shaded band (nothing for one seed)."""
    epochs, low, high = seed_band(group)
    if len(epochs):
        ax.fill_between(epochs, low, high, color=color, alpha=0.15, lw=0)


#: A loss plot's y axis ends at this many times the largest test loss at the start (a
#: language model's: about log(vocabulary), chance): a run that blew up is off scale.
LOSS_CLIP_FACTOR = 1.5


def loss_ceiling(results: Results) -> float:
    """Where a loss plot's y axis ends: :data:`LOSS_CLIP_FACTOR` times the largest finite
    test loss of a first row (at the start) of any run; inf where there is none, or
    where the report compares something else than the test loss."""
    if results.metric.key != "test_loss":
        return math.inf
    starts = [
        r.metrics[0][results.metric.key]
        for r in results.runs
        if r.metrics and math.isfinite(r.metrics[0][results.metric.key])
    ]
    return LOSS_CLIP_FACTOR * max(starts) if starts and max(starts) > 0 else math.inf


def _perplexity_axis(ax, metric: Metric) -> None:
    """A second y axis giving a language model's loss as its perplexity, exp(loss)."""
    if metric.perplexity:
        from matplotlib.ticker import LogLocator

        def forward(v):
            return np.exp(np.minimum(v, 700.0))

        def inverse(v):
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.log(np.maximum(v, 1e-300))

        axis = ax.secondary_yaxis("right", functions=(forward, inverse))
        axis.yaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
        axis.set_ylabel("perplexity")


def plot_error_curves(results: Results, path: Path) -> Path:
    ks = [k for k in results.worker_counts if k > 1] or results.worker_counts
    cols = min(3, len(ks))
    nrows = math.ceil(len(ks) / cols)
    fig, axes = subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False, sharey=True)
    styles = _styles(results.rows)
    base = results.baseline()
    ceiling = loss_ceiling(results)
    shown: list[float] = []  # the plotted values under the ceiling
    for ax, k in zip(axes.flat, ks):
        if base is not None:
            epochs, values = mean_curve(base)
            ax.plot(epochs, values, **BASELINE_STYLE, label=baseline_label(base.row))
            _band(ax, base, BASELINE_STYLE["color"])
            shown += [v for v in values if v <= ceiling]
        for row in results.rows:
            group = results.group(row, k)
            if group is None or group is base:
                continue
            epochs, errors = mean_curve(group)
            ax.plot(epochs, errors, **styles[row], ms=4, markevery=0.1, label=row)
            _band(ax, group, styles[row]["color"])
            shown += [v for v in errors if v <= ceiling]
        for name, loss in results.references().items():
            ax.axhline(loss, color="0.4", ls=":", lw=1, label=f"byte {name} model")
        ax.set(
            title=f"{heading(results)}: k = {k}",
            xlabel="epoch",
            ylabel=results.metric.title.replace(" (perplexity)", ""),
        )
        ax.grid(alpha=0.3)
    if shown and max(ax.get_ylim()[1] for ax in axes.flat[: len(ks)]) > ceiling:
        # a run that blew up leaves the shared axis at the top
        low, high = min(shown), max(shown)
        axes.flat[0].set_ylim(low - 0.05 * (high - low), ceiling)
    for ax in axes.flat[: len(ks)]:
        _perplexity_axis(ax, results.metric)
    _finish_grid(fig, axes, len(ks))
    return _save(fig, path)


def _finish_grid(fig, axes, used: int) -> None:
    """A grid of panels made whole: the panels past the first ``used`` hidden, and one
    legend for all, right of the grid (each label once)."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    fig.tight_layout()
    handles, labels = _legend_entries(axes)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def _legend_entries(axes) -> tuple[list, list]:
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


#: The error plot's y-axis ends at this many times the largest per-k median of the
#: plotted values (never above 100%): a run at chance (90% on ten classes) beside runs
#: near 10% is marked off scale at the top edge instead of flattening them.
ERROR_CLIP_FACTOR = 3.0
#: The gap plot's (log) y-axis ends at this many times the largest per-k median: a
#: diverged run's gap (up to 1e13 and more) would otherwise flatten every other line.
GAP_CLIP_FACTOR = 100.0
DIVERGED_MARKER, OFF_SCALE_MARKER = "x", "^"
#: A lower bound on a speed-up (ssgd never reached the target): a hollow triangle.
BOUND_MARKER, BOUND_LABEL = "o", "hollow: at least (ssgd not reached)"


@dataclass
class Point:
    """One (row, k) value of a plot against k; ``diverged``: a seed diverged."""

    workers: int
    value: float  # NaN: no value (every seed diverged)
    diverged: bool


def _points(results: Results, value) -> dict[str, list[Point]]:
    """Per row, its points at the worker counts where it has a result (the baseline's
    group aside); a point without a finite value is kept only when a seed diverged."""
    base = results.baseline()
    out: dict[str, list[Point]] = {}
    for row in results.rows:
        points = []
        for k in results.worker_counts:
            group = results.group(row, k)
            if group is None or group is base or not group.results:
                continue
            v = value(group)
            if math.isfinite(v) or group.diverged:
                points.append(Point(k, v if math.isfinite(v) else math.nan, group.diverged > 0))
        out[row] = points
    return out


def robust_top(series: dict[str, list[Point]], factor: float, positive: bool = False) -> float:
    """``factor`` times the largest per-k median of the finite values of points without
    a diverged seed (only values > 0 when ``positive``, for a log axis); NaN if none."""
    by_k: dict[int, list[float]] = defaultdict(list)
    for points in series.values():
        for p in points:
            if not p.diverged and math.isfinite(p.value) and (p.value > 0 or not positive):
                by_k[p.workers].append(p.value)
    medians = [float(np.median(v)) for v in by_k.values()]
    return factor * max(medians) if medians else math.nan


def _draw_against_workers(ax, results: Results, series, top: float, log: bool) -> None:
    """Lines of the ordinary points; diverged and off-scale points as markers of their
    own, those without a value or above ``top`` drawn at the top edge."""
    styles = _styles(results.rows)
    values = [
        p.value
        for ps in series.values()
        for p in ps
        if math.isfinite(p.value) and (p.value > 0 or not log)
    ]
    shown = [v for v in values if not (v > top)]
    edge = max(shown) if shown else (top if math.isfinite(top) else 1.0)
    if any(v > top for v in values) or any(
        not math.isfinite(p.value) for ps in series.values() for p in ps
    ):
        edge = edge * (2.0 if log else 1.08)
    marked = {"diverged": False, "off scale": False}
    for i, (row, points) in enumerate(series.items()):
        plain = [p for p in points if not p.diverged and not p.value > top]
        plain = [p for p in plain if math.isfinite(p.value) and (p.value > 0 or not log)]
        x = _jitter([p.workers for p in plain], i, len(series))
        label = row
        if plain:
            ax.plot(x, [p.value for p in plain], **styles[row], label=label)
            label = None
        for p in points:
            if p in plain or (log and math.isfinite(p.value) and p.value <= 0):
                continue
            off = not math.isfinite(p.value) or p.value > top
            marker = DIVERGED_MARKER if p.diverged else OFF_SCALE_MARKER
            marked["diverged" if p.diverged else "off scale"] = True
            (xj,) = _jitter([p.workers], i, len(series))
            y = edge if off else p.value
            ax.plot([xj], [y], marker, color=styles[row]["color"], ms=9, mew=2, label=label)
            label = None
    if log:
        ax.set_yscale("log")
    bottom, _ = ax.get_ylim()
    ax.set_ylim(bottom, edge * (1.5 if log else 1.04))
    if marked["diverged"]:
        ax.plot(
            [],
            [],
            DIVERGED_MARKER,
            color="k",
            ms=9,
            mew=2,
            label="diverged seed (at the top edge: off scale or no value)",
        )
    if marked["off scale"]:
        ax.plot(
            [], [], OFF_SCALE_MARKER, color="k", ms=9, mew=2, label="off scale (at the top edge)"
        )


def _jitter(ks: list[int], index: int, count: int) -> list[float]:
    """Worker counts nudged sideways (on the log axis) so that equal values stay visible."""
    return [k * 2 ** (0.05 * (index - (count - 1) / 2)) for k in ks]


def _legend_outside(ax, right: float = 1.02) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(right, 0.5))


def _workers_axis(ax, results: Results) -> None:
    """A log2 axis of the worker counts, half an octave beyond each end (the jittered
    points of the outermost counts stay inside)."""
    ax.set_xscale("log", base=2)
    ks = results.worker_counts
    ax.set_xlim(min(ks) / 2**0.5, max(ks) * 2**0.5)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("workers k")
    ax.grid(alpha=0.3)


def error_vs_workers_figure(results: Results):
    """The figure of ``error_vs_workers.png`` (its axes: ``fig.axes[0]``)."""
    fig, ax = subplots(figsize=(7, 4.5))
    metric = results.metric
    series = _points(
        results,
        lambda g: metric.scale * float(np.mean(g.finals())) if len(g.finals()) else math.nan,
    )
    ceiling = 100.0 if metric.is_error else loss_ceiling(results)
    top = min(ceiling, robust_top(series, ERROR_CLIP_FACTOR))
    _draw_against_workers(ax, results, series, top if math.isfinite(top) else ceiling, log=False)
    base = results.baseline()
    if base is not None and len(base.finals()):
        level = metric.scale * float(base.finals().mean())
        ax.axhline(level, color="k", ls="--", lw=1, label="baseline k=1")
        bottom, top = ax.get_ylim()  # (set before the line: it must lie inside them)
        if level < bottom:
            ax.set_ylim(max(0.0, level - 0.05 * (top - level)), top)
    name = metric.title.replace(" (perplexity)", "")
    ax.set(ylabel=f"final {name}", title=f"final {metric.name} (mean over seeds)")
    _perplexity_axis(ax, metric)
    _workers_axis(ax, results)
    fig.tight_layout()
    _legend_outside(ax, 1.14 if metric.perplexity else 1.02)
    return fig


def plot_error_vs_workers(results: Results, path: Path) -> Path:
    return _save(error_vs_workers_figure(results), path)


def gap_vs_workers_figure(results: Results):
    """The figure of ``gap_vs_workers.png`` (its axes: ``fig.axes[0]``)."""
    fig, ax = subplots(figsize=(7, 4.5))
    series = _points(results, lambda g: float(g.gaps().mean()) if len(g.gaps()) else math.nan)
    top = robust_top(series, GAP_CLIP_FACTOR, positive=True)
    _draw_against_workers(ax, results, series, top if math.isfinite(top) else math.inf, log=True)
    ax.set(ylabel="mean gap RMS(theta - p_i)", title="mean gap (ssgd: 0, not shown)")
    _workers_axis(ax, results)
    fig.tight_layout()
    _legend_outside(ax)
    return fig


def plot_gap_vs_workers(results: Results, path: Path) -> Path:
    return _save(gap_vs_workers_figure(results), path)


def speedups_figure(results: Results, targets: list[Target]):
    """The figure of ``speedup_vs_workers.png``: per target a panel of the speed-up over
    SSGD against k and under it a grid (row x k) giving each cell's speed-up or why it
    has none; a target not used says why instead."""
    rows = [r for r in results.rows if any(k > 1 for rr, k in results.groups if rr == r)]
    ks = [k for k in results.worker_counts if k > 1] or results.worker_counts
    height = 0.28 * max(len(rows), 1) + 0.8
    fig, axes = subplots(
        2,
        len(targets),
        figsize=(6.5 * len(targets), 4.2 + height),
        squeeze=False,
        gridspec_kw={"height_ratios": [4.2, height]},
    )
    styles = _styles(results.rows)
    for column, target in enumerate(targets):
        ax, grid = axes[0, column], axes[1, column]
        title = f"speed-up over ssgd to {results.metric.show(target.value)}"
        ax.set(ylabel="speed-up over ssgd (simulated time)", title=title)
        _workers_axis(ax, results)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlim(min(ks) / 1.5, max(ks) * 1.5)
        grid.axis("off")
        if target.skip is not None:
            ax.text(
                0.5,
                0.5,
                "not used: the baseline reaches it\nat its first evaluation",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            continue
        cells = speedup_cells(results, target.value)
        bounds = speedup_bounds(results, target.value)
        for row in rows:
            points = sorted((k, up) for (r, k), (up, _) in cells.items() if r == row and up)
            label = row
            if points:
                ax.plot(*zip(*points), **styles[row], label=label)
                label = None
            at_least = sorted((k, b) for (r, k), b in bounds.items() if r == row)
            for k, b in at_least:
                style = styles[row]  # (hollow: a lower bound)
                ax.plot(
                    [k], [b], style["marker"], color=style["color"], ms=9, mfc="none", label=label
                )
                label = None
        if bounds:
            ax.plot([], [], BOUND_MARKER, color="k", ms=9, mfc="none", label=BOUND_LABEL)
        ax.axhline(1.0, color="k", lw=0.8)
        if not cells_to_plot(cells, bounds):
            ax.text(
                0.5,
                0.5,
                "no algorithm and ssgd both reached the target",
                ha="center",
                transform=ax.transAxes,
            )
        _speedup_grid(grid, rows, ks, cells, styles, bounds)
    handles, labels = _legend_entries(axes[0:1])
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8)
    fig.tight_layout()
    return fig


def cells_to_plot(cells, bounds) -> bool:
    """Whether a speed-up panel has anything to draw: a speed-up or a lower bound."""
    return bool(bounds) or any(up is not None for up, _ in cells.values())


def _speedup_grid(ax, rows: list[str], ks: list[int], cells, styles, bounds) -> None:
    """Text grid: one line per row, one column per k, the speed-up, its lower bound where
    ssgd never reached the target, or why there is none."""
    n = len(rows)
    ax.axis("on")
    ax.set_xscale("log", base=2)  # the columns line up with the panel's k above
    ax.set_xlim(min(ks) / 1.5, max(ks) * 1.5)
    ax.set_ylim(n - 0.5, -1.5)
    ax.set_xticks([])
    ax.set_xticks([], minor=True)
    ax.set_yticks(range(n), rows, fontsize=7)
    for tick, row in zip(ax.get_yticklabels(), rows):
        tick.set_color(styles[row]["color"])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)
    for k in ks:
        ax.text(k, -1, f"k={k}", ha="center", va="center", fontsize=7, weight="bold")
        for i, row in enumerate(rows):
            if (row, k) not in cells:
                text, style = "—", "normal"
            else:
                up, why = cells[(row, k)]
                text, style = (f"{up:.2f}×", "normal") if up is not None else (why, "italic")
                if (row, k) in bounds:  # (ssgd not reached: the legend's triangle)
                    text = f"> {bounds[(row, k)]:.2f}×"
            ax.text(
                k,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7,
                style=style,
                color="0.45" if style == "italic" else "k",
            )


def plot_speedups(results: Results, targets: list[Target], path: Path) -> Path:
    return _save(speedups_figure(results, targets), path)


def mean_time_curve(group: Group) -> tuple[np.ndarray, np.ndarray]:
    """(simulated time in s, mean of the metric: test error in %, or test loss) over the
    group's runs at each evaluation epoch every run reached with a finite value: the
    mean of their times and of their values there."""
    key, scale = group.metric.key, group.metric.scale
    by_epoch: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for run in group.runs:
        for row in run.metrics:
            if math.isfinite(row[key]) and math.isfinite(row["sim_time"]):
                by_epoch[round(row["epoch"], 6)].append((row["sim_time"], row[key]))
    n = len(group.runs)
    epochs = [e for e in sorted(by_epoch) if len(by_epoch[e]) == n]
    times = np.array([np.mean([t for t, _ in by_epoch[e]]) / 1000 for e in epochs])
    errors = np.array([scale * np.mean([err for _, err in by_epoch[e]]) for e in epochs])
    return times, errors


#: The time plot's y axis ends at this many times the panel's highest time-to-target
#: target (never above 100%): the curves' approach to the targets fills the panel, and
#: the first evaluations near chance leave through the top.
TIME_PLOT_CLIP_FACTOR = 3.0


def error_vs_time_figure(views: dict[str, tuple[Results, list[Target]]]):
    """The figure of ``error_vs_time.png``: the metric against simulated time (log
    scale: a one-worker baseline takes about k times as long as the runs it is compared
    with), one panel per cluster (and data split) and worker count k > 1, one line per
    method (mean over seeds), the panel's one-worker baseline dashed and its
    time-to-target targets dotted; the y axis ends at :data:`TIME_PLOT_CLIP_FACTOR`
    times the highest target."""
    cells = [
        (label, k, results, targets)
        for label, (results, targets) in views.items()
        for k in ([k for k in results.worker_counts if k > 1] or results.worker_counts)
    ]
    cols = min(3, len(cells))
    nrows = math.ceil(len(cells) / cols)
    fig, axes = subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    rows = list(dict.fromkeys(r for results, _ in views.values() for r in results.rows))
    styles = _styles(rows)
    for ax, (label, k, results, targets) in zip(axes.flat, cells):
        curves = []
        base = results.baseline()
        if base is not None:
            curves.append((base, BASELINE_STYLE, baseline_label(base.row)))
        for row in results.rows:
            group = results.group(row, k)
            if group is not None and group is not base:
                curves.append((group, dict(**styles[row], ms=3, markevery=0.1), row))
        shown: list[float] = []
        for group, style, name in curves:
            times, values = mean_time_curve(group)
            after_start = times > 0  # the evaluation at time 0 has no place on a log axis
            ax.plot(times[after_start], values[after_start], **style, label=name)
            shown += list(values[after_start])
        scale = results.metric.scale
        levels = [scale * t.value for t in targets if t.skip is None]
        for level in levels:
            ax.axhline(level, color="0.4", ls=":", lw=1.0, label="targets (time to reach)")
        if levels and shown:
            top = TIME_PLOT_CLIP_FACTOR * max(levels)
            if results.metric.is_error:
                top = min(top, 100.0)
            low = min(min(shown), min(levels))
            ax.set_ylim(low - 0.05 * (top - low), min(top, max(shown + levels)))
        title = (
            f"{results.path.name}, {label}, k = {k}" if label else f"{heading(results)}: k = {k}"
        )
        ylabel = results.metric.title.replace(" (perplexity)", "")
        ax.set(title=title, xlabel="simulated time (s, log scale)", ylabel=ylabel)
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
    _finish_grid(fig, axes, len(cells))
    return fig


def plot_error_vs_time(views: dict[str, tuple[Results, list[Target]]], path: Path) -> Path:
    return _save(error_vs_time_figure(views), path)


def class_shares_figure(panels: dict[str, Results]):
    """The figure of ``class_shares.png``: the bias meter, each class's applied share
    minus its data share (pp) against the class, one panel per cluster (and data split),
    one line per method and k (mean over seeds), the one-worker baseline dashed; the
    panels share their y axis, so that a split's bias is seen against the others' (an
    IID split's thousandths of a point stay flat beside a Dirichlet split's points)."""
    from dana.experiments.ranking import class_deviations

    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = subplots(nrows, cols, figsize=(5.5 * cols, 3.8 * nrows), squeeze=False, sharey=True)
    rows = list(dict.fromkeys(r for results in panels.values() for r in results.rows))
    styles = _styles(rows)
    for ax, (label, results) in zip(axes.flat, panels.items()):
        base = results.baseline()
        for (row, k), group in results.groups.items():
            dev = class_deviations(group)
            if dev is None:
                continue
            if group is base:
                style, name = BASELINE_STYLE, baseline_label(row)
            else:
                style, name = dict(**styles[row], ms=3), f"{row} k={k}"
            ax.plot(range(len(dev)), dev, **style, label=name)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set(title=label or "all runs", xlabel="class", ylabel="applied share - data share (pp)")
        ax.grid(alpha=0.3)
    _finish_grid(fig, axes, len(panels))
    return fig


def plot_class_shares(panels: dict[str, Results], path: Path) -> Path:
    return _save(class_shares_figure(panels), path)


def _per_worker(results: Results, k: int) -> float | None:
    """A budget's updates per worker at ``k``: the median of its runs' pushes over k."""
    pushes = [
        r.summary["pushes"] / k
        for row in results.rows
        if (group := results.group(row, k)) is not None
        for r in group.runs
        if r.summary and r.summary.get("pushes")
    ]
    return float(np.median(pushes)) if pushes else None


def budget_curve_figure(panels: dict[str, Results]):
    """The figure of ``budget_curve.png`` (a study whose panels are budgets): each
    method's final metric against updates per worker (log scale), one point per budget:
    the mean over the seeds that finished without diverging, bars from the lowest to the
    highest seed; the budget's one-worker baseline dashed at the same abscissa; one panel
    per worker count k > 1."""
    ks = sorted({k for res in panels.values() for k in res.worker_counts if k > 1})
    fig, axes = subplots(1, max(1, len(ks)), figsize=(6.5 * max(1, len(ks)), 4.5), squeeze=False)
    rows = list(dict.fromkeys(r for res in panels.values() for r in res.rows))
    styles = _styles(rows)
    metric = next(iter(panels.values())).metric
    for ax, k in zip(axes.flat, ks):
        series: dict[str, list[tuple[float, np.ndarray]]] = defaultdict(list)
        budgets: set[float] = set()
        for res in panels.values():
            x = _per_worker(res, k)
            base = res.baseline()
            if x is None:
                continue
            if base is not None and len(base.finals()):
                series[baseline_label(base.row)].append((x, metric.scale * base.finals()))
            for row in res.rows:
                group = res.group(row, k)
                if group is not None and group is not base and len(group.finals()):
                    series[row].append((x, metric.scale * group.finals()))
        for name, points in series.items():
            points.sort(key=lambda p: p[0])
            xs = np.array([p[0] for p in points])
            means = np.array([v.mean() for _, v in points])
            spread = np.array([[v.mean() - v.min(), v.max() - v.mean()] for _, v in points]).T
            is_base = name.endswith("(baseline)")
            style = dict(**BASELINE_STYLE, marker="o") if is_base else styles[name]
            ax.errorbar(xs, means, yerr=spread, capsize=3, ms=5, **style, label=name)
            budgets.update(xs)
        ax.set_xscale("log")
        ax.set_xticks(sorted(budgets), [f"{b:.0f}" for b in sorted(budgets)])
        ax.minorticks_off()
        ax.set(
            title=f"{heading(next(iter(panels.values())))}: final {metric.name} by budget, k = {k}",
            xlabel="updates per worker (log scale)",
            ylabel=metric.title.replace(" (perplexity)", ""),
        )
        ax.grid(alpha=0.3, which="both")
    _legend_outside(axes.flat[len(ks) - 1] if ks else axes.flat[0])
    fig.tight_layout()
    return fig


def plot_budget_curve(panels: dict[str, Results], path: Path) -> Path:
    return _save(budget_curve_figure(panels), path)


#: The difference plot's y axis ends this many points above the line: a method far
#: off (at chance) is drawn at the edge with its value written beside it.
DIFFERENCE_CLIP_PP = 6.0


def differences_figure(results: Results):
    """The figure of ``differences.png``: per k > 1, each method's final error minus the
    one-worker baseline's, seed by seed (dots, paired as the claim at a glance pairs
    them), their mean (a bar) and the claim's line; the y axis clipped
    :data:`DIFFERENCE_CLIP_PP` above the line, so that differences under a point stay
    legible."""
    from dana.experiments.glance import LINE_PP, glance_cells

    cells = glance_cells(results)
    ks = list(cells)
    fig, axes = subplots(1, max(1, len(ks)), figsize=(max(6.0, 4.5 * len(ks)), 4.2), squeeze=False)
    rows = list(dict.fromkeys(r for by_row in cells.values() for r in by_row))
    styles = _styles(rows)
    top = LINE_PP + DIFFERENCE_CLIP_PP
    for ax, k in zip(axes.flat, ks):
        names = [r for r in rows if r in cells[k]]
        low = 0.0
        for x, row in enumerate(names):
            diff = cells[k][row]
            values = np.asarray(diff.values, dtype=float)
            color = styles[row]["color"]
            if len(values):
                shown = np.minimum(values, top)
                ax.scatter(
                    np.full(len(values), x),
                    shown,
                    color=color,
                    marker=styles[row]["marker"],
                    s=18,
                    zorder=3,
                )
                ax.hlines(min(diff.mean, top), x - 0.3, x + 0.3, color=color, lw=2)
                low = min(low, float(values.min()))
                if diff.mean > top:
                    ax.annotate(f"{diff.mean:+.1f}", (x, top), textcoords="offset points",
                                xytext=(0, -12), ha="center", fontsize=7)  # fmt: skip
            if diff.diverged:
                ax.annotate(f"diverged {diff.diverged}/{diff.runs}", (x, top),
                            textcoords="offset points", xytext=(0, 3), ha="center",
                            fontsize=7, color="C3")  # fmt: skip
        ax.axhline(0.0, **BASELINE_STYLE)
        ax.axhline(LINE_PP, color="C3", ls=":", lw=1.2)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylim(low - 0.5, top + 0.8)
        ax.set(
            title=f"{heading(results)}: k = {k}",
            ylabel=f"final {results.metric.name} minus the baseline's ({results.metric.unit})",
        )
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def plot_differences(results: Results, path: Path) -> Path:
    return _save(differences_figure(results), path)
