"""A run is a directory; this module reads and writes it, every file atomically.

- ``config.json``: the :class:`~dana.train.config.TrainConfig` and the package version;
  ``dana train --config config.json`` reruns the run.
- ``metrics.csv``: one row per evaluation (:data:`METRICS_COLUMNS`).
- ``summary.json``: the final figures (see :func:`dana.train.metrics.summarize`).
- ``curves.png``: test error and mean gap against epochs.
- ``checkpoint.pt``: the whole state, for ``--resume`` (tensors and plain values only,
  loaded with ``torch.load(weights_only=True)``: no arbitrary unpickling).
- ``step_times.csv``: (Ray runs) each worker's measured step times, in the format the
  simulator's ``trace`` timing model replays.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import torch

from dana.atomic import atomic_path, write_atomic, write_text_atomic
from dana.errors import DanaError

METRICS_COLUMNS = (
    "epoch",
    "updates",
    "sim_time",
    "wall_seconds",
    "lr",
    "train_loss",
    "test_loss",
    "test_error",
    "mean_gap",
    "mean_staleness",
)


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = self.path / "config.json"
        self.metrics = self.path / "metrics.csv"
        self.summary = self.path / "summary.json"
        self.plot = self.path / "curves.png"
        self.checkpoint = self.path / "checkpoint.pt"
        self.step_times = self.path / "step_times.csv"
        self.tensorboard = self.path / "tensorboard"
        self._writer = None
        self.sinks: list = []  # more receivers of every metrics row (MLflow)

    def holds_run(self) -> bool:
        return self.config.is_file()

    def finished(self) -> bool:
        return self.summary.is_file()

    def write_config(self, config: dict[str, Any], version: str) -> None:
        write_text_atomic(
            self.config, json.dumps({**config, "dana_version": version}, indent=2) + "\n"
        )

    def read_config(self) -> dict[str, Any]:
        if not self.holds_run():
            raise DanaError(
                f"{self.path}: holds no run (no config.json); give the --out directory of a "
                "run started with `dana train`"
            )
        try:
            return json.loads(self.config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DanaError(f"{self.config}: unreadable run config: {e}") from None

    def write_metrics(self, rows: list[dict[str, float]]) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=METRICS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row[k]) for k in METRICS_COLUMNS})
        write_text_atomic(self.metrics, buf.getvalue())

    def read_metrics(self) -> list[dict[str, float]]:
        with self.metrics.open(newline="") as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]

    def open_tensorboard(self) -> None:
        """Also log every metrics row as TensorBoard scalars under ``tensorboard/``."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DanaError(
                "--tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None
        self._writer = SummaryWriter(log_dir=str(self.tensorboard))

    def log_row(self, row: dict[str, float]) -> None:
        """Send one metrics row to TensorBoard (if open) and to every sink, indexed by
        master updates."""
        for sink in self.sinks:
            sink.log_row(row)
        if self._writer is None:
            return
        step = int(row["updates"])
        for key in METRICS_COLUMNS:
            if key not in ("updates",) and math.isfinite(row[key]):
                self._writer.add_scalar(key, row[key], step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_text_atomic(self.summary, json.dumps(_jsonable(summary), indent=2) + "\n")

    def read_summary(self) -> dict[str, Any]:
        return json.loads(self.summary.read_text())

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write the checkpoint; the previous one is replaced only once this one is whole."""
        buf = io.BytesIO()
        torch.save(state, buf)
        write_atomic(self.checkpoint, buf.getvalue())

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint.is_file():
            return None
        try:
            return torch.load(self.checkpoint, weights_only=True)
        except Exception as e:  # a corrupt file: say which, never guess
            raise DanaError(f"{self.checkpoint}: unreadable checkpoint ({e})") from None

    def write_plot(self, rows: list[dict[str, float]], title: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        epochs = [r["epoch"] for r in rows]
        fig, (ax_err, ax_gap) = plt.subplots(1, 2, figsize=(10, 4))
        ax_err.plot(epochs, [100 * r["test_error"] for r in rows], marker="o")
        ax_err.set(xlabel="epoch", ylabel="test error (%)", title="test error")
        ax_gap.plot(epochs, [r["mean_gap"] for r in rows], marker="o", color="tab:red")
        ax_gap.set(xlabel="epoch", ylabel="mean gap RMS(theta - p_i)", title="gap")
        for ax in (ax_err, ax_gap):
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        with atomic_path(self.plot) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)


def _fmt(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
