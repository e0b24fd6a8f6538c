"""``dana train``: one run of a config into a run directory, on the runner of its backend.

:func:`train` checks the run directory and the config, builds the problem (data and
model) and the algorithm once, and hands them to the runner of ``config.backend``
(:mod:`dana.train.backends`), then writes ``summary.json`` and the curves
(:func:`start_run` and :func:`execute_run`, the run's life that :func:`dana.fit` shares).
What every runner shares lives here too: the learning-rate schedule (:func:`build_schedule`) and
the points of the data stream where a run evaluates and checkpoints
(:func:`stop_points`).

A NaN or infinite loss is a result, not a crash: the run stops, ``summary.json`` says
``diverged: true`` and at which update, and :func:`train` returns normally.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from dana.errors import DanaError, Preempted
from dana.train.backends import check_backend, runner_class
from dana.train.config import Flags, TrainConfig
from dana.train.records import preempt
from dana.train.records.progress import Progress
from dana.train.records.rundir import SETTINGS_KEY, RunDir, check_local
from dana.train.records.tracking import TrackedRun, open_trackers, require_trackers
from dana.train.rules.members import check_growth_reached
from dana.train.rules.schedule import LRSchedule
from dana.train.task.problem import Problem, TrainingProblem

T = TypeVar("T")


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
    # The last checkpoint is the end state (with --checkpoint-every): it holds the run
    # as it finished, whatever the interval.
    checkpoints = multiples(config.checkpoint_every) | (
        {end} if config.checkpoint_every > 0 else set()
    )
    return sorted(evals | checkpoints), evals, checkpoints


def run_to_end(steps: Generator[None, None, T]) -> T:
    """Drive a step-by-step generator (:func:`training`, a runner's ``execute_steps``) to its
    end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    version: str = "",
    threads: int = 1,
) -> dict[str, Any]:
    """Run ``config`` into the run directory ``out`` (``resume``: continue it).

    A new run goes only into a new or empty directory; one that fails before its first
    evaluation (bad input found late, an unreachable cluster) leaves nothing behind. A
    resumed run removes the temporary files a kill inside a write left, and refuses a
    checkpoint that does not fit its config.json. ``threads``: the CPU threads the run
    uses (``--threads``; the simulator computes that many workers' gradients at once)."""
    steps = training(
        config, out, resume=resume, progress=progress, version=version, threads=threads
    )
    return run_to_end(steps)


def training(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    version: str = "",
    threads: int = 1,
    **options: Any,
) -> Generator[None, None, dict[str, Any]]:
    """:func:`train` step by step: yields once when the run is ready (built, its
    checkpoint loaded), then after each step of a runner that has ``execute_steps`` (the
    simulator's: runs packed into one process are advanced in turn); returns the
    summary. ``options`` go to the runner (``pack``: the simulator's)."""
    check_local(out, "--resume" if resume else "--out")
    run = RunDir(out)
    # (a signal while the run is built: Preempted at once, saying how to go on)
    again = f"`dana train --resume {run.path}`"
    with preempt.starting(f"nothing written; run {again if resume else 'the same command'} again"):
        if resume:
            if run.path.exists() and not run.path.is_dir():
                raise DanaError(f"--resume {run.path} is not a directory; give a run directory")
        else:
            run.check_new()
        config = config.validate()
        check_backend(config.backend)
        require_trackers(config.to_dict())
        algorithm = config.build_algorithm()
        problem = Problem(config)  # loads data and builds the model: bad input fails here
        runner_cls = check_runner(config, problem)
        run.settings = json.dumps(config.to_dict(), sort_keys=True)
        add_columns(run, problem)
        state = None
        if resume:
            run.remove_temporaries()
            state = run.load_checkpoint()
    with run.removed_on_failure() if not resume else nullcontext():
        with preempt.starting(f"no step taken; start it with {again}"):
            runner = runner_cls(config, run, problem, algorithm, threads=threads, **options)
            if state is not None:
                _check_settings(run, state.pop(SETTINGS_KEY, None), config)
                try:
                    runner.load_state_dict(state)
                except (
                    KeyError,
                    IndexError,
                    TypeError,
                    ValueError,
                    AttributeError,
                    RuntimeError,
                ) as e:
                    what = f"it lacks the entry {e}" if isinstance(e, KeyError) else str(e)
                    raise run.bad_checkpoint(what) from None
            if not resume:
                start_run(run, config, version)
            if config.tensorboard:
                run.open_tensorboard()
        title = f"{config.algorithm}, k={config.workers}, {config.model} on {config.dataset}"
        yield
        summary = yield from run_steps(runner, config, run, title, progress, problem)
    return summary


def check_runner(
    config: TrainConfig, problem: TrainingProblem, names: dict[str, str] | None = None
) -> Any:
    """The runner class of ``config.backend``, once ``config`` is checked against
    ``problem``: the runner's own checks, and growth points (``grow_at``) the run reaches.
    ``names``: how the caller names the options (:meth:`TrainConfig.validate`'s)."""
    runner_cls = runner_class(config.backend)
    runner_cls.check(config, problem)
    end = stop_points(config, problem.dataset.train_size // config.batch_size)[0][-1]
    check_growth_reached(config, end, Flags(names))
    return runner_cls


def add_columns(run: RunDir, problem: TrainingProblem) -> None:
    """The run's ``metrics.csv`` columns beyond dana's own: the problem's measured ones
    (a metric hook's) and derived ones (a language model's perplexity)."""
    run.measured = tuple(problem.measured)
    run.derived = dict(problem.derived)


def start_run(run: RunDir, config: TrainConfig, version: str) -> None:
    """A new run: its directory (and parents) and its ``config.json``."""
    run.create()
    run.write_config(config.to_dict(), version)


def execute_run(
    runner: Any,
    config: TrainConfig,
    run: RunDir,
    title: str,
    progress: bool,
    problem: TrainingProblem | None = None,
    tracking: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's life on any runner, as ``dana train`` and :func:`dana.fit` live it: open its
    trackers (MLflow, W&B: :mod:`dana.train.records.tracking`; ``tracking``: the
    :class:`TrackedRun`'s ``name``, ``tags`` and ``kept``), ``runner.execute`` with a
    progress reporter titled ``title``, write ``summary.json``, the final model
    (``problem``'s, at ``runner.final_params()``: ``model.safetensors``) and the curves,
    close the run directory's writers whatever happens, and finish the trackers. A
    failure (an interruption too) marks them failed and propagates; SIGTERM or SIGINT
    make the runner checkpoint and raise :class:`~dana.errors.Preempted`
    (:mod:`dana.train.records.preempt`). The summary."""
    return run_to_end(run_steps(runner, config, run, title, progress, problem, tracking))


def run_steps(
    runner: Any,
    config: TrainConfig,
    run: RunDir,
    title: str,
    progress: bool,
    problem: TrainingProblem | None = None,
    tracking: dict[str, Any] | None = None,
) -> Generator[None, None, dict[str, Any]]:
    """:func:`execute_run` step by step: yields after each step of a runner that has
    ``execute_steps`` (else runs ``execute`` at once); returns the summary."""
    trackers = open_trackers(TrackedRun(run.path, config.to_dict(), **(tracking or {})))
    run.sinks.extend(trackers)
    try:
        # SIGTERM/SIGINT: a checkpoint, then Preempted; once the run is over, its files
        # are written whatever comes (summary.json last: it marks the run finished)
        with preempt.watching():
            reporter = Progress(enabled=progress, desc=title)
            steps = getattr(runner, "execute_steps", None)
            if steps is not None:
                summary = yield from steps(reporter)
            else:
                summary = runner.execute(reporter)
            if problem is not None:
                problem.save_model(run.path, runner.final_params())
                if references := problem.references():
                    summary["reference_losses"] = references
            if runner.rows:
                run.write_plot(runner.rows, title)
            run.write_summary(summary)
    except BaseException as e:
        for tracker in trackers:
            tracker.fail(isinstance(e, KeyboardInterrupt | Preempted))
        raise
    finally:
        run.close()
    for tracker in trackers:
        tracker.finish(summary)
    return summary


def _check_settings(run: RunDir, saved: Any, config: TrainConfig) -> None:
    """DanaError if ``config.json`` no longer holds the settings the checkpoint was
    written with: a resumed run continues exactly the run it was (docs/USAGE.md, "Resuming")."""
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
