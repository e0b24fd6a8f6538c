"""``dana train``: one run of a config into a run directory, on the runner of its backend.

:func:`train` checks the run directory and the config, builds the problem (data and
model) and the algorithm once, and hands them to the runner of ``config.backend``
(:mod:`dana.train.backends`), then writes ``summary.json`` and the curves. What every
runner shares lives here too: the learning-rate schedule (:func:`build_schedule`) and
the points of the data stream where a run evaluates and checkpoints
(:func:`stop_points`).

A NaN or infinite loss is a result, not a crash: the run stops, ``summary.json`` says
``diverged: true`` and at which update, and :func:`train` returns normally.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dana.errors import DanaError
from dana.train.backends import check_backend, runner_class
from dana.train.config import TrainConfig
from dana.train.problem import Problem
from dana.train.progress import Progress
from dana.train.rundir import RunDir
from dana.train.schedule import LRSchedule


def build_schedule(config: TrainConfig) -> LRSchedule:
    """Warm-up from ``peak/k`` to the peak rate, then step decay (``peak = lr``, or
    ``lr * k`` with linear scaling: the warm-up then starts at the one-worker ``lr``)."""
    return LRSchedule(
        config.peak_lr(),
        config.workers,
        config.warmup_epochs,
        tuple(config.lr_decay_epochs),
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


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    version: str = "",
) -> dict[str, Any]:
    """Run ``config`` into the run directory ``out`` (``resume``: continue it)."""
    run = RunDir(out)
    if run.path.exists() and not run.path.is_dir():
        raise DanaError(f"--out {run.path} exists and is not a directory; choose another --out")
    if not resume and run.holds_run():
        raise DanaError(
            f"{run.path} already holds a run; continue it with `dana train --resume {run.path}` "
            "or choose another --out"
        )
    config.validate()
    check_backend(config.backend)
    if config.mlflow:
        from dana.train.tracking import import_mlflow

        import_mlflow()
    algorithm = config.build_algorithm()
    problem = Problem(config)  # loads data and builds the model: bad input fails here
    runner = runner_class(config.backend)(config, run, problem, algorithm)
    if resume:
        state = run.load_checkpoint()
        if state is not None:
            runner.load_state_dict(state)
    else:
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(config.to_dict(), version)
    if config.tensorboard:
        run.open_tensorboard()
    tracker = None
    if config.mlflow:
        from dana.train.tracking import MlflowTracker

        tracker = MlflowTracker(config.mlflow, config.mlflow_experiment, run.path, config.to_dict())
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
    return summary
