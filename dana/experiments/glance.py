"""The claim at a glance: each algorithm's final error against the one-worker baseline.

The paper's claim (docs/ALGORITHMS.md, "The paper's setting and claims"): with momentum
and many workers, DANA stays close to the one-worker baseline with the one-worker
hyper-parameters, where NAG-ASGD and Multi-ASGD lose accuracy or diverge. The table has
one row per worker count k > 1; its columns are the baseline's final error and, for each
algorithm row, its final error minus the baseline's in percentage points, seed by seed
(paired: a seed the baseline has is compared with the baseline's run of that seed, any
other with the baseline's mean), as their mean and
:func:`~dana.experiments.intervals.interval` over the seeds that finished without
diverging, and ``diverged d/n`` when d of the n seeds diverged (the divergence rule of
:mod:`dana.experiments.table`).

Where the report compares the test loss (language models, runs without an error rate:
:class:`~dana.experiments.results.Metric`) the cells are differences in loss and there is
no verdict: the claim's line is in points of test error.

Under the table, one sentence per k judges the claim against one line, :data:`LINE_PP`
above the baseline: DANA-Slim (DANA-Zero when there is no DANA-Slim row) keeps the
baseline's accuracy when its whole interval is at or below the line, NAG-ASGD and
Multi-ASGD lose it when their whole interval is above the line (or a seed diverged);
where an interval crosses the line, or one seed gives no interval, that part is
*inconclusive*. Each part states its seeds, its interval and its margin: how far the
interval's nearer end lies from the line (negative: the interval crosses it). The claim
holds when every part holds, does not hold when a part does not, and is inconclusive
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dana.experiments.intervals import INTERVAL_RULE, interval
from dana.experiments.results import Group, Metric, Results, perplexity_text

#: The line between keeping the baseline's accuracy (at most this many percentage points
#: above it) and losing it (more than this above): one line, so that no result falls
#: between the two verdicts.
LINE_PP = 1.0

#: The table's first columns, in this order; any other row follows them.
GLANCE_ROWS = ("dana-slim", "dana-zero", "nag-asgd", "multi-asgd", "ssgd")
#: The algorithms the sentences judge.
DANA_ROWS = ("dana-slim", "dana-zero")
COMPARED_ROWS = ("nag-asgd", "multi-asgd")
NAMES = {
    "dana-slim": "DANA-Slim",
    "dana-zero": "DANA-Zero",
    "nag-asgd": "NAG-ASGD",
    "multi-asgd": "Multi-ASGD",
    "ssgd": "SSGD",
}

#: The table's rule, as the report states it.
GLANCE_RULE = (
    "Each cell after the baseline's: the final test error minus the one-worker "
    "baseline's, in percentage points, seed by seed (paired with the baseline's run of "
    "the same seed where it has one, else with its mean): their mean over the seeds that "
    "finished without diverging and, in brackets, their interval "
    f"({INTERVAL_RULE}); `diverged d/n`: d of the n seeds diverged. The baseline's column: "
    "its mean final error (%) and the interval of its seeds. The verdicts use one line, "
    f"{LINE_PP:g} pp above the baseline: DANA keeps the baseline's accuracy when its "
    "whole interval is at or below the line, NAG-ASGD and Multi-ASGD lose it when their "
    "whole interval is above it or a seed diverged; an interval that crosses the line, "
    "or a single seed, is inconclusive. The margin is the distance from the interval's "
    "nearer end to the line (negative: it crosses the line)."
)


#: The table's rule where the report compares the test loss.
LOSS_GLANCE_RULE = (
    "Each cell after the baseline's: the final test loss minus the one-worker baseline's, "
    "seed by seed (paired where the baseline has the seed): their mean over the seeds that "
    f"finished without diverging and their interval ({INTERVAL_RULE}); `diverged d/n`: "
    "d of the n seeds diverged. "
    f"The baseline's column: its mean final test loss and the interval of its seeds."
)


def glance_rule(metric: Metric) -> str:
    """The table's rule, as the report states it."""
    return GLANCE_RULE if metric.is_error else LOSS_GLANCE_RULE


#: What a part of the claim, or the claim, reads.
HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


@dataclass
class Difference:
    """One cell: the final error minus the baseline's, seed by seed, in percentage
    points (a loss: in loss)."""

    values: np.ndarray  # one per seed that finished without diverging
    diverged: int
    runs: int
    failed: int = 0
    loss: bool = False  # a difference in test loss (four decimals), not in pp

    @property
    def mean(self) -> float | None:
        return float(self.values.mean()) if len(self.values) else None

    @property
    def bounds(self) -> tuple[float, float] | None:
        return interval(self.values)

    def text(self) -> str:
        if self.mean is None:
            if self.diverged:
                return f"diverged {self.diverged}/{self.runs}"
            return "failed" if self.failed == self.runs and self.runs else "pending"
        digits = 4 if self.loss else 2
        text = f"{self.mean:+.{digits}f}"
        if self.bounds is not None:
            text += f" [{self.bounds[0]:+.{digits}f}, {self.bounds[1]:+.{digits}f}]"
        notes = [f"diverged {self.diverged}/{self.runs}"] if self.diverged else []
        if self.failed:
            notes.append(f"failed {self.failed}/{self.runs}")
        return text + (f" ({', '.join(notes)})" if notes else "")

    def keeps(self) -> tuple[str, float | None]:
        """Whether it keeps the baseline's accuracy (at most :data:`LINE_PP` above it),
        and the margin (the line minus the interval's high end)."""
        if self.diverged:
            return DOES_NOT_HOLD, None
        if self.bounds is None:
            return INCONCLUSIVE, None
        low, high = self.bounds
        verdict = HOLDS if high <= LINE_PP else DOES_NOT_HOLD if low > LINE_PP else INCONCLUSIVE
        return verdict, LINE_PP - high

    def loses(self) -> tuple[str, float | None]:
        """Whether it loses the baseline's accuracy (more than :data:`LINE_PP` above it,
        or a seed diverged), and the margin (the interval's low end minus the line)."""
        if self.diverged:
            return HOLDS, None
        if self.bounds is None:
            return INCONCLUSIVE, None
        low, high = self.bounds
        verdict = HOLDS if low > LINE_PP else DOES_NOT_HOLD if high <= LINE_PP else INCONCLUSIVE
        return verdict, low - LINE_PP


def difference(group: Group, baseline: Group) -> Difference:
    """The cell of ``group`` against ``baseline``, paired by seed where the baseline has
    the seed (an error as a fraction: the difference in pp; a loss: in loss)."""
    metric = group.metric
    base = {r.seed: r.final for r in baseline.runs if r.status == "finished"}
    mean = float(np.mean(list(base.values())))
    values = np.array(
        [r.final - base.get(r.seed, mean) for r in group.runs if r.status == "finished"]
    )
    return Difference(
        metric.scale * values, group.diverged, len(group.runs), group.failed, not metric.is_error
    )


def glance_rows(results: Results) -> list[str]:
    """The rows with a run at some k > 1: :data:`GLANCE_ROWS` first, then the others."""
    present = [r for r in results.rows if any(k > 1 for rr, k in results.groups if rr == r)]
    return [r for r in GLANCE_ROWS if r in present] + [r for r in present if r not in GLANCE_ROWS]


def glance_cells(results: Results) -> dict[int, dict[str, Difference]]:
    """Per k > 1, per row of :func:`glance_rows` run at that k: its :class:`Difference`.
    Empty when there is no finished one-worker baseline."""
    base = results.baseline()
    if base is None or not len(base.finals()):
        return {}
    rows = glance_rows(results)
    return {
        k: {
            row: difference(results.group(row, k), base)
            for row in rows
            if results.group(row, k) is not None
        }
        for k in results.worker_counts
        if k > 1
    }


def glance_table(results: Results) -> str:
    """The markdown table (empty string when there is no baseline or no k > 1)."""
    cells = glance_cells(results)
    if not cells:
        return ""
    base = results.baseline()
    metric = results.metric
    errors, digits = metric.scale * base.finals(), metric.digits
    bounds = interval(errors)
    base_text = f"{errors.mean():.{digits}f}" + (
        f" [{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]" if bounds else ""
    )
    if metric.perplexity:
        base_text += f" (perplexity {perplexity_text(errors.mean())})"
    rows = glance_rows(results)
    unit = "%" if metric.is_error else metric.name
    lines = [
        f"| k | baseline k=1 ({unit}) | "
        + " | ".join(f"{r} ({metric.unit or 'difference'})" for r in rows)
        + " |",
        "|" + "---|" * (len(rows) + 2),
    ]
    for k, by_row in cells.items():
        texts = [by_row[r].text() if r in by_row else "—" for r in rows]
        lines.append(f"| {k} | {base_text} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _part(name: str, d: Difference, verdict: str, margin: float | None, what: str) -> str:
    """One part of the verdict: "DANA-Slim -0.25 pp [-0.35, -0.15], 2 seeds: keeps the
    baseline's accuracy, holds (margin 1.15 pp)"."""
    seeds = len(d.values)
    if d.mean is None:
        value = d.text()
    else:
        value = f"{d.mean:+.2f} pp"
        if d.bounds is not None:
            value += f" [{d.bounds[0]:+.2f}, {d.bounds[1]:+.2f}]"
        value += f", {seeds} seed{'s' if seeds != 1 else ''}"
        if d.diverged:
            value += f", {d.diverged}/{d.runs} diverged"
    if margin is None:
        why = "a seed diverged" if d.diverged else "one seed, no interval"
        return f"{name} {value}: {what} {verdict} ({why})"
    return f"{name} {value}: {what} {verdict} (margin {margin:+.2f} pp)"


def glance_sentence(k: int, by_row: dict[str, Difference]) -> str:
    """The verdict at ``k``, e.g. "k=16: DANA-Slim -0.25 pp [-0.35, -0.15], 2 seeds:
    keeps the baseline's accuracy, holds (margin +1.15 pp); ...: the claim holds." """
    judged = {r: d for r, d in by_row.items() if d.mean is not None or d.diverged}
    parts, verdicts = [], []
    dana = next((r for r in DANA_ROWS if r in by_row), None)
    if dana is not None:
        if dana in judged:
            verdict, margin = by_row[dana].keeps()
            verdicts.append(verdict)
            what = f"within {LINE_PP:g} pp of the baseline:"
            parts.append(_part(NAMES[dana], by_row[dana], verdict, margin, what))
        else:
            parts.append(f"{NAMES[dana]} {by_row[dana].text()}")
    for r in COMPARED_ROWS:
        if r in judged:
            verdict, margin = by_row[r].loses()
            verdicts.append(verdict)
            what = f"worse by more than {LINE_PP:g} pp:"
            parts.append(_part(NAMES[r], by_row[r], verdict, margin, what))
        elif r in by_row:
            parts.append(f"{NAMES[r]} {by_row[r].text()}")
    if not parts:
        return f"k={k}: no result of {', '.join(NAMES[r] for r in DANA_ROWS + COMPARED_ROWS)}."
    text = f"k={k}: " + "; ".join(parts)
    if dana in judged and all(r in judged for r in COMPARED_ROWS):
        claim = (
            DOES_NOT_HOLD
            if DOES_NOT_HOLD in verdicts
            else HOLDS
            if all(v == HOLDS for v in verdicts)
            else INCONCLUSIVE
        )
        text += f": the claim {claim}" + (" (within noise)" if claim == INCONCLUSIVE else "")
    return text + "."


def glance_sentences(results: Results) -> list[str]:
    """One :func:`glance_sentence` per k > 1; where the report compares the test loss,
    one sentence saying why there is no verdict."""
    cells = glance_cells(results)
    if cells and not results.metric.is_error:
        return [no_verdict(results.metric)]
    return [glance_sentence(k, by_row) for k, by_row in cells.items()]


def no_verdict(metric: Metric) -> str:
    """Why a report on the test loss judges no claim."""
    what = "language models" if metric.perplexity else "runs without an error rate"
    scale = " (a difference of 0.01 is a perplexity 1% higher)" if metric.perplexity else ""
    return (
        f"No verdict: these are {what}, compared on the {metric.name}{scale}; the claim's "
        f"line ({LINE_PP:g} pp above the baseline) is in points of test error."
    )
