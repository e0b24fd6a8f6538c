"""Which method first, on this cluster: the methods ranked on each panel of a results
directory, and each class's share of the updates they applied (the bias meter).

A panel is the runs of one cluster and one data split (:meth:`Results.panels`); a
results directory without panels is one. On a panel, at each ``k > 1``, the methods
(rows) are ranked twice:

- **by time**: by the simulated time to the first near-baseline target (the panel's
  one-worker baseline's final error + 0.5 pp, or a loss + 1%:
  :func:`~dana.experiments.targets.choose_targets`), ties and the methods that never
  reached it by the time to the second (+ 1 pp, + 0.02), then by the final value; a
  group's time is its mean over seeds, defined when every seed reached the target
  (:func:`~dana.experiments.targets.group_time`);
- **by final value** (the report's metric: the test error, or the test loss): the mean
  over the seeds that did not diverge; a method whose every seed diverged comes last.

The bias meter (``summary.json``'s ``applied_class_counts`` against
``data_class_counts``): for each run, each class's share of the examples behind the
applied pushes minus its share of the training data, in percentage points; a row's
figure is the mean over its seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dana.experiments.results import Group, Results
from dana.experiments.targets import Target, group_time

#: The rule, as the report states it.
RANKING_RULE = (
    "Ranked at each k by the simulated time to the first target (the panel's one-worker "
    "baseline's final value + 0.5 pp of error, or + 1% of loss), then to the second "
    "(+ 1 pp, + 2%), then by the final value; a time is the mean over seeds, defined "
    "when every seed reached the target (times in simulated seconds). The rank by final "
    "value is the order of its mean over the seeds that did not diverge (a method whose "
    "every seed diverged last). The one-worker baseline's own times come first, unranked; "
    "`whole run` is the simulated length of the run (its whole budget of computations), "
    "mean over the seeds that did not diverge."
)
BIAS_RULE = (
    "Each class's share of the examples behind the pushes the master applied (a local "
    "step's examples count when the push that ends its cycle is applied; a computation "
    "lost to a departure, or in flight at the end, does not count), minus its share of "
    "the training data, in percentage points, mean over seeds: `max |dev|` is the largest "
    "deviation over the classes; `most` and `least` the classes furthest above and below "
    "their share."
)


@dataclass
class Ranked:
    """One method's place on a panel at one ``k``."""

    row: str
    workers: int
    times: list[float | None]  # per used target: mean time (ms), None if not reached
    reached: list[str]  # per used target: "" or "2/3"
    error: float  # mean final value of the metric (an error as a fraction), NaN when none
    diverged: bool  # every seed diverged
    length: float  # the runs' mean simulated length (ms), NaN when none finished
    time_rank: int = 0
    error_rank: int = 0


def rank(results: Results, targets: list[Target]) -> dict[int, list[Ranked]]:
    """The methods of ``results`` at each ``k > 1``, in their order by time (the module
    doc), each with both its ranks."""
    used = [t for t in targets if t.skip is None]
    base = results.baseline()
    by_k: dict[int, list[Ranked]] = {}
    for (row, k), group in results.groups.items():
        if k == 1 or group is base or not group.results:
            continue
        times, reached = [], []
        for target in used:
            time, hit, n = group_time(group, target.value)
            times.append(time)
            reached.append("" if time is not None else f"{hit}/{n}")
        errors = group.finals()
        error = float(errors.mean()) if len(errors) else math.nan
        diverged = group.diverged == len(group.results)
        by_k.setdefault(k, []).append(
            Ranked(row, k, times, reached, error, diverged, run_length(group))
        )
    for entries in by_k.values():
        inf = math.inf
        entries.sort(
            key=lambda r: (
                *(t if t is not None else inf for t in r.times),
                r.error if math.isfinite(r.error) else inf,
            )
        )
        for n, entry in enumerate(entries, 1):
            entry.time_rank = n
        for n, entry in enumerate(
            sorted(entries, key=lambda r: r.error if math.isfinite(r.error) else inf), 1
        ):
            entry.error_rank = n
    return dict(sorted(by_k.items()))


def run_length(group: Group) -> float:
    """The mean simulated length (ms, ``summary.json``'s ``sim_time``) of the group's
    runs that finished without diverging; NaN when none did."""
    lengths = [
        float(r.summary["sim_time"])
        for r in group.runs
        if r.status == "finished" and r.summary and r.summary.get("sim_time") is not None
    ]
    return float(np.mean(lengths)) if lengths else math.nan


def _seconds(length: float) -> str:
    return f"{length / 1000:.4g}" if math.isfinite(length) else "—"


def ranking_table(results: Results, targets: list[Target]) -> str:
    """The ranking of one panel as a markdown table (one block of rows per ``k``), after
    the one-worker baseline's own times to the targets (unranked: what the ``k``
    workers are faster than)."""
    used = [t for t in targets if t.skip is None]
    metric = results.metric
    head = ["k", "rank by time", "method"]
    head += [f"time to {metric.show(t.value)} (s)" for t in used]
    head += ["whole run (s)", f"final {metric.title}", "rank by final"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(k: str, time_rank: str, name: str, times, reached, rest: list[str]):
        cells = [k, time_rank, name]
        for time, hit in zip(times, reached):
            cells.append(f"{time / 1000:.4g}" if time is not None else f"not reached ({hit})")
        lines.append("| " + " | ".join([*cells, *rest]) + " |")

    base = results.baseline()
    if base is not None and base.results:
        hits = [group_time(base, t.value) for t in used]
        finals = base.finals()
        error = f"{metric.scale * finals.mean():.{metric.digits}f}" if len(finals) else "diverged"
        name = f"{base.row}, one worker (baseline)"
        times, reached = [t for t, _, _ in hits], [f"{hit}/{n}" for _, hit, n in hits]
        row("1", "—", name, times, reached, [_seconds(run_length(base)), error, "—"])
    for k, entries in rank(results, targets).items():
        for e in entries:
            error = "diverged" if e.diverged else f"{metric.scale * e.error:.{metric.digits}f}"
            rest = [_seconds(e.length), error, str(e.error_rank)]
            row(str(k), str(e.time_rank), e.row, e.times, e.reached, rest)
    return "\n".join(lines)


def overview_table(panels: dict[str, tuple[Results, list[Target]]]) -> str:
    """Each method's ranks (by time / by final value) on every panel, at each panel's
    largest ``k``: one column per panel."""
    columns = list(panels)
    cells: dict[str, dict[str, str]] = {}
    for label, (results, targets) in panels.items():
        ranked = rank(results, targets)
        if not ranked:
            continue
        k = max(ranked)
        for entry in ranked[k]:
            cells.setdefault(entry.row, {})[label] = (
                f"{entry.time_rank} / {entry.error_rank} (k={k})"
            )
    lines = [
        "| method | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row, by_panel in cells.items():
        lines.append(f"| {row} | " + " | ".join(by_panel.get(c, "—") for c in columns) + " |")
    return "\n".join(lines)


def class_deviations(group: Group) -> np.ndarray | None:
    """The mean over the group's runs of each class's applied share minus its data
    share (percentage points); None when no run has the counts."""
    rows = []
    for run in group.results:
        counts = run.class_counts
        if counts is None or not sum(counts[0]):
            continue
        applied, data = (np.asarray(c, dtype=float) for c in counts)
        rows.append(100 * (applied / applied.sum() - data / max(1.0, data.sum())))
    return np.mean(rows, axis=0) if rows else None


def has_class_counts(results: Results) -> bool:
    return any(run.class_counts is not None for run in results.runs)


def bias_table(results: Results) -> str:
    """The bias meter of one panel: per method and ``k``, the largest deviation of a
    class's applied share from its data share, and the classes furthest above and below."""
    lines = [
        "| method | k | max \\|dev\\| (pp) | most (class: pp) | least (class: pp) |",
        "|---|---|---|---|---|",
    ]
    for (row, k), group in results.groups.items():
        dev = class_deviations(group)
        if dev is None:
            continue
        hi, lo = int(np.argmax(dev)), int(np.argmin(dev))
        lines.append(
            f"| {row} | {k} | {np.abs(dev).max():.2f} | {hi}: {dev[hi]:+.2f} | {lo}: {dev[lo]:+.2f} |"
        )
    return "\n".join(lines)
