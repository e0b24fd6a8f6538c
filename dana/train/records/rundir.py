"""A run is a directory; this module reads and writes it, every file atomically.

- ``config.json``: the :class:`~dana.train.config.TrainConfig` and the package version;
  ``dana train --config config.json`` reruns the run.
- ``metrics.csv``: one row per evaluation (:data:`METRICS_COLUMNS`, then the columns
  of a metric hook, :attr:`RunDir.measured`, then the problem's derived columns,
  :attr:`RunDir.derived`: a language model's ``test_perplexity``).
- ``summary.json``: the final figures (see :func:`dana.train.records.metrics.summarize`).
- ``curves.png``: test error (or loss), each measured metric and mean gap against epochs.
- ``model.safetensors``: the final model (:mod:`dana.train.records.modelfile`).
- ``checkpoint.pt``: the whole state, for ``--resume`` (tensors and plain values only,
  loaded with ``torch.load(weights_only=True)``: no arbitrary unpickling).
- ``step_times.csv``: (Ray runs) each worker's measured step times, in the format the
  simulator's ``trace`` timing model replays.
- ``dist.json`` (Ray runs) and ``tensorboard/`` (with ``--tensorboard``).

Other people's files are safe: a new run goes only into a new or empty directory
(:meth:`RunDir.check_new`), and :meth:`RunDir.remove_own` removes only the files named
here (and the temporary files of their interrupted writes), never anything else.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dana.atomic import (
    atomic_path,
    remove_temporaries,
    temporaries,
    write_atomic,
    write_text_atomic,
)
from dana.errors import ConfigError, DanaError, WriteError

#: A Ray run's record of the calls its head passed on (``dana replay``, dana.ps.calls).
REPLAY_FILE = "replay.npz"
#: The files a run directory holds, all written by ``dana train``.
RUN_FILES = (
    "config.json",
    "metrics.csv",
    "summary.json",
    "curves.png",
    "checkpoint.pt",
    "step_times.csv",
    "dist.json",
    REPLAY_FILE,
    "model.safetensors",
)
TENSORBOARD = "tensorboard"
#: The checkpoint's entry holding the run's settings (JSON of the TrainConfig).
SETTINGS_KEY = "run_settings"

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


#: A URI's scheme (``s3://``, ``gs://``, ``http://``): not a local path.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_local(path: str | Path, flag: str = "--out") -> None:
    """DanaError for an empty path (which would mean the current directory) or a remote
    location (``s3://bucket/x``): runs are written to local directories only."""
    if not str(path).strip():
        raise ConfigError(f"{flag} is empty; give the path of a directory")
    if _URI.match(str(path)):
        raise ConfigError(
            f"{flag} {path}: runs are written to a local directory, not to remote storage; "
            "give a local path (and copy the run there afterwards: `aws s3 sync DIR URI`, "
            "or track it in MLflow with --mlflow, whose artifact store may be remote)"
        )


def check_directory(path: str | Path, flag: str = "--out") -> None:
    """DanaError unless ``path`` may be a directory to write into: local (:func:`check_local`),
    not a file, and under directories (a new one is created there)."""
    check_local(path, flag)
    path = Path(path)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"{flag} {path}: {parent} is a file, not a directory; choose {flag} under "
                    "a directory"
                )
            break
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} exists and is not a directory; choose another")


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = self.path / "config.json"
        self.metrics = self.path / "metrics.csv"
        self.summary = self.path / "summary.json"
        self.plot = self.path / "curves.png"
        self.checkpoint = self.path / "checkpoint.pt"
        self.step_times = self.path / "step_times.csv"
        self.tensorboard = self.path / TENSORBOARD
        self._writer = None
        self.sinks: list = []  # more receivers of every metrics row (MLflow)
        #: The run's settings as JSON, saved in every checkpoint (``--resume`` compares).
        self.settings: str | None = None
        #: Columns computed from each metrics row's values as it is written or logged
        #: (the problem's: ``test_perplexity`` of a language model), after
        #: :data:`METRICS_COLUMNS`.
        self.derived: dict[str, Callable[[dict[str, float]], float]] = {}
        #: Columns measured at each evaluation beyond the loss and the error (a
        #: ``dana.fit`` metric hook's, ``test_NAME``), after :data:`METRICS_COLUMNS`.
        self.measured: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of this run's ``metrics.csv``."""
        return METRICS_COLUMNS + self.measured + tuple(self.derived)

    def complete(self, row: dict[str, float]) -> dict[str, float]:
        """Add the derived columns to ``row`` (in place, once) and return it."""
        for key, derive in self.derived.items():
            if key not in row:
                row[key] = derive(row)
        return row

    def holds_run(self) -> bool:
        return self.config.is_file()

    # -- whose files --------------------------------------------------------------------
    def own_files(self) -> list[Path]:
        """What ``dana train`` wrote here: the run's files, the temporary files of their
        interrupted writes, ``tensorboard/`` when it holds only TensorBoard event files."""
        found = [self.path / n for n in RUN_FILES if (self.path / n).is_file()]
        for name in RUN_FILES:
            found += temporaries(self.path / name)
        board = self.path / TENSORBOARD
        if board.is_dir() and all(
            p.is_file() and p.name.startswith("events.out.tfevents.") for p in board.iterdir()
        ):
            found.append(board)
        return found

    def foreign_files(self) -> list[Path]:
        """What is here that ``dana train`` did not write."""
        if not self.path.is_dir():
            return []
        own = set(self.own_files())
        return sorted(p for p in self.path.iterdir() if p not in own)

    def remove_temporaries(self) -> list[Path]:
        """Remove the temporary files that writes cut short by a kill left behind."""
        removed = []
        for name in RUN_FILES:
            removed += remove_temporaries(self.path / name)
        return removed

    def remove_own(self, keep_folder: bool = False) -> list[Path]:
        """Remove what ``dana train`` wrote here (and the folder, if then empty, unless
        ``keep_folder``); what is left: the files it did not write."""
        for p in self.own_files():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        left = self.foreign_files()
        if self.path.is_dir() and not left and not keep_folder:
            self.path.rmdir()
        return left

    def check_new(self, flag: str = "--out") -> None:
        """DanaError unless a new run may go here: the folder is new, or empty but for
        temporary files of our own interrupted writes (removed), and lies under folders.
        ``flag``: how the caller names the directory (``dana.fit``: ``out``)."""
        check_directory(self.path, flag)
        if self.holds_run():
            raise ConfigError(
                f"{self.path} already holds a run; continue it with `dana train --resume "
                f"{self.path}` or choose another {flag}"
            )
        self.remove_temporaries()
        held = sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        if held:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            raise ConfigError(
                f"{flag} {self.path} is not empty (it holds {shown}) and holds no run: "
                "a run goes only into a new or empty directory, so that it never "
                f"overwrites files it did not write; choose another {flag}"
            )

    @contextmanager
    def removed_on_failure(
        self, errors: tuple[type[BaseException], ...] = (DanaError,), keep_results: bool = True
    ) -> Iterator[None]:
        """For a new run: when the block raises one of ``errors``, remove what the run
        wrote here (and the folder, if it made it), so that nothing blocks a rerun; with
        ``keep_results`` a run that has a checkpoint or metrics (``--resume`` continues
        it) is kept."""
        created = not self.path.exists()
        try:
            yield
        except errors:
            if not (keep_results and (self.checkpoint.is_file() or self.metrics.is_file())):
                self.close()
                self.remove_own(keep_folder=not created)
            raise

    def create(self) -> None:
        """Make the folder (and its parents); DanaError if the system refuses."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DanaError(
                f"--out {self.path}: cannot create the directory: {e.strerror}; choose "
                "another --out"
            ) from None

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
        return _read_mapping(
            self.config,
            "run config",
            "a JSON mapping of option: value, as `dana train` writes it",
            "put the run's own config.json back",
        )

    def write_metrics(self, rows: list[dict[str, float]]) -> None:
        buf = io.StringIO()
        columns = self.columns
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            self.complete(row)
            writer.writerow({k: _fmt(row.get(k, math.nan)) for k in columns})
        write_text_atomic(self.metrics, buf.getvalue())

    def read_metrics(self) -> list[dict[str, float]]:
        """The rows of ``metrics.csv``; DanaError for one that lacks a column of
        :data:`METRICS_COLUMNS` (ValueError for a value that is no number)."""
        with self.metrics.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in METRICS_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise DanaError(
                    f"{self.metrics}: not a run's metrics (no column {', '.join(missing)})"
                )
            return [{k: float(v) for k, v in row.items()} for row in reader]

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
        for key in self.columns:
            if key not in ("updates",) and math.isfinite(row.get(key, math.nan)):
                self._writer.add_scalar(key, row[key], step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_text_atomic(self.summary, json.dumps(_jsonable(summary), indent=2) + "\n")

    def read_summary(self) -> dict[str, Any]:
        """The run's summary; DanaError for one that is unreadable or no mapping."""
        return _read_mapping(
            self.summary,
            "run summary",
            "a JSON mapping, as `dana train` writes it",
            "move it away to rerun the run",
        )

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write the checkpoint, with the run's settings (:attr:`settings`) when set; the
        previous one is replaced only once this one is whole (on a full disk it stays,
        and a WriteError says so)."""
        if self.settings is not None:
            state = {**state, SETTINGS_KEY: self.settings}
        buf = io.BytesIO()
        torch.save(state, buf)
        try:
            write_atomic(self.checkpoint, buf.getvalue())
        except WriteError as e:
            resume = (
                f"; continue with `dana train --resume {self.path}`" if self.holds_run() else ""
            )
            raise WriteError(e.errno or 0, f"{e.strerror}{resume}") from None

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint's state; None if there is none. DanaError for a checkpoint.pt
        that is not a file or not a checkpoint (never silently restart)."""
        if not self.checkpoint.exists():
            return None
        if not self.checkpoint.is_file():
            raise DanaError(
                f"{self.checkpoint} is not a file; move it away to restart the run from the "
                "beginning, or put the checkpoint file back"
            )
        try:
            state = torch.load(self.checkpoint, weights_only=True)
        except Exception as e:  # a corrupt file: say which, never guess
            raise DanaError(
                f"{self.checkpoint}: unreadable checkpoint ({e}); move it away to restart "
                "the run from the beginning"
            ) from None
        if not isinstance(state, dict):
            raise self.bad_checkpoint(f"it holds a {type(state).__name__}, not a state")
        return state

    def bad_checkpoint(self, problem: str) -> DanaError:
        """The error for a checkpoint that loads but does not fit the run."""
        return DanaError(
            f"{self.checkpoint} is not a checkpoint of this run: {problem}; move it away to "
            "restart the run from the beginning, or put the run's own checkpoint back"
        )

    def write_plot(self, rows: list[dict[str, float]], title: str) -> None:
        """``curves.png``: the test error (where there is none, or for a language model,
        the test loss, and the perplexity where the rows have it), each measured metric
        (:attr:`measured`) and the mean gap, against epochs."""
        from dana.figures import subplots

        epochs = [r["epoch"] for r in rows]
        panels = []
        has_error = any(math.isfinite(r["test_error"]) for r in rows)
        if has_error and "test_perplexity" not in rows[0]:
            panels.append(([100 * r["test_error"] for r in rows], "test error (%)", "test error"))
        else:
            panels.append(([r["test_loss"] for r in rows], "test loss", "test loss"))
        if "test_perplexity" in rows[0]:
            values = [r["test_perplexity"] for r in rows]
            panels.append((values, "test perplexity (log scale)", "test perplexity"))
        for key in self.measured:
            name = key.replace("_", " ")
            panels.append(([r.get(key, math.nan) for r in rows], name, name))
        panels.append(([r["mean_gap"] for r in rows], "mean gap RMS(theta - p_i)", "gap"))
        fig, axes = subplots(1, len(panels), figsize=(5 * len(panels), 4))
        for i, (ax, (values, label, name)) in enumerate(zip(axes, panels)):
            color = "tab:red" if i == len(panels) - 1 else None
            ax.plot(epochs, values, marker="o", color=color)
            ax.set(xlabel="epoch", ylabel=label, title=name)
            if "log scale" in label:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        with atomic_path(self.plot) as tmp:
            fig.savefig(tmp, format="png", dpi=100)


def _read_mapping(path: Path, what: str, shape: str, fix: str) -> dict[str, Any]:
    """The JSON mapping in ``path`` (``what``: ``run config``); DanaError saying so for
    one that is unreadable, or no mapping (it must be ``shape``; ``fix`` says what to do)."""
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise DanaError(f"{path}: unreadable {what}: {e}") from None
    if not isinstance(values, dict):
        raise DanaError(f"{path}: not a {what} ({shape}); {fix}")
    return values


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
