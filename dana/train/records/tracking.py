"""Tracking a run outside its directory: MLflow (``--mlflow DIR_OR_URI``) and Weights &
Biases (``--wandb [PROJECT]``); ``dana sweep`` passes either on to every run.

Each is a :class:`Tracker`, a sink of :meth:`RunDir.log_row` that :func:`open_trackers`
opens for the options given and ``execute_run`` (:mod:`dana.train.training`) closes:
:meth:`Tracker.finish` with the summary, or :meth:`Tracker.fail` when the run fails.
Every tracker gets the run's config, every metrics row at step = the master's updates
so far, and the summary; its run's id is kept in the run directory
(:attr:`Tracker.id_file`), so ``--resume`` continues the same tracked run. Both
libraries are optional; asking for one that is not installed is an error (exit 2)
naming what to install, before anything is written (:func:`require_trackers`).

MLflow (:class:`MlflowTracker`), one MLflow run per run directory, in the experiment
``--mlflow-experiment`` (default ``dana``), named after the run directory:

- parameters: every option of the run's config (nested ones flattened with dots,
  ``timing_params.shape``; ``model``: a built-in model's name, or the class of a
  ``dana.fit`` model);
- metrics: every evaluation's row of ``metrics.csv`` (test error and loss, train loss,
  gap, staleness, lr, epoch, times); at the end the summary's numbers as
  ``summary.<key>``;
- artifacts: ``config.json``, ``metrics.csv``, ``summary.json``, ``curves.png``, the
  final model ``model.safetensors`` (and ``step_times.csv``, ``dist.json`` of a Ray run);
- tags: ``dana.run_dir`` (its absolute path; none for the temporary directory of a
  ``dana.fit`` without ``out=``, deleted after the run), ``dana.diverged``.

``DIR_OR_URI``: a directory (MLflow's local file store, offline; created if missing) or
any MLflow tracking URI (``file:...``, ``sqlite:///mlflow.db``, ``http://host:5000``).

W&B (:class:`WandbTracker`): a run of the project ``PROJECT`` (default ``dana``), named
after the run directory, with the config as its config, the rows as its history and the
summary's numbers in its summary; a failed run finishes with exit code 1 (failed).
Offline unless the environment sets ``WANDB_MODE`` (``online`` to sync as it runs, or
``wandb sync`` the offline run later); the files go under ``WANDB_DIR`` (default
``./wandb``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from dana.atomic import write_text_atomic
from dana.errors import DanaError

ARTIFACTS = (
    "config.json",
    "metrics.csv",
    "summary.json",
    "curves.png",
    "step_times.csv",
    "dist.json",
    "model.safetensors",
)


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told of the run it tracks: its directory ``path`` (its files,
    the tracker's id file), its ``config`` (TrainConfig as a dict), the tracked run's
    ``name`` (None: the directory's) and ``tags``; ``kept``: False for a temporary
    directory (``dana.fit`` without ``out=``), which no tag may name."""

    path: Path
    config: dict[str, Any]
    name: str | None = None
    tags: dict[str, str] | None = None
    kept: bool = True

    @property
    def title(self) -> str:
        return self.name or self.path.name


class Tracker:
    """A tracker of one run: a sink of :meth:`RunDir.log_row`. A subclass names its
    TrainConfig ``option`` (its value: where to track), the ``library`` it imports and
    how to ``install`` it, and the ``id_file`` that keeps its run's id for ``--resume``."""

    option: ClassVar[str]
    library: ClassVar[str]
    install: ClassVar[str]
    id_file: ClassVar[str]

    @classmethod
    def require(cls) -> Any:
        """The library's module; DanaError naming what to install when it is missing."""
        try:
            return import_module(cls.library)
        except ImportError:
            flag = "--" + cls.option.replace("_", "-")
            raise DanaError(f"{flag} needs {cls.library.split('.')[0]}: {cls.install}") from None

    def __init__(self, run: TrackedRun):
        self.run_path = run.path

    def saved(self) -> dict[str, Any] | None:
        """What :meth:`save` kept in the run directory (a resumed run), else None."""
        path = self.run_path / self.id_file
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, ids: dict[str, Any]) -> None:
        """Keep the tracked run's ``ids`` in the run directory, for ``--resume``."""
        self.run_path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.run_path / self.id_file, json.dumps(ids) + "\n")

    def log_row(self, row: dict[str, float]) -> None:
        """Log one metrics row, at step ``row["updates"]``."""
        raise NotImplementedError

    def finish(self, summary: dict[str, Any]) -> None:
        """Log the summary and close the tracked run as finished."""
        raise NotImplementedError

    def fail(self, interrupted: bool) -> None:
        """Close the tracked run after an error (``interrupted``: a signal or Ctrl-C), never
        raising: the run's own error matters more (``--resume`` reopens it)."""
        raise NotImplementedError


def require_trackers(options: Mapping[str, Any]) -> None:
    """DanaError naming what to install for each tracker ``options`` (TrainConfig values,
    or a sweep's fixed settings) asks for whose library is missing."""
    for tracker in TRACKERS:
        if options.get(tracker.option):
            tracker.require()


def open_trackers(run: TrackedRun) -> list[Tracker]:
    """A tracker for each one ``run.config`` asks for, opened (on an error, those already
    opened are failed)."""
    opened: list[Tracker] = []
    try:
        for tracker in TRACKERS:
            if run.config.get(tracker.option):
                opened.append(tracker(run))
    except BaseException:
        for tracker in opened:
            tracker.fail(interrupted=False)
        raise
    return opened


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = (
                json.dumps(value) if isinstance(value, list | dict) else str(value)
            )
    return flat


def finite(values: Mapping[str, Any], skip: str = "") -> dict[str, float]:
    """The finite numbers of ``values`` (not booleans), but ``skip``, as floats."""
    return {
        key: float(value)
        for key, value in values.items()
        if key != skip
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def tracking_uri(target: str) -> str:
    """A tracking URI: ``target`` itself when it has a scheme, else a ``file:`` URI of
    the directory (MLflow's local file store, which MLflow 3 accepts on request)."""
    if "://" in target or target.startswith("file:"):
        uri = target
    else:
        uri = Path(target).expanduser().resolve().as_uri()
    if uri.startswith("file:"):
        # MLflow 3 keeps the file store in maintenance mode and refuses it unless asked.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name``, created if missing (a sweep's runs race for it)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # another process created it in between
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class MlflowTracker(Tracker):
    """The MLflow run of one run directory, in ``--mlflow``'s store."""

    option = "mlflow"
    library = "mlflow.tracking"
    install = "pip install mlflow-skinny (or the extra dana-async[mlflow])"
    id_file = "mlflow_run.json"

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        self.require()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        target = run.config["mlflow"]
        self.uri = tracking_uri(target)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = experiment_id(self.client, run.config["mlflow_experiment"])
        except Exception as e:  # a bad URI, an unreachable server, a read-only directory
            raise DanaError(
                f"--mlflow {target}: cannot open the MLflow tracking store: {e}"
            ) from None
        saved = self.saved()
        if saved is not None:  # --resume: the same MLflow run
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = dict(run.tags or {})
        if run.kept:
            tags["dana.run_dir"] = str(run.path.resolve())
        self.run_id = self.client.create_run(
            self.experiment_id, run_name=run.title, tags=tags
        ).info.run_id
        params = [Param(k, v[:6000]) for k, v in sorted(_flatten(run.config).items())]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.save({"tracking_uri": self.uri, "run_id": self.run_id})

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_row(self, row: dict[str, float]) -> None:
        self._log(finite(row, skip="updates"), int(row["updates"]))

    def finish(self, summary: dict[str, Any]) -> None:
        """The summary's numbers (``summary.<key>``), the run's files as artifacts, and
        the run closed."""
        numbers = finite(summary)
        self._log({f"summary.{k}": v for k, v in numbers.items()}, int(numbers.get("updates", 0)))
        self.client.set_tag(
            self.run_id, "dana.diverged", str(bool(summary.get("diverged"))).lower()
        )
        for name in ARTIFACTS:
            path = self.run_path / name
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, interrupted: bool) -> None:
        try:
            self.client.set_terminated(self.run_id, "KILLED" if interrupted else "FAILED")
        except Exception:  # the store went away: the error being raised matters more
            pass


class WandbTracker(Tracker):
    """The W&B run of one run directory, in the project ``--wandb`` names; offline
    unless the environment sets ``WANDB_MODE``."""

    option = "wandb"
    library = "wandb"
    install = "pip install wandb (or the extra dana-async[wandb])"
    id_file = "wandb_run.json"

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        wandb = self.require()
        project = run.config["wandb"]
        saved = self.saved()  # --resume: the same W&B run
        try:
            self.run = wandb.init(
                project=project,
                name=run.title,
                config=run.config,
                id=saved["run_id"] if saved else None,
                resume="allow" if saved else None,
                # Read here, at each run: wandb reads its environment once per process.
                mode=os.environ.get("WANDB_MODE", "offline"),
                dir=os.environ.get("WANDB_DIR"),
                reinit="create_new",  # never the caller's own active run
                settings=wandb.Settings(console="off"),  # the caller's output stays its own
            )
        except Exception as e:  # a bad project name, no credentials for online mode
            raise DanaError(f"--wandb {project}: cannot start the W&B run: {e}") from None
        if saved is None:
            self.save({"project": project, "run_id": self.run.id})

    def log_row(self, row: dict[str, float]) -> None:
        self.run.log(finite(row, skip="updates"), step=int(row["updates"]))

    def finish(self, summary: dict[str, Any]) -> None:
        """The summary's numbers in the run's summary, and the run finished."""
        self.run.summary.update({**finite(summary), "diverged": bool(summary.get("diverged"))})
        self.run.finish(exit_code=0)

    def fail(self, interrupted: bool) -> None:
        try:
            self.run.finish(exit_code=1)  # W&B marks it failed (it has no "killed" of its own)
        except Exception:  # the error being raised matters more
            pass


#: Every tracker, in the order they open.
TRACKERS: tuple[type[Tracker], ...] = (MlflowTracker, WandbTracker)
