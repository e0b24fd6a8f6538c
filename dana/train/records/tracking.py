"""MLflow tracking of a run (``dana train --mlflow DIR_OR_URI``; ``dana sweep`` passes it on).

One MLflow run per run directory, in the experiment ``--mlflow-experiment`` (default
``dana``), named after the run directory:

- parameters: every option of the run's config (nested ones flattened with dots,
  ``timing_params.shape``);
- metrics: every evaluation's row of ``metrics.csv`` (test error and loss, train loss,
  gap, staleness, lr, epoch, times), at step = the master's updates so far; at the end
  the summary's numbers as ``summary.<key>``;
- artifacts: ``config.json``, ``metrics.csv``, ``summary.json``, ``curves.png``, the
  final model ``model.safetensors`` (and ``step_times.csv``, ``dist.json`` of a Ray run);
- tags: ``dana.run_dir`` (its absolute path), ``dana.diverged``.

``DIR_OR_URI``: a directory (MLflow's local file store, offline; created if missing) or
any MLflow tracking URI (``file:...``, ``sqlite:///mlflow.db``, ``http://host:5000``).
The run's id is kept in ``mlflow_run.json`` in the run directory, so ``--resume``
continues the same MLflow run. MLflow is optional (``pip install mlflow-skinny``, or
the extra ``dana-async[mlflow]``); asking for it without it installed is an error
(exit 2) before anything is written.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.errors import DanaError

RUN_ID_FILE = "mlflow_run.json"
ARTIFACTS = (
    "config.json",
    "metrics.csv",
    "summary.json",
    "curves.png",
    "step_times.csv",
    "dist.json",
    "model.safetensors",
)


def import_mlflow() -> Any:
    try:
        import mlflow
        from mlflow.tracking import MlflowClient  # noqa: F401
    except ImportError:
        raise DanaError(
            "--mlflow needs MLflow: pip install mlflow-skinny (or the extra dana-async[mlflow])"
        ) from None
    return mlflow


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


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class MlflowTracker:
    """The MLflow run of one run directory; a sink of :meth:`RunDir.log_row`."""

    def __init__(
        self,
        target: str,
        experiment: str,
        run_path: Path,
        config: dict[str, Any],
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
    ):
        import_mlflow()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(target)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = experiment_id(self.client, experiment)
        except Exception as e:  # a bad URI, an unreachable server, a read-only directory
            raise DanaError(
                f"--mlflow {target}: cannot open the MLflow tracking store: {e}"
            ) from None
        self.run_path = Path(run_path)
        id_file = self.run_path / RUN_ID_FILE
        if id_file.is_file():  # --resume: the same MLflow run
            self.run_id = json.loads(id_file.read_text())["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name or self.run_path.name,
            tags={**(tags or {}), "dana.run_dir": str(self.run_path.resolve())},
        )
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in sorted(_flatten(config).items())]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.run_path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            id_file, json.dumps({"tracking_uri": self.uri, "run_id": self.run_id}) + "\n"
        )

    def log_row(self, row: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = int(row["updates"])
        metrics = [
            Metric(key, float(value), now, step)
            for key, value in row.items()
            if key != "updates" and _finite(value)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: dict[str, Any]) -> None:
        """The summary's numbers, the run's files as artifacts, and the run closed."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = int(summary.get("updates") or 0)
        metrics = [
            Metric(f"summary.{key}", float(value), now, step)
            for key, value in summary.items()
            if _finite(value)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.client.set_tag(
            self.run_id, "dana.diverged", str(bool(summary.get("diverged"))).lower()
        )
        for name in ARTIFACTS:
            path = self.run_path / name
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, interrupted: bool) -> None:
        """Close the MLflow run after an error (``--resume`` reopens it)."""
        try:
            self.client.set_terminated(self.run_id, "KILLED" if interrupted else "FAILED")
        except Exception:  # the store went away: the error being raised matters more
            pass
