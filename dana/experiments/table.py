"""Markdown tables of a results directory: final error, gap, time to target, speed-up.

Rows are algorithms (with the one-worker baseline on a row of its own), columns worker
counts. A cell of the error table is the mean ± sample standard deviation (n - 1) over
the seeds that finished without diverging, of the report's metric (the test error in
percent, or the test loss: :class:`~dana.experiments.results.Metric`). The divergence rule: ``diverged``
when every seed diverged; when only some did, the others' mean ± spread followed by
``(d/n diverged)``. ``failed`` when every run failed, ``pending`` when runs are still
missing a result, ``n=...`` when fewer seeds have a result than the sweep's seeds, ``—``
when there is no run (not in the grid, or not started yet in a partial sweep).
"""

from __future__ import annotations

from collections.abc import Callable

from dana.experiments.results import Group, Results, perplexity_text
from dana.experiments.targets import (
    NO_SSGD,
    SSGD_NOT_REACHED,
    group_time,
    reference_row,
    scaled_reference_row,
    speedup_bound,
    speedup_cell,
    speedup_cells,
)

#: The rule of the error table, as the report states it.
ERROR_RULE = (
    "Each cell: mean ± sample standard deviation (n - 1) over the seeds that finished "
    "without diverging. A cell reads `diverged` when every seed diverged (the loss became "
    "NaN or infinite); when only some did, it gives the others' mean ± spread and "
    "`(d/n diverged)`. `n=...`: fewer seeds have a result than the sweep has seeds. "
    "`pending`: runs started, no result yet; `—`: no run (not in the grid, or not "
    "started yet)."
)

#: What each algorithm is with one worker (ALGORITHMS.md), to name the baseline.
ONE_WORKER_NAMES = {
    "dana-slim": "Nesterov SGD",
    "dana-zero": "Nesterov SGD",
    "nag-asgd": "Nesterov SGD (Sutskever form)",
    "multi-asgd": "momentum SGD",
    "ssgd": "momentum SGD",
    "asgd": "plain SGD",
}


def baseline_label(results: Results) -> str:
    base = results.baseline()
    if base is None:
        return "baseline"
    name = ONE_WORKER_NAMES.get(base.row.split(" ", 1)[0])
    return f"baseline k=1: {base.row}" + (f" = {name}" if name else "")


def error_cell(group: Group | None, seeds: int) -> str:
    """One cell of the error table (see the module doc for the rule)."""
    if group is None:
        return "—"
    errors = group.finals()
    n, diverged = len(group.runs), group.diverged
    if len(errors) == 0:
        if diverged:
            return "diverged" if diverged == n else f"diverged ({diverged}/{n})"
        return "failed" if group.failed == n and n else "pending"
    metric = group.metric
    shown, digits = metric.scale * errors, metric.digits
    text = f"{shown.mean():.{digits}f}" + (
        f" ± {shown.std(ddof=1):.{digits}f}" if len(errors) > 1 else ""
    )
    if metric.perplexity:
        text += f" (perplexity {perplexity_text(errors.mean())})"
    notes = []
    if diverged:
        notes.append(f"{diverged}/{n} diverged")
    if group.failed:
        notes.append(f"{group.failed}/{n} failed")
    if len(group.results) < seeds:
        notes.append(f"n={len(group.results)}")
    return text + (f" ({', '.join(notes)})" if notes else "")


def gap_cell(group: Group | None, seeds: int) -> str:
    """Mean gap RMS(theta - p_i) over the pushes of a run, mean over seeds."""
    if group is None:
        return "—"
    gaps = group.gaps()
    if len(gaps) == 0:
        return "pending" if not group.results else "—"
    text = f"{gaps.mean():.3g}"
    if group.diverged:
        text += f" ({group.diverged}/{len(group.runs)} diverged)"
    return text


def markdown_table(
    results: Results, cell: Callable[[Group | None, int], str], corner: str = "algorithm"
) -> str:
    """A table with the baseline's row first, then one row per algorithm."""
    ks = results.worker_counts
    seeds = len(results.seeds())
    base = results.baseline()
    lines = [
        "| " + " | ".join([corner] + [f"k={k}" for k in ks]) + " |",
        "|" + "---|" * (len(ks) + 1),
    ]
    if base is not None:
        cells = [cell(base, seeds) if k == 1 else "" for k in ks]
        lines.append("| " + " | ".join([baseline_label(results)] + cells) + " |")
    for row in results.rows:
        groups = [results.group(row, k) for k in ks]
        if all(g is None or g is base for g in groups):
            continue
        cells = [
            "" if g is base else cell(g, seeds) if g is not None or k > 1 else ""
            for g, k in zip(groups, ks)
        ]
        lines.append("| " + " | ".join([row] + cells) + " |")
    return "\n".join(lines)


def error_table(results: Results) -> str:
    """The final value of the report's metric (test error in %, or test loss) per
    algorithm and worker count."""
    return markdown_table(results, error_cell)


def gap_table(results: Results) -> str:
    """Mean gap per algorithm and worker count."""
    return markdown_table(results, gap_cell)


def time_table(results: Results, target: float) -> str:
    """Simulated time to ``target`` error and, in brackets, the speed-up over the plain
    ``ssgd`` row at the same k (:func:`~dana.experiments.targets.reference_row`) or why
    there is none (``no ssgd``, ``ssgd not reached``, with the lower bound of
    :func:`~dana.experiments.targets.speedup_bound`: ``ssgd not reached: > 2.00×``);
    where the sweep has ``ssgd
    (lr_scaling=linear)``, then the speed-up over it or why there is none, ``vs
    linear`` (:func:`~dana.experiments.targets.scaled_reference_row`)."""

    def speedup_text(group: Group, label: str | None = None) -> str:
        up, why = speedup_cell(results, group, target, label)
        if label is not None:
            why = {SSGD_NOT_REACHED: "linear not reached", NO_SSGD: "no linear"}.get(why, why)
        if up is not None:
            return f"{up:.2f}×" + (" vs linear" if label is not None else "")
        bound = speedup_bound(results, group, target, label)
        return why if bound is None else f"{why}: > {bound:.2f}×"

    def cell(group: Group | None, seeds: int) -> str:
        if group is None:
            return "—"
        time, reached, n = group_time(group, target)
        if n == 0:
            return "pending"
        if time is None:
            return f"not reached ({reached}/{n})"
        if group.workers == 1:
            return f"{time:.4g}"  # the baseline
        parts = [] if reference_row(results, group) == group.row else [speedup_text(group)]
        scaled = scaled_reference_row(results, group)
        if scaled is not None:
            parts.append(speedup_text(group, scaled))
        return f"{time:.4g} ({'; '.join(parts)})" if parts else f"{time:.4g}"

    return markdown_table(results, cell)


def speedups(results: Results, target: float) -> dict[str, dict[int, float]]:
    """Speed-up over ssgd per row and worker count, where both reached the target."""
    out: dict[str, dict[int, float]] = {}
    for (row, k), (up, _) in speedup_cells(results, target).items():
        if up is not None:
            out.setdefault(row, {})[k] = up
    return out
