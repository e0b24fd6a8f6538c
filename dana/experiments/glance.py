"""The claim at a glance: each algorithm's final error against the one-worker baseline.

The paper's claim (docs/ALGORITHMS.md, "The paper's setting and claims"): with momentum
and many workers, DANA stays close to the one-worker baseline with the one-worker
hyper-parameters, where NAG-ASGD and Multi-ASGD lose accuracy or diverge. The table has
one row per worker count k > 1; its columns are the baseline's final error and, for each
algorithm row, its final error minus the baseline's mean final error in percentage
points: the mean over the seeds that finished without diverging, ± half their range when
more than one did, and ``diverged d/n`` when d of the n seeds diverged (the divergence
rule of :mod:`dana.experiments.table`).

Where the report compares the test loss (language models, runs without an error rate:
:class:`~dana.experiments.results.Metric`) the cells are differences in loss and there is
no verdict: the claim's thresholds are in points of test error.

Under the table, one sentence per k judges the claim from the numbers shown (two
decimals): DANA-Slim (DANA-Zero when there is no DANA-Slim row) is *within*
:data:`WITHIN_PP` of the baseline when no seed diverged and its difference is at most
that (being below the baseline counts); NAG-ASGD and Multi-ASGD are *worse by more than*
:data:`WORSE_PP` when their difference exceeds it or a seed diverged.
"""

from __future__ import annotations

from dataclasses import dataclass

from dana.experiments.results import Group, Metric, Results, perplexity_text

#: DANA is "within" this many percentage points of the baseline.
WITHIN_PP = 1.0
#: NAG-ASGD and Multi-ASGD are "worse" when more than this many points above it.
WORSE_PP = 2.0

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
    "baseline's mean final error, in percentage points: the mean over the seeds that "
    "finished without diverging, ± half their range when more than one did; "
    "`diverged d/n`: d of the n seeds diverged (with the others' difference when some "
    "finished). The baseline's column: its mean final error (%) ± half the range over "
    f"its seeds. Judged from the numbers shown: within {WITHIN_PP:g} pp means at most "
    f"{WITHIN_PP:g} pp above the baseline (below it counts) with no seed diverged; worse "
    f"by more than {WORSE_PP:g} pp means more than {WORSE_PP:g} pp above it, or a seed "
    "diverged."
)


#: The table's rule where the report compares the test loss.
LOSS_GLANCE_RULE = (
    "Each cell after the baseline's: the final test loss minus the one-worker baseline's "
    "mean final test loss: the mean over the seeds that finished without diverging, ± "
    "half their range when more than one did; `diverged d/n`: d of the n seeds diverged. "
    "The baseline's column: its mean final test loss ± half the range over its seeds."
)


def glance_rule(metric: Metric) -> str:
    """The table's rule, as the report states it."""
    return GLANCE_RULE if metric.is_error else LOSS_GLANCE_RULE


@dataclass
class Difference:
    """One cell: the final error minus the baseline's, in percentage points."""

    mean: float | None  # over the seeds that finished without diverging
    half_range: float | None  # None with fewer than two such seeds
    diverged: int
    runs: int
    failed: int = 0
    loss: bool = False  # a difference in test loss (four decimals), not in pp

    @property
    def shown(self) -> float | None:
        """The mean as the table shows it (two decimals), which the sentences judge."""
        return None if self.mean is None else round(self.mean, 2)

    def text(self) -> str:
        if self.mean is None:
            if self.diverged:
                return f"diverged {self.diverged}/{self.runs}"
            return "failed" if self.failed == self.runs and self.runs else "pending"
        digits = 4 if self.loss else 2
        text = f"{self.mean:+.{digits}f}"
        if self.half_range is not None:
            text += f" ± {self.half_range:.{digits}f}"
        notes = [f"diverged {self.diverged}/{self.runs}"] if self.diverged else []
        if self.failed:
            notes.append(f"failed {self.failed}/{self.runs}")
        return text + (f" ({', '.join(notes)})" if notes else "")

    def within(self) -> bool:
        return self.shown is not None and not self.diverged and self.shown <= WITHIN_PP

    def worse(self) -> bool:
        return bool(self.diverged) or (self.shown is not None and self.shown > WORSE_PP)


def difference(group: Group, baseline_error: float) -> Difference:
    """The cell of ``group`` against the baseline's mean final value (an error as a
    fraction: the difference in pp; a loss: in loss)."""
    metric = group.metric
    errors = metric.scale * (group.finals() - baseline_error)
    mean = float(errors.mean()) if len(errors) else None
    half = float(errors.max() - errors.min()) / 2 if len(errors) > 1 else None
    loss = not metric.is_error
    return Difference(mean, half, group.diverged, len(group.runs), group.failed, loss)


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
    error = float(base.finals().mean())
    rows = glance_rows(results)
    return {
        k: {
            row: difference(results.group(row, k), error)
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
    base_text = f"{errors.mean():.{digits}f}" + (
        f" ± {(errors.max() - errors.min()) / 2:.{digits}f}" if len(errors) > 1 else ""
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


def _value(d: Difference) -> str:
    if d.mean is None:
        return d.text()
    text = f"{d.mean:+.2f} pp"
    return text + (f" with {d.diverged}/{d.runs} diverged" if d.diverged else "")


def glance_sentence(k: int, by_row: dict[str, Difference]) -> str:
    """The verdict at ``k``, e.g. "k=32: DANA-Slim +0.60 pp (within 1 pp of the
    baseline); NAG-ASGD +8.10 pp, Multi-ASGD +5.30 pp (worse by more than 2 pp): the
    claim holds." """
    judged = {r: d for r, d in by_row.items() if d.mean is not None or d.diverged}
    parts = []
    dana = next((r for r in DANA_ROWS if r in by_row), None)
    verdicts = []
    if dana is not None:
        d = by_row[dana]
        if dana in judged:
            ok = d.within()
            verdicts.append(ok)
            word = "within" if ok else "not within"
            parts.append(f"{NAMES[dana]} {_value(d)} ({word} {WITHIN_PP:g} pp of the baseline)")
        else:
            parts.append(f"{NAMES[dana]} {d.text()}")
    compared = [r for r in COMPARED_ROWS if r in judged]
    groups: dict[bool, list[str]] = {}
    for r in compared:
        verdicts.append(by_row[r].worse())
        groups.setdefault(by_row[r].worse(), []).append(f"{NAMES[r]} {_value(by_row[r])}")
    for worse, names in groups.items():
        word = "worse" if worse else "not worse"
        parts.append(f"{', '.join(names)} ({word} by more than {WORSE_PP:g} pp)")
    for r in COMPARED_ROWS:
        if r in by_row and r not in judged:
            parts.append(f"{NAMES[r]} {by_row[r].text()}")
    if not parts:
        return f"k={k}: no result of {', '.join(NAMES[r] for r in DANA_ROWS + COMPARED_ROWS)}."
    text = f"k={k}: " + "; ".join(parts)
    complete = dana in judged and all(r in judged for r in COMPARED_ROWS)
    if complete:
        text += ": the claim holds" if all(verdicts) else ": the claim does not hold"
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
    return (
        f"No verdict: these are {what}, compared on the {metric.name} (a difference of "
        "0.01 is a perplexity 1% higher); the claim's thresholds (within "
        f"{WITHIN_PP:g} pp, worse by more than {WORSE_PP:g} pp) are in points of test error."
    )
