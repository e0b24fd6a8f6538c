"""The layout of a sweep's results directory, and the state of each cell in it.

::

    OUT/
      sweep.json         the spec and every cell's status (rewritten as the sweep goes)
      sweep.log          one line per event: start, skip, finish, fail, interrupt
      .sweep.lock        the pid of the sweep running on OUT (one at a time)
      cells/NAME.json    the cell's `dana train --config` file
      runs/NAME/         the run directory `dana train --out` writes
      logs/NAME.log      the run's stdout and stderr

A cell is ``finished`` when its run holds ``summary.json`` (a diverged run is finished:
its divergence is the result), ``resumable`` when it holds a checkpoint but no summary,
``restart`` when it started but left no checkpoint (it is run again from scratch), and
``new`` when it never started.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.errors import ConfigError, DanaError
from dana.experiments.grid import Cell
from dana.train.config import TrainConfig
from dana.train.records.rundir import RunDir

FINISHED, RESUMABLE, RESTART, NEW = "finished", "resumable", "restart", "new"


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings a run's ``config.json`` holds, as a sweep compares them: every
    option (one the run predates at its default), ``dana_version`` aside."""
    settings = {**TrainConfig().to_dict(), **config}
    settings.pop("dana_version", None)
    return settings


class SweepDir:
    """Paths and small files of one sweep's results directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.spec = self.path / "sweep.json"
        self.log_file = self.path / "sweep.log"
        self.lock = self.path / ".sweep.lock"
        self.cells = self.path / "cells"
        self.runs = self.path / "runs"
        self.logs = self.path / "logs"

    def run_dir(self, cell: Cell) -> RunDir:
        return RunDir(self.runs / cell.name)

    def cell_file(self, cell: Cell) -> Path:
        return self.cells / f"{cell.name}.json"

    def output_file(self, name: str) -> Path:
        """The output (stdout and stderr) of the run of the cell named ``name``."""
        return self.logs / f"{name}.log"

    # -- cell state ---------------------------------------------------------------------
    def state(self, cell: Cell) -> str:
        """``finished``, ``resumable``, ``restart`` or ``new`` (see the module doc)."""
        run = self.run_dir(cell)
        if run.finished():
            return FINISHED
        if run.checkpoint.is_file() and run.holds_run():
            return RESUMABLE
        if run.path.exists():
            return RESTART
        return NEW

    def check_matches(self, cell: Cell, options: dict[str, Any]) -> None:
        """ConfigError if the cell's run directory holds a run of other settings, or a
        finished run whose algorithm ran with other hyper-parameters than the same
        options give now (a default changed since: :func:`hparams_differ`)."""
        run = self.run_dir(cell)
        if not run.holds_run():
            return
        held = run_settings(run.read_config())
        diff = sorted(k for k, v in options.items() if held.get(k) != v)
        if diff:
            shown = ", ".join(f"{k}: {held.get(k)!r} there, {options.get(k)!r} now" for k in diff)
            raise ConfigError(
                f"{run.path} holds a run with other settings ({shown}); give the sweep "
                "another --out, or remove that run directory to redo it"
            )
        changed = hparams_differ(run, options)
        if changed:
            raise ConfigError(
                f"{run.path} holds a run whose {options['algorithm']} ran with other "
                f"hyper-parameters than its settings give now ({changed}: a default "
                "changed since); give the sweep another --out, or remove that run "
                "directory to redo it"
            )

    # -- records ------------------------------------------------------------------------
    def write_spec(self, record: dict[str, Any]) -> None:
        write_text_atomic(self.spec, json.dumps(record, indent=2) + "\n")

    def read_spec(self) -> dict[str, Any]:
        if not self.spec.is_file():
            raise DanaError(f"{self.path}: holds no sweep (no sweep.json)")
        try:
            return json.loads(self.spec.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DanaError(f"{self.spec}: unreadable sweep record: {e}") from None

    def log(self, message: str) -> None:
        """Append one timestamped line to ``sweep.log``."""
        self.path.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.log_file.open("a") as f:
            f.write(f"{stamp} {message}\n")

    # -- one sweep at a time ------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock; DanaError if a live process holds it (a stale one is taken)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.lock.is_file():
            try:
                pid = int(self.lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise DanaError(
                    f"{self.path}: another sweep (pid {pid}) is running on this directory; "
                    f"wait for it, or stop it first (if it is gone, remove {self.lock})"
                )
        write_text_atomic(self.lock, f"{os.getpid()}\n")

    def release(self) -> None:
        self.lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def hparams_differ(run: RunDir, options: dict[str, Any]) -> str:
    """The hyper-parameters (``name: there, now``) a finished run's algorithm ran with
    (``summary.json``'s ``algorithm_hparams``) that the options ``options`` no longer
    give; empty when they agree, or when the run predates that record."""
    if not run.finished():
        return ""
    try:
        held = run.read_summary().get("algorithm_hparams")
    except (OSError, ValueError):
        return ""
    if not isinstance(held, dict):
        return ""
    try:
        now = TrainConfig.from_dict(options).build_algorithm().hparams()
    except DanaError:
        return ""
    now = json.loads(json.dumps(now))
    diff = sorted(k for k in set(held) | set(now) if held.get(k) != now.get(k))
    return ", ".join(f"{k}: {held.get(k)!r} there, {now.get(k)!r} now" for k in diff)
