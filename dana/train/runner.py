"""``dana train``'s loop on the simulator: evaluations, checkpoints, divergence, the run dir.

The run stops at fixed points of the data stream (every ``eval_every`` epochs, every
``checkpoint_every`` epochs, the end). At an evaluation point it appends a row to
``metrics.csv``: the master's test loss and error, and over the pushes since the last
row the mean training loss, gap and staleness. At a checkpoint point it saves the
whole state, so that ``--resume`` continues exactly: a resumed run's ``metrics.csv``
equals the uninterrupted run's but for ``wall_seconds``.

A NaN or infinite loss is a result, not a crash: the run stops, ``summary.json`` says
``diverged: true`` and at which update, and :func:`train` returns normally.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from dana import algorithms
from dana.errors import DanaError
from dana.sim.simulator import Simulator
from dana.train.batches import BatchStream
from dana.train.config import TrainConfig
from dana.train.problem import Problem
from dana.train.progress import Progress
from dana.train.resources import check_memory
from dana.train.rundir import SETTINGS_KEY, RunDir
from dana.train.schedule import LRSchedule


def build_schedule(config: TrainConfig, batches_per_epoch: int) -> LRSchedule:
    """Warm-up from ``peak/k`` to the peak rate, then step decay (``peak = lr``, or
    ``lr * k`` with linear scaling: the warm-up then starts at the one-worker ``lr``);
    an unset warm-up or decay takes the automatic one (TrainConfig.warmup_epochs_for,
    decay_epochs_for)."""
    return LRSchedule(
        config.peak_lr(),
        config.workers,
        config.warmup_epochs_for(batches_per_epoch),
        tuple(config.decay_epochs_for()),
        config.lr_decay_factor,
    )


def stop_points(
    config: TrainConfig, batches_per_epoch: int
) -> tuple[list[int], set[int], set[int]]:
    """The step counts where the run stops: (all, evaluations, checkpoints)."""
    end = max(1, round(config.epochs * batches_per_epoch))

    def multiples(every: float) -> set[int]:
        if every <= 0:
            return set()
        n = int(config.epochs / every + 1e-9)
        return {min(end, round(i * every * batches_per_epoch)) for i in range(1, n + 1)}

    evals = {0, end} | multiples(config.eval_every)
    checkpoints = multiples(config.checkpoint_every) - {end}
    return sorted(evals | checkpoints), evals, checkpoints


class SimRun:
    """One simulated training run writing to one run directory."""

    def __init__(self, config: TrainConfig, run: RunDir, problem: Problem):
        self.config, self.run, self.problem = config, run, problem
        algorithm = algorithms.build(config.algorithm, **config.algorithm_hparams())
        self.batches = BatchStream(problem.dataset.train_size, config.batch_size, seed=config.seed)
        self.sim = Simulator(
            algorithm,
            problem.initial_params(),
            problem.gradient,
            self.batches,
            config.workers,
            lr=build_schedule(config, self.batches.batches_per_epoch),
            weight_decay=config.weight_decay,
            timing=config.timing,
            timing_params=config.timing_params,
            seed=config.seed,
            max_staleness=config.max_staleness,
        )
        self.rows: list[dict[str, float]] = []
        self.logged = 0  # pushes already summarised in a metrics row
        self.wall_before = 0.0  # wall seconds spent before a resume
        self.diverged_at: int | None = None

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
    def evaluate(self, wall: float) -> dict[str, float]:
        log = self.sim.log.numpy(self.logged)
        self.logged = len(self.sim.log)
        test_loss, test_error = self.problem.evaluate(self.sim.params())
        row = {
            "epoch": self.sim.epoch,
            "updates": self.sim.updates,
            "sim_time": self.sim.sim_time,
            "wall_seconds": wall,
            "lr": self.sim.lr(),
            "train_loss": _mean(log["loss"]),
            "test_loss": test_loss,
            "test_error": test_error,
            "mean_gap": _mean(log["gap"]),
            "mean_staleness": _mean(log["staleness"]),
        }
        self.rows.append(row)
        return row

    def diverged(self, sim: Simulator) -> bool:
        if len(sim.log) and not math.isfinite(sim.log.loss[-1]):
            self.diverged_at = sim.updates
            return True
        return False

    def execute(self, progress: Progress) -> dict[str, Any]:
        points, evals, checkpoints = stop_points(self.config, self.batches.batches_per_epoch)
        start = time.perf_counter()

        def wall() -> float:
            return self.wall_before + time.perf_counter() - start

        done = {r["epoch"] for r in self.rows}
        progress.start(points[-1], self.sim.steps)
        for point in points:
            if point < self.sim.steps or (point == self.sim.steps and self.sim.epoch in done):
                continue
            self.sim.run(pushes=point, callback=self._tick(progress))
            if self.diverged_at is not None:
                break
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
            self.rows.append(self._divergence_row(wall()))
            self.run.write_metrics(self.rows)
        return summarize(
            self.config, self.rows, self.sim.log.numpy(), self.diverged_at, wall(), self.sim
        )

    def _tick(self, progress: Progress):
        every = max(1, self.batches.batches_per_epoch // 50)

        def callback(sim: Simulator) -> bool:
            if sim.steps % every == 0:
                progress.update(sim.steps, sim.log.loss[-1] if len(sim.log) else math.nan)
            return self.diverged(sim)

        return callback

    def _divergence_row(self, wall: float) -> dict[str, float]:
        log = self.sim.log.numpy(self.logged)
        return {
            "epoch": self.sim.epoch,
            "updates": self.sim.updates,
            "sim_time": self.sim.sim_time,
            "wall_seconds": wall,
            "lr": self.sim.lr(),
            "train_loss": math.nan,
            "test_loss": math.nan,
            "test_error": math.nan,
            "mean_gap": _mean(log["gap"]),
            "mean_staleness": _mean(log["staleness"]),
        }


def summarize(
    config: TrainConfig,
    rows: list[dict[str, float]],
    log: dict[str, np.ndarray],
    diverged_at: int | None,
    wall_seconds: float,
    sim: Any,
) -> dict[str, Any]:
    """The figures of ``summary.json``."""
    errors = [r["test_error"] for r in rows if math.isfinite(r["test_error"])]
    last = rows[-1]
    staleness = log["staleness"]
    return {
        "algorithm": config.algorithm,
        "workers": config.workers,
        "dataset": config.dataset,
        "model": config.model,
        "seed": config.seed,
        "final_test_error": last["test_error"],
        "best_test_error": min(errors) if errors else math.nan,
        "final_test_loss": last["test_loss"],
        "diverged": diverged_at is not None,
        "diverged_at_update": diverged_at,
        "updates": sim.updates,
        "pushes": sim.pushes,
        "epochs": sim.epoch,
        "sim_time": sim.sim_time,
        "mean_gap": _mean(log["gap"]),
        "mean_staleness": _mean(staleness),
        "max_staleness": int(staleness.max()) if len(staleness) else 0,
        "wait_time": float(getattr(sim, "wait_time", 0.0)),
        "wall_seconds": wall_seconds,
    }


def _mean(values: np.ndarray) -> float:
    values = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    return float(values.mean()) if len(values) else math.nan


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    version: str = "",
) -> dict[str, Any]:
    """Run ``config`` into the run directory ``out`` (``resume``: continue it).

    A new run goes only into a new or empty directory; one that fails before its first
    evaluation (bad input found late, an unreachable cluster) leaves nothing behind. A
    resumed run removes the temporary files a kill inside a write left, and refuses a
    checkpoint that does not fit its config.json."""
    run = RunDir(out)
    if resume:
        if run.path.exists() and not run.path.is_dir():
            raise DanaError(f"--resume {run.path} is not a directory; give a run directory")
    else:
        run.check_new()
    config.validate()
    if config.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise DanaError("--backend ray needs Ray: pip install 'ray>=2.9'") from None
    if config.mlflow:
        from dana.train.tracking import import_mlflow

        import_mlflow()
    problem = Problem(config)  # loads data and builds the model: bad input fails here
    if config.backend == "sim":
        check_memory(config, problem.flat.d)
    run.settings = json.dumps(config.to_dict(), sort_keys=True)
    state = None
    if resume:
        run.remove_temporaries()
        state = run.load_checkpoint()
    created = not run.path.exists()
    tracker = None
    try:
        if config.backend == "ray":
            from dana.dist.launcher import RayRun

            runner: Any = RayRun(config, run, problem)
        else:
            runner = SimRun(config, run, problem)
        if state is not None:
            _check_settings(run, state.pop(SETTINGS_KEY, None), config)
            try:
                runner.load_state_dict(state)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as e:
                what = f"it lacks the entry {e}" if isinstance(e, KeyError) else str(e)
                raise run.bad_checkpoint(what) from None
        if not resume:
            run.create()
            run.write_config(config.to_dict(), version)
        if config.tensorboard:
            run.open_tensorboard()
        if config.mlflow:
            from dana.train.tracking import MlflowTracker

            tracker = MlflowTracker(
                config.mlflow, config.mlflow_experiment, run.path, config.to_dict()
            )
            run.sinks.append(tracker)
        title = f"{config.algorithm}, k={config.workers}, {config.model} on {config.dataset}"
        try:
            summary = runner.execute(Progress(enabled=progress, desc=title))
        except BaseException as e:
            if tracker is not None:
                tracker.fail(isinstance(e, KeyboardInterrupt))
            raise
        finally:
            run.close()
        run.write_summary(summary)
        if runner.rows:
            run.write_plot(runner.rows, title)
        if tracker is not None:
            tracker.finish(summary)
    except DanaError:
        if not resume and not (run.checkpoint.is_file() or run.metrics.is_file()):
            run.remove_own(keep_folder=not created)  # a failed start leaves nothing
        raise
    return summary


def _check_settings(run: RunDir, saved: Any, config: TrainConfig) -> None:
    """DanaError if ``config.json`` no longer holds the settings the checkpoint was
    written with: a resumed run continues exactly the run it was (README, "Resuming")."""
    if saved is None:
        return  # a checkpoint of an older version: it holds no settings to compare
    try:
        held = json.loads(saved)
    except (TypeError, ValueError):
        raise run.bad_checkpoint("its run settings are unreadable") from None
    if not isinstance(held, dict):
        raise run.bad_checkpoint("its run settings are not a mapping")
    now = config.to_dict()
    defaults = TrainConfig().to_dict()
    diff = sorted(k for k in now if held.get(k, defaults[k]) != now[k])
    if diff:
        shown = "; ".join(
            f"{k}: {held.get(k, defaults[k])!r} at the checkpoint, {now[k]!r} now" for k in diff
        )
        raise DanaError(
            f"{run.config} was edited after the checkpoint was written ({shown}). --resume "
            "continues a run exactly as it was started: put those settings back, or start a "
            f"new run with the edited settings: `dana train --config {run.config} --out NEW`"
        )
