"""The driver's evaluation and checkpoint points: the shards' snapshots, evaluated or saved.

At every evaluation or checkpoint point (a number of steps: the simulator's points) each
shard snapshots its parameters (and, at a checkpoint, its state) and goes on
(:mod:`dana.ps.snapshots`); the driver collects the snapshots with its polls. Once
every shard's snapshot of the next point is in, and the merged log up to it, :class:`Points`
evaluates the parameters on the test set in the driver's process and writes the
metrics row (:func:`dana.train.records.metrics.metrics_row`), or writes the checkpoint
(:mod:`dana.ps.checkpoint`). It also watches the merged log for a non-finite loss: the
divergence that ends the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dana.ps.checkpoint import build_state
from dana.ps.log import LogMerger
from dana.train.records.metrics import Position, divergence_row, metrics_row
from dana.train.records.progress import Progress
from dana.train.records.rundir import RunDir
from dana.train.task.problem import TrainingProblem


class Points:
    """The points still to process and the shards' snapshots of them; the metrics rows.

    Args:
        run: the run directory (rows and checkpoints are written there).
        problem: the run's problem (its test set evaluates).
        merger: the run's merged log.
        servers: the number of shards.
        batches_per_epoch: ``train_size // batch_size``.
        wall: the run's wall-clock seconds so far.
    """

    def __init__(
        self,
        run: RunDir,
        problem: TrainingProblem,
        merger: LogMerger,
        servers: int,
        batches_per_epoch: int,
        wall: Callable[[], float],
    ):
        self.run, self.problem, self.merger = run, problem, merger
        self.batches_per_epoch, self.wall = batches_per_epoch, wall
        self.pending: list[int] = []  # the points still to process, in order
        self.evals: set[int] = set()
        self.checkpoints: set[int] = set()
        self.book: Any = None  # the driver's CallBook (dana.ps.calls), saved with a checkpoint
        self.snapshots: list[list[dict[str, Any]]] = [[] for _ in range(servers)]
        self.last_point = [-1] * servers  # the last point received from each shard
        self.rows: list[dict[str, float]] = []
        self.logged = 0  # pushes already summarised in a metrics row
        self.buffers: dict[str, np.ndarray] | None = None  # the latest model buffers
        self.final_params: torch.Tensor | None = None  # the last evaluated
        self.sim_time = 0.0  # the training time of the last evaluation
        self.checked = 0  # merged log entries checked for a non-finite loss
        self.diverged_at: int | None = None  # the updates at the divergence
        self.diverged_index: int | None = None  # its first push with a non-finite loss
        self.diverged_steps = 0

    def load_state_dict(self, state: dict[str, Any], buffers: dict[str, np.ndarray] | None):
        """A checkpoint's rows (the merged log is loaded already) and model buffers."""
        self.rows = [dict(r) for r in state["rows"]]
        self.logged = int(state["logged"])
        self.buffers = buffers
        self.checked = len(self.merger)

    def take(self, s: int, snapshots: list[dict[str, Any]]) -> None:
        """Shard ``s``'s snapshots from a poll. A rebuilt shard takes again the snapshots
        its lost self took after its latest recovery snapshot: the first of each point is
        kept."""
        fresh = [snap for snap in snapshots if snap["point"] > self.last_point[s]]
        if fresh:
            self.last_point[s] = fresh[-1]["point"]
        self.snapshots[s].extend(fresh)

    def check_divergence(self) -> None:
        """Look for a non-finite loss in the merged log's new entries."""
        if self.diverged_at is not None:
            return
        losses = np.asarray(self.merger.log.loss[self.checked :])
        bad = np.flatnonzero(~np.isfinite(losses))
        if len(bad):
            self.diverged_index = self.checked + int(bad[0])
            self.diverged_at = int(self.merger.updates[self.diverged_index])
            self.diverged_steps = self.diverged_index + 1  # local steps aside
        self.checked = len(self.merger)

    def process(self, progress: Progress, stop: Callable[[], None]) -> None:
        """Evaluate and checkpoint every point whose snapshots (and log) are all in;
        ``stop`` the servers when an evaluation finds a non-finite test loss."""
        while self.pending and all(self.snapshots):
            snaps = [queue[0] for queue in self.snapshots]
            if len(self.merger) < snaps[0]["pushes"]:
                return  # other shards' parts of these pushes are still on their way
            for queue in self.snapshots:
                queue.pop(0)
            point = self.pending.pop(0)
            if self.diverged_at is not None and snaps[0]["pushes"] > self.diverged_index:
                continue
            if snaps[0]["buffers"] is not None:
                self.buffers = snaps[0]["buffers"]
            if point in self.evals:
                row = self._evaluate(snaps)
                progress.row(row)
                if not math.isfinite(row["test_loss"]) and self.diverged_at is None:
                    self.diverged_at = snaps[0]["updates"]
                    self.diverged_index = snaps[0]["pushes"]
                    self.diverged_steps = snaps[0]["steps"]
                    stop()
                    continue
                self.run.write_metrics(self.rows)
                self.run.log_row(row)
            if point in self.checkpoints:
                state = build_state(
                    [snap["state"] for snap in snaps],
                    self.merger.state_dict(snaps[0]["pushes"]),
                    self.rows,
                    self.logged,
                    snaps[0]["time"],
                    self.buffers,
                )
                if self.book is not None:  # (the calls that led to it: dana replay)
                    state["calls"] = self.book.state_dict(cut=snaps[0]["steps"])
                self.run.save_checkpoint(state)

    def _evaluate(self, snaps: list[dict[str, Any]]) -> dict[str, float]:
        head = snaps[0]
        params = torch.from_numpy(np.concatenate([snap["params"] for snap in snaps]))
        if self.buffers:
            self.problem.flat.load_buffers_state(
                {k: torch.from_numpy(np.array(v)) for k, v in self.buffers.items()}
            )
        test = self.problem.evaluate(params)
        self.final_params = params  # the last evaluated: the end of the run
        log = self.merger.log.numpy(self.logged, head["pushes"])
        self.logged = head["pushes"]
        at = Position(
            head["steps"] / self.batches_per_epoch,
            head["updates"],
            head["pushes"],
            head["time"],
            head["lr"],
        )
        row = metrics_row(at, self.wall(), log, test)
        self.sim_time = head["time"]
        self.rows.append(row)
        return row

    def divergence_row(self, wall: float, pushes: int, sim_time: float) -> dict[str, float]:
        """The row that marks the divergence: at the first push with a non-finite loss
        (or at the evaluation that found a non-finite test loss); ``sim_time`` if no push
        is logged since the last row."""
        stop = self.diverged_index + 1 if self.diverged_index is not None else None
        log = self.merger.log.numpy(self.logged, stop)
        at = Position(
            self.diverged_steps / self.batches_per_epoch,
            self.diverged_at,
            pushes,
            float(log["sim_time"][-1]) if len(log["sim_time"]) else sim_time,
            float(log["lr"][-1]) if len(log["lr"]) else math.nan,
        )
        return divergence_row(at, wall, log)
