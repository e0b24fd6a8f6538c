"""The metrics a run measured beyond dana's own: a ``dana.fit(metrics=...)`` hook's columns.

The rule: every column of a run's ``metrics.csv`` that is neither dana's
(:data:`~dana.train.records.rundir.METRICS_COLUMNS`) nor derived from them
(``test_perplexity``) is a measured metric, ``test_NAME``; its final value is the
summary's ``final_test_NAME``. The report gives each one a table of its final value
(mean ± standard deviation over seeds, per algorithm and worker count) and a plot of it
against epochs, drawn as the report's own metric is (:func:`view`), without a verdict:
dana does not know whether more is better.
"""

from __future__ import annotations

import dataclasses

from dana.experiments.results import Metric, Results, group_runs
from dana.train.records.rundir import METRICS_COLUMNS

#: Columns derived from dana's own (a language model's perplexity): not measured.
DERIVED = ("test_perplexity",)


def measured_columns(results: Results) -> list[str]:
    """The measured columns of any of the runs, in the order first found."""
    known = set(METRICS_COLUMNS) | set(DERIVED)
    found = [k for run in results.runs for row in run.metrics[:1] for k in row if k not in known]
    return list(dict.fromkeys(found))


def metric_of(column: str) -> Metric:
    """The :class:`Metric` of a measured column: shown as it is, no perplexity."""
    return Metric(column, f"final_{column}", column.replace("_", " "), 1.0, ())


def view(results: Results, column: str) -> Results:
    """``results`` again, comparing the measured ``column`` (copies of the runs: the
    report's own metric is left as it was)."""
    metric = metric_of(column)
    runs = [dataclasses.replace(run, metric=metric) for run in results.runs]
    again = group_runs(results.path, runs, results.baseline_algorithm)
    again.metric = metric
    for run in runs:
        run.metric = metric
    return again
