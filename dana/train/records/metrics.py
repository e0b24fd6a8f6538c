"""The run's figures, written the same by every runner: the metrics row and the summary.

A metrics row (``metrics.csv``, :data:`~dana.train.records.rundir.METRICS_COLUMNS`) is taken at
an evaluation point: where the run is (:class:`Progress`), the master's test loss and
error, and over the pushes since the previous row the mean training loss, gap and
staleness. A divergence row marks where a run diverged (no losses, the gap and
staleness up to there). The summary (``summary.json``) is read from the rows, the whole
push log and where the run ended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dana.train.config import TrainConfig
from dana.train.records.rundir import METRICS_COLUMNS
from dana.train.task.evaluation import metric_column


@dataclass(frozen=True)
class Position:
    """Where a run is: its epochs, master updates, pushes applied, time (simulated, or
    seconds of training on Ray) and the learning rate of its next update."""

    epoch: float
    updates: int
    pushes: int
    sim_time: float
    lr: float = math.nan


def mean(values: np.ndarray) -> float:
    """The mean of the finite values (NaN when there are none)."""
    values = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    return float(values.mean()) if len(values) else math.nan


def metrics_row(
    at: Position,
    wall_seconds: float,
    log: dict[str, np.ndarray],
    test: Mapping[str, float],
) -> dict[str, float]:
    """The row of an evaluation at ``at``; ``log``: the pushes since the previous row;
    ``test``: the evaluation (:func:`dana.train.task.evaluation.evaluate_module`: ``loss``,
    ``error`` and each metric ``NAME``, whose column is ``test_NAME``)."""
    row = {
        "epoch": at.epoch,
        "updates": at.updates,
        "sim_time": at.sim_time,
        "wall_seconds": wall_seconds,
        "lr": at.lr,
        "train_loss": mean(log["loss"]),
        "test_loss": test["loss"],
        "test_error": test["error"],
        "mean_gap": mean(log["gap"]),
        "mean_staleness": mean(log["staleness"]),
    }
    for name, value in test.items():
        if name not in ("loss", "error"):
            row[metric_column(name)] = value
    return row


def divergence_row(
    at: Position, wall_seconds: float, log: dict[str, np.ndarray]
) -> dict[str, float]:
    """The row that marks a divergence at ``at``: no losses, the gap and staleness of
    the pushes since the previous row."""
    row = metrics_row(at, wall_seconds, log, {"loss": math.nan, "error": math.nan})
    row["train_loss"] = math.nan
    return row


def summarize(
    config: TrainConfig,
    rows: list[dict[str, float]],
    log: dict[str, np.ndarray],
    diverged_at: int | None,
    wall_seconds: float,
    end: Position,
    wait_time: float = 0.0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The figures of ``summary.json``: ``log`` is the whole push log, ``end`` where the
    run stopped, ``wait_time`` the time workers waited for the staleness bound, ``extra``
    what a runner adds (the simulator: its cluster's departures and lost computations,
    and the classes behind the applied pushes)."""
    errors = [r["test_error"] for r in rows if math.isfinite(r["test_error"])]
    losses = [r["test_loss"] for r in rows if math.isfinite(r["test_loss"])]
    last = rows[-1]
    # The columns beyond dana's own (a language model's perplexity, a metric hook's):
    # their final values (NaN after a divergence).
    more = [k for r in rows for k in r if k not in METRICS_COLUMNS]
    finals = {f"final_{k}": last.get(k, math.nan) for k in dict.fromkeys(more)}
    staleness = log["staleness"]
    return {
        "algorithm": config.algorithm,
        "workers": config.workers,
        "dataset": config.dataset,
        "model": config.model,
        "seed": config.seed,
        "compress": config.compress,
        "final_test_error": last["test_error"],
        "best_test_error": min(errors) if errors else math.nan,
        "final_test_loss": last["test_loss"],
        "best_test_loss": min(losses) if losses else math.nan,
        **finals,
        "final_train_loss": last["train_loss"],
        "diverged": diverged_at is not None,
        "diverged_at_update": diverged_at,
        "updates": end.updates,
        "pushes": end.pushes,
        "epochs": end.epoch,
        "sim_time": end.sim_time,
        "mean_gap": mean(log["gap"]),
        "mean_staleness": mean(staleness),
        "max_staleness": int(staleness.max()) if len(staleness) else 0,
        "wait_time": float(wait_time),
        "wall_seconds": wall_seconds,
        # every hyper-parameter the algorithm ran with, its defaults included: a
        # record stays readable after a default changes
        "algorithm_hparams": config.build_algorithm().hparams(),
        **(extra or {}),
    }
