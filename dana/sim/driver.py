"""``dana train --backend sim``: the simulator's run loop (a runner, :mod:`dana.train.runners`).

The run stops at fixed points of the data stream (every ``eval_every`` epochs, every
``checkpoint_every`` epochs, the end; :func:`dana.train.training.stop_points`). At an
evaluation point it appends a row to ``metrics.csv`` (:func:`dana.train.records.metrics.metrics_row`).
At a checkpoint point it saves the whole state, so that ``--resume`` continues exactly: a
resumed run's ``metrics.csv`` equals the uninterrupted run's but for ``wall_seconds``.
SIGTERM or SIGINT (:mod:`dana.train.records.preempt`) stops the run after the step under way
with a checkpoint of that step, just as exact.

A NaN or infinite loss is a result, not a crash: the run stops, ``summary.json`` says
``diverged: true`` and at which update, and :meth:`SimRun.execute` returns normally. The
loss is read after every step; on a GPU (the simulator's ``sync_free``: reading it waits
for the device) every :data:`SYNC_FREE_CHECK` steps, so a diverged run stops within that
many steps of its first non-finite loss.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Generator
from typing import Any

import torch

from dana.algorithms.base import Algorithm
from dana.errors import ConfigError
from dana.sim.compute import Pack, auto_batch_workers
from dana.sim.simulator import Simulator
from dana.train.config import TrainConfig
from dana.train.records import preempt
from dana.train.records.metrics import Position, divergence_row, metrics_row, summarize
from dana.train.records.progress import Progress
from dana.train.records.pushlog import PushLog
from dana.train.records.rundir import RunDir
from dana.train.resources import check_memory
from dana.train.rules.codecs import push_bytes
from dana.train.task.batches import BatchStream
from dana.train.task.problem import TrainingProblem
from dana.train.task.stacked import running_buffers
from dana.train.training import build_schedule, run_to_end, stop_points

#: Steps between reads of the loss (divergence, the progress bar) on a GPU.
SYNC_FREE_CHECK = 64


def engine_settings(
    config: TrainConfig, problem: TrainingProblem, threads: int, batches: BatchStream
) -> tuple[int, int]:
    """``(batch_workers, threads)`` for the simulator (:mod:`dana.sim.compute`).

    ``--batch-workers B`` (``auto``: :func:`~dana.sim.compute.auto_batch_workers`) takes
    the batched engine. Otherwise ``--threads N > 1`` on the CPU takes the threaded
    engine (N workers' gradients at once, one intra-op thread each); else the run
    computes one worker at a time on N intra-op threads (set by the caller). Augmented
    data takes either engine: a batch's augmentation is drawn from its key
    (:class:`~dana.train.task.batches.KeyedBatchStream`), not in the order gradients are
    computed."""
    batch_workers = config.batch_workers
    if batch_workers == "auto":
        source = problem.source()
        device = problem.flat.flat.device
        batch_workers = auto_batch_workers(
            source, config.workers, torch.arange(batches.batch_size), device
        )
        why = "one at a time is faster on the CPU" if device.type == "cpu" else "fit the device"
        print(
            f"--batch-workers auto: {batch_workers} of {config.workers} workers' gradients "
            f"per call ({why})",
            file=sys.stderr,
            flush=True,
        )
    if batch_workers > 1:
        try:
            running_buffers(problem.flat.module)
        except ValueError as e:
            raise ConfigError(f"--batch-workers {config.batch_workers}: {e}") from None
        return batch_workers, 1
    if threads > 1 and problem.flat.flat.device.type == "cpu":
        return 1, threads
    return 1, 1


def build_simulator(
    config: TrainConfig,
    problem: TrainingProblem,
    algorithm: Algorithm | None = None,
    threads: int = 1,
    pack: Pack | None = None,
) -> Simulator:
    """The :class:`~dana.sim.simulator.Simulator` of a run: ``config``'s algorithm (or
    ``algorithm``, built from it), workers, schedule, timing, bound, cluster and codec
    on ``problem``'s parameters, gradient and batches, with the engine
    :func:`engine_settings` picks (``pack``: the pack's, looking ahead as many workers
    as the batched engine would). ``dana train``, ``dana.fit`` and ``dana.simulate``
    build it here."""
    if algorithm is None:
        algorithm = config.build_algorithm()
    batches = problem.batches(config.seed)
    batch_workers, threads = engine_settings(config, problem, threads, batches)
    if pack is not None:
        threads = 1  # (the pack's engine: one vectorised call)
    if config.cluster is not None and config.servers > problem.flat.d:
        raise ConfigError(
            f"--servers {config.servers}: the model has {problem.flat.d} parameters; "
            "a shard holds at least one"
        )
    return Simulator(
        algorithm,
        problem.initial_params(),
        problem.gradient,
        batches,
        config.workers,
        lr=build_schedule(config, batches.batches_per_epoch),
        weight_decay=config.weight_decay,
        timing=config.timing,
        timing_params=config.timing_params,
        seed=config.seed,
        max_staleness=config.max_staleness,
        batch_workers=batch_workers,
        threads=threads,
        source=problem.source() if batch_workers > 1 or threads > 1 or pack else None,
        cluster=config.cluster,
        servers=config.servers,
        labels=class_labels(problem.dataset.train_y),
        compress=config.compress,
        pack=pack,
    )


class SimRun:
    """One simulated training run writing to one run directory."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        problem: TrainingProblem,
        algorithm: Algorithm | None = None,
        *,
        threads: int = 1,
        pack: Pack | None = None,
    ):
        self.config, self.run, self.problem, self.pack = config, run, problem, pack
        try:
            self.sim = build_simulator(config, problem, algorithm, threads, pack)
        except ValueError as e:  # (a model other than the pack's, BatchNorm without momentum)
            if pack is None:
                raise
            raise ConfigError(f"--pack: {e}") from None
        self.batches = self.sim.batches
        self.rows: list[dict[str, float]] = []
        self.logged = 0  # pushes already summarised in a metrics row
        self.wall_before = 0.0  # wall seconds spent before a resume
        self.diverged_at: int | None = None

    @classmethod
    def check(cls, config: TrainConfig, problem: TrainingProblem) -> None:
        """The per-worker state of ``k`` workers must fit in memory
        (:func:`~dana.train.resources.check_memory`)."""
        check_memory(config, problem.flat.d)

    @property
    def log(self) -> PushLog:
        return self.sim.log

    def final_params(self) -> torch.Tensor:
        return self.sim.params()

    # -- state --------------------------------------------------------------------------
    def state_dict(self, wall: float) -> dict[str, Any]:
        return {
            "sim": self.sim.state_dict(),
            "problem": self.problem.state_dict(),
            "rows": [dict(r) for r in self.rows],
            "logged": self.logged,
            "wall_seconds": wall,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sim.load_state_dict(state["sim"])
        self.problem.load_state_dict(state["problem"])
        self.rows = [dict(r) for r in state["rows"]]
        self.logged = int(state["logged"])
        self.wall_before = float(state["wall_seconds"])

    # -- the loop -----------------------------------------------------------------------
    def position(self) -> Position:
        sim = self.sim
        return Position(sim.epoch, sim.updates, sim.pushes, sim.sim_time, sim.lr())

    def evaluate(self, wall: float) -> dict[str, float]:
        log = self.sim.log.numpy(self.logged)
        self.logged = len(self.sim.log)
        row = metrics_row(self.position(), wall, log, self.problem.evaluate(self.sim.params()))
        self.rows.append(row)
        return row

    def diverged(self, sim: Simulator) -> bool:
        if len(sim.log) and not math.isfinite(sim.log.loss[-1]):
            self.diverged_at = sim.updates
            return True
        return False

    def execute(self, progress: Progress) -> dict[str, Any]:
        """Run to the end (:meth:`execute_steps`); the summary."""
        return run_to_end(self.execute_steps(progress))

    def execute_steps(self, progress: Progress) -> Generator[None, None, dict[str, Any]]:
        """:meth:`execute` step by step: yields after each step of the simulator (runs
        packed into one process are advanced in turn, :mod:`dana.sim.pack`); returns
        the summary. A packed run leaves its pack when it ends."""
        try:
            return (yield from self._steps(progress))
        finally:
            if self.pack is not None and self.sim.engine is not None:
                self.sim.engine.close()

    def _steps(self, progress: Progress) -> Generator[None, None, dict[str, Any]]:
        points, evals, checkpoints = stop_points(self.config, self.batches.batches_per_epoch)
        start = time.perf_counter()

        def wall() -> float:
            return self.wall_before + time.perf_counter() - start

        done = {r["epoch"] for r in self.rows}
        progress.start(points[-1], self.sim.steps)
        for point in points:
            if point < self.sim.steps or (point == self.sim.steps and self.sim.epoch in done):
                continue
            tick = self._tick(progress)
            while self.sim.steps < point:  # (Simulator.run, a step at a time)
                self.sim.step()
                if tick(self.sim):
                    break
                yield
            if self.diverged_at is None and self.sim.sync_free:
                self.diverged(self.sim)  # (the steps since the last check)
            if self.diverged_at is not None:
                break
            if preempt.requested() and self.sim.steps < point:
                self.run.save_checkpoint(self.state_dict(wall()))
                progress.close()
                raise preempt.preempted(str(self.run.path), f"at step {self.sim.steps}")
            if point in evals:
                row = self.evaluate(wall())
                progress.row(row)
                if not math.isfinite(row["test_loss"]):
                    self.diverged_at = self.sim.updates
                    break
                self.run.write_metrics(self.rows)
                self.run.log_row(row)
            if point in checkpoints:
                self.run.save_checkpoint(self.state_dict(wall()))
        progress.close()
        if self.diverged_at is not None:
            log = self.sim.log.numpy(self.logged)
            self.rows.append(divergence_row(self.position(), wall(), log))
            self.run.write_metrics(self.rows)
        return summarize(
            self.config,
            self.rows,
            self.sim.log.numpy(),
            self.diverged_at,
            wall(),
            self.position(),
            self.sim.wait_time,
            self.cluster_summary(),
        )

    def cluster_summary(self) -> dict[str, Any]:
        """What the summary adds of the wire (the bytes of one push, all shards: the
        codec's payloads), of the cluster (departures, lost work) and of the data
        behind the applied pushes (each class's count, and the data's: the bias meter)."""
        sim, config = self.sim, self.config
        d, value_bytes = self.problem.flat.d, sim.sent.element_size()
        clock = sim.clock
        extra: dict[str, Any] = {
            "push_bytes": push_bytes(config.compress, d, config.servers, value_bytes),
            # (a cluster's departures: those away at the end are not counted)
            "workers_at_end": sim.k if clock is None else sim.k - sum(clock.away),
        }
        if self.config.cluster is not None:
            extra["cluster"] = self.config.cluster["name"]
        extra.update(sim.schedule.counters())
        if sim.meter is not None:
            extra["applied_class_counts"] = sim.meter.applied_counts.tolist()
            extra["data_class_counts"] = sim.meter.data_counts.tolist()
        return extra

    def _tick(self, progress: Progress):
        check = SYNC_FREE_CHECK if self.sim.sync_free else 0  # (0: after every step)
        every = max(1, self.batches.batches_per_epoch // 50, check)
        last = {"checked": self.sim.steps}

        def callback(sim: Simulator) -> bool:
            if sim.steps % every == 0:
                progress.update(sim.steps, sim.log.loss[-1] if len(sim.log) else math.nan)
            if sim.steps - last["checked"] >= check:
                last["checked"] = sim.steps
                if self.diverged(sim):
                    return True
            return preempt.requested() is not None

        return callback


def class_labels(labels: Any) -> Any:
    """The training labels when they are class labels (integers, one per example), for
    the bias meter; else None."""
    if isinstance(labels, torch.Tensor) and labels.dim() == 1 and not labels.is_floating_point():
        return labels
    return None
