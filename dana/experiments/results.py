"""Read a results directory's runs, without retraining, and group them for a report.

Every directory under the results directory that holds a ``config.json`` is a run (a
sweep's ``runs/NAME/``, a single ``dana train --out``, or a copy of their small files).
A run is ``finished`` or ``diverged`` (from ``summary.json``), ``incomplete`` (no
summary yet), or ``failed`` (no summary, and the sweep's ``sweep.json`` says it failed).

Runs are grouped by *row* (the algorithm, plus any other setting that differs between
runs and is not at its default, such as ``lr=0.05``) and worker count; the seeds of a
group are its samples. A cluster shows as its name (``cluster=geo``). Where the runs
differ in a *panel* setting (:data:`PANEL_KEYS`: the cluster, the data per worker),
:meth:`Results.panels` gives the runs of each panel as results of their own, so that a
method is compared with the others on the same cluster and data.

group are its samples.

A report compares one :class:`Metric` (:func:`choose_metric`): the test error (in %),
or the test loss where there is no error to compare: language models (shown with their
perplexity, ``exp(loss)``) and runs whose metrics have no error rate (a regression).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dana.errors import DanaError
from dana.train.config import TrainConfig
from dana.train.records.rundir import RunDir


@dataclass(frozen=True)
class Metric:
    """What a report compares: a column of ``metrics.csv`` (``key``), its final value in
    ``summary.json`` (``final_key``), how it is named and shown. ``scale``: 100 for an
    error shown in percent (differences in percentage points, "pp"), 1 for a loss.
    ``offsets``: the default time-to-target targets, the baseline's final value plus
    each (an error's), or plus that fraction of it (a loss's, whatever its scale:
    :func:`~dana.experiments.targets.choose_targets`). ``perplexity``: also show
    ``exp(value)`` (a language model's loss)."""

    key: str
    final_key: str
    name: str
    scale: float
    offsets: tuple[float, ...]
    perplexity: bool = False

    @property
    def is_error(self) -> bool:
        return self.key == "test_error"

    @property
    def title(self) -> str:
        """``test error (%)``, ``test loss``, ``test loss (perplexity)``."""
        if self.is_error:
            return f"{self.name} (%)"
        return f"{self.name} (perplexity)" if self.perplexity else self.name

    @property
    def unit(self) -> str:
        """The unit of a difference: ``pp`` (percentage points), or none for a loss."""
        return "pp" if self.is_error else ""

    @property
    def digits(self) -> int:
        """Decimals shown: 2 of an error in % (of ``scale * value``), 4 of a loss."""
        return 2 if self.is_error else 4

    def show(self, value: float) -> str:
        """A value in a sentence: ``12.34% test error``, ``test loss 1.2345
        (perplexity 3.44)``."""
        if self.is_error:
            return f"{self.scale * value:.2f}% {self.name}"
        text = f"{self.name} {value:.4f}"
        return text + (f" (perplexity {perplexity_text(value)})" if self.perplexity else "")


#: The test error: every classifier's runs.
TEST_ERROR = Metric("test_error", "final_test_error", "test error", 100.0, (0.005, 0.01))
#: The test loss, where the runs have no error rate (NaN in metrics.csv).
TEST_LOSS = Metric("test_loss", "final_test_loss", "test loss", 1.0, (0.01, 0.02))
#: A language model's test loss (nats per token), shown with its perplexity; a target
#: 0.01 above the baseline's is a perplexity 1% above it.
LM_LOSS = Metric("test_loss", "final_test_loss", "test loss", 1.0, (0.01, 0.02), True)


def perplexity_text(loss: float) -> str:
    """``exp(loss)`` as a report shows it: ``16.50``, ``1.014e+304``, ``inf``."""
    if math.isnan(loss):
        return "nan"
    value = math.exp(loss) if loss < 709.0 else math.inf
    return f"{value:.2f}" if value < 1e6 else f"{value:.4g}"


def choose_metric(runs: list[Run]) -> Metric:
    """:data:`LM_LOSS` for language models (a ``text`` dataset, or rows with a test
    perplexity), :data:`TEST_LOSS` when no run has a finite test error, else
    :data:`TEST_ERROR`."""
    if any(
        r.config.get("dataset") == "text" or (r.metrics and "test_perplexity" in r.metrics[0])
        for r in runs
    ):
        return LM_LOSS
    finite = any(
        math.isfinite(row.get("test_error", math.nan)) for r in runs for row in r.metrics
    ) or any(math.isfinite(_number((r.summary or {}).get("final_test_error"))) for r in runs)
    return TEST_ERROR if finite or not any(r.metrics or r.summary for r in runs) else TEST_LOSS


#: Settings that never split rows: the axes of the table and the sample index, and
#: settings that do not change the result.
_NOT_ROW_KEYS = {
    "algorithm",
    "workers",
    "seed",
    "data_dir",
    "device",  # where a run was made, not what was run (the report lists the devices)
    "batch_workers",
    "cuda_graph",
    "tensorboard",
    "mlflow",
    "mlflow_experiment",
    "wandb",
    "checkpoint_every",
}


#: Settings whose values split a results directory into panels (:meth:`Results.panels`).
PANEL_KEYS = ("cluster", "partition")
#: An algorithm's own settings: rows that differ in them share the one-worker baseline.
ALGORITHM_KEYS = ("lr_scaling", "algorithm_params")


def panel_keys(runs: list[Run], row_keys: list[str]) -> list[str]:
    """The settings that split the runs into panels: :data:`PANEL_KEYS` where they vary,
    and every other varying setting in which the one-worker runs differ (a sweep that
    varies the epochs has a baseline at each: a budget curve), but an algorithm's own
    settings (:data:`ALGORITHM_KEYS`)."""
    ones = [r for r in runs if r.workers == 1]
    differ = {
        k
        for k in row_keys
        if k not in ALGORITHM_KEYS and len({_canonical(r.config.get(k)) for r in ones}) > 1
    }
    return [k for k in row_keys if k in PANEL_KEYS or k in differ]


def setting_text(key: str, value: Any) -> str:
    """A setting's value as a report shows it: a cluster by its name, ``none`` when a
    run has no cluster; other values as they are."""
    if key == "cluster":
        if value is None:
            return "none"
        return str(value.get("name", "cluster")) if isinstance(value, dict) else str(value)
    if isinstance(value, list | tuple):  # (no ", " inside: it separates a label's settings)
        return "[" + ",".join(setting_text(key, v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass
class Run:
    """One run's files as read from disk."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any] | None
    metrics: list[dict[str, float]]
    status: str  # finished, diverged, incomplete, failed
    metric: Metric = TEST_ERROR  # what the report compares (load_results sets it)

    @property
    def algorithm(self) -> str:
        return self.config["algorithm"]

    @property
    def workers(self) -> int:
        return int(self.config["workers"])

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def final(self) -> float:
        """The final value of the report's metric (NaN unless finished without
        diverging)."""
        if self.status != "finished" or self.summary is None:
            return math.nan
        return _number(self.summary.get(self.metric.final_key))

    @property
    def mean_gap(self) -> float:
        return _number(self.summary.get("mean_gap")) if self.summary else math.nan

    @property
    def class_counts(self) -> tuple[list[int], list[int]] | None:
        """(examples of each class behind the applied pushes, of each class in the
        data), from the summary (the bias meter); None when it has none."""
        if not self.summary or "applied_class_counts" not in self.summary:
            return None
        return list(self.summary["applied_class_counts"]), list(self.summary["data_class_counts"])


@dataclass
class Group:
    """The runs (one per seed) of one row at one worker count."""

    row: str
    workers: int
    runs: list[Run] = field(default_factory=list)

    @property
    def metric(self) -> Metric:
        """The metric the report compares (its runs')."""
        return self.runs[0].metric if self.runs else TEST_ERROR

    @property
    def results(self) -> list[Run]:
        """The runs with a result: finished or diverged."""
        return [r for r in self.runs if r.status in ("finished", "diverged")]

    @property
    def diverged(self) -> int:
        return sum(1 for r in self.runs if r.status == "diverged")

    @property
    def failed(self) -> int:
        return sum(1 for r in self.runs if r.status == "failed")

    def finals(self) -> np.ndarray:
        """The final values of the report's metric (test errors, or losses) of the runs
        that finished without diverging."""
        return np.array([r.final for r in self.runs if r.status == "finished"])

    def gaps(self) -> np.ndarray:
        """Mean gaps of the runs with a result (a diverged run's gap up to divergence)."""
        gaps = np.array([r.mean_gap for r in self.results])
        return gaps[np.isfinite(gaps)]


@dataclass
class Results:
    """All runs of a results directory, grouped by row and worker count."""

    path: Path
    runs: list[Run]
    baseline_algorithm: str | None = None
    groups: dict[tuple[str, int], Group] = field(default_factory=dict)
    row_keys: list[str] = field(default_factory=list)
    metric: Metric = TEST_ERROR
    #: The panel settings (PANEL_KEYS) whose values differ between runs.
    panel_keys: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[str]:
        """Row labels: algorithms in the sweep's order (else alphabetical)."""
        return list(dict.fromkeys(row for row, _ in self.groups))

    @property
    def worker_counts(self) -> list[int]:
        """The numbers of workers ``k`` the runs have, ascending."""
        return sorted({k for _, k in self.groups})

    def group(self, row: str, workers: int) -> Group | None:
        return self.groups.get((row, workers))

    def baseline(self) -> Group | None:
        """The one-worker baseline: the runs at ``workers == 1`` of the baseline algorithm
        (the sweep's, else ``dana-slim``, else the only algorithm run at one worker)."""
        one = {row: g for (row, k), g in self.groups.items() if k == 1}
        if not one:
            return None
        for name in (self.baseline_algorithm, "dana-slim"):
            if name in one:
                return one[name]
        return one[next(iter(one))] if len(one) == 1 else None

    def references(self) -> dict[str, float]:
        """A language model's yardsticks, the test loss of the byte unigram and bigram
        models of its text (``summary.json``'s ``reference_losses``, from the first run
        that has them); empty for other runs."""
        for run in self.runs:
            found = (run.summary or {}).get("reference_losses")
            if found:
                return {name: float(value) for name, value in found.items()}
        return {}

    def common_settings(self) -> dict[str, Any]:
        """The settings shared by every run (the protocol of the table)."""
        if not self.runs:
            return {}
        first = self.runs[0].config
        return {
            k: v
            for k, v in first.items()
            if k not in ("algorithm", "workers", "seed", "dana_version")
            and all(r.config.get(k) == v for r in self.runs)
        }

    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.runs})

    def panel_of(self, run: Run) -> str:
        """The label of ``run``'s panel: ``cluster geo, partition dirichlet:0.3``."""
        return ", ".join(f"{k} {setting_text(k, run.config.get(k))}" for k in self.panel_keys)

    def panels(self) -> dict[str, Results]:
        """The runs of each panel (each value of the varying panel settings) as results
        of their own, in the order the runs come (the sweep's); empty when no panel
        setting varies."""
        if not self.panel_keys:
            return {}
        runs: dict[str, list[Run]] = {}
        for run in self.runs:
            runs.setdefault(self.panel_of(run), []).append(run)
        order = _panel_order(self.path, self.panel_keys)
        labels = sorted(runs, key=lambda label: order.get(label, len(order)))
        return {
            label: group_runs(self.path, runs[label], self.baseline_algorithm) for label in labels
        }


def load_results(path: str | Path, baseline: str | None = None) -> Results:
    """Every run under ``path``, grouped (see the module doc). DanaError if there is none."""
    path = Path(path)
    if not path.is_dir():
        raise DanaError(f"{path}: no such results directory")
    failed = _failed_cells(path)
    runs = []
    for config_file in sorted(path.rglob("config.json")):
        if any(part.startswith(".") for part in config_file.relative_to(path).parts):
            continue
        run = _read_run(RunDir(config_file.parent), failed)
        if run is not None:
            runs.append(run)
    runs += _failed_before_start(path, failed, {r.path.name for r in runs})
    if not runs:
        raise DanaError(
            f"{path}: holds no runs (no */config.json); give the --out directory of a "
            "`dana sweep` or of `dana train` runs"
        )
    if baseline is None:
        baseline = _sweep_baseline(path)
    runs.sort(key=_run_order(path))
    return group_runs(path, runs, baseline)


def group_runs(path: Path, runs: list[Run], baseline: str | None) -> Results:
    """``runs`` grouped by row and worker count (see the module doc)."""
    results = Results(path, runs, baseline, metric=choose_metric(runs))
    for run in runs:
        run.metric = results.metric
    results.row_keys = _row_keys(runs)
    results.panel_keys = panel_keys(runs, results.row_keys)
    for run in runs:
        row = row_label(run.config, results.row_keys)
        group = results.groups.setdefault((row, run.workers), Group(row, run.workers))
        group.runs.append(run)
    # rows in the sweep's algorithm order where there is one, else alphabetical
    order = sweep_record(path).get("spec", {}).get("grid", {}).get("algorithm") or []
    order = list(dict.fromkeys([*order, *sorted(r.algorithm for r in runs)]))
    results.groups = dict(sorted(results.groups.items(), key=lambda kv: _order(kv[0], order)))
    return results


def _grid_values(path: Path, key: str) -> list[str]:
    """The sweep's grid values of ``key`` (also its ``also`` grids'), as texts."""
    spec = sweep_record(path).get("spec", {})
    values: list[Any] = []
    for grid in (spec.get("grid", {}), *spec.get("also", [])):
        values += grid.get(key, [])
    return [setting_text(key, v) for v in values]


def _panel_order(path: Path, keys: list[str]) -> dict[str, int]:
    """Panel labels in the order of the sweep's grid values (cluster, then partition)."""
    import itertools

    lists = [_grid_values(path, k) for k in keys]
    if not all(lists):
        return {}
    labels = (
        ", ".join(f"{k} {v}" for k, v in zip(keys, combo)) for combo in itertools.product(*lists)
    )
    return {label: n for n, label in enumerate(dict.fromkeys(labels))}


def _run_order(path: Path):
    """Runs in the order of the sweep's cluster values where it has them (then by path)."""
    clusters = _grid_values(path, "cluster")

    def key(run: Run) -> int:  # (a stable sort: otherwise the order they were found in)
        name = setting_text("cluster", run.config.get("cluster"))
        return clusters.index(name) if name in clusters else len(clusters)

    return key


def row_label(config: dict[str, Any], keys: list[str]) -> str:
    """``dana-slim`` or, when other settings vary, ``dana-slim (lr=0.05)``: the varying
    settings that are not at ``dana train``'s default (``ssgd`` and ``ssgd
    (lr_scaling=linear)``, not ``ssgd (lr_scaling=none)``)."""
    defaults = TrainConfig().to_dict()
    extra = ", ".join(
        f"{k}={setting_text(k, config.get(k))}"
        for k in keys
        if k not in defaults or _canonical(config.get(k)) != _canonical(defaults[k])
    )
    return f"{config['algorithm']} ({extra})" if extra else config["algorithm"]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _row_keys(runs: list[Run]) -> list[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for k, v in run.config.items():
            if k not in _NOT_ROW_KEYS and k != "dana_version":
                # (a cluster's compute model is mirrored in timing: it varies with it)
                values[k].add(json.dumps(v, sort_keys=True))
    clusters = {json.dumps(r.config.get("cluster"), sort_keys=True) for r in runs}
    if len(clusters) > 1:  # the timing a cluster sets is the cluster's, not a row of its own
        values.pop("timing", None), values.pop("timing_params", None)
    keys = {k for r in runs for k in r.config}
    return sorted(k for k in keys - _NOT_ROW_KEYS - {"dana_version"} if len(values[k]) > 1)


def _order(key: tuple[str, int], order: list[str]) -> tuple[int, str, int]:
    """Sort key of a (row, workers) group: the algorithm's place, the row, then k."""
    return (order.index(key[0].split(" ", 1)[0]), key[0], key[1])


def _read_run(run: RunDir, failed: set[str]) -> Run | None:
    try:
        config = run.read_config()
    except DanaError:
        return None
    if "algorithm" not in config or "workers" not in config:
        return None
    summary = None
    if run.finished():
        try:
            summary = run.read_summary()
        except DanaError:  # unreadable: shown as not finished
            summary = None
    metrics: list[dict[str, float]] = []
    if run.metrics.is_file():
        try:
            metrics = run.read_metrics()
        except (OSError, ValueError, DanaError):  # unreadable: no curve
            metrics = []
    if summary is not None:
        status = "diverged" if summary.get("diverged") else "finished"
    else:
        status = "failed" if run.path.name in failed else "incomplete"
    return Run(run.path, config, summary, metrics, status)


def sweep_record(path: Path) -> dict[str, Any]:
    """The ``sweep.json`` a ``dana sweep`` left in ``path`` (empty if none)."""
    try:
        return json.loads((path / "sweep.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _failed_before_start(path: Path, failed: set[str], seen: set[str]) -> list[Run]:
    """Failed sweep cells that left no run directory (bad input found before training):
    their settings come from the sweep's ``cells/NAME.json``."""
    runs = []
    for name in sorted(failed - seen):
        try:
            config = json.loads((path / "cells" / f"{name}.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        runs.append(Run(path / "runs" / name, config, None, [], "failed"))
    return runs


def _failed_cells(path: Path) -> set[str]:
    cells = sweep_record(path).get("cells", [])
    return {c["name"] for c in cells if c.get("status") == "failed"}


def _sweep_baseline(path: Path) -> str | None:
    return sweep_record(path).get("spec", {}).get("baseline")


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
