"""Finished runs of other sweeps, reused for the cells of the same settings.

``dana sweep --reuse DIR``: before a cell that never started runs, a finished run in
``DIR`` (another sweep's results directory, or a directory of run directories) whose
settings equal the cell's is copied into the cell's run directory instead. Settings are
the run's ``config.json`` with ``dana_version`` aside, an option the run predates
counting at its default (as a sweep compares a run it finds in its own directory); a run
whose ``summary.json`` records other hyper-parameters of its algorithm than the settings
give now (a default changed since) is not reused (one that predates the record is). Only
runs of a deterministic backend are reused (the simulator's: the same settings give the
same run, and a study that shares cells with another need not compute them twice; a Ray
run is one draw of its timings, not the run).

What is copied: the run's own files (``config.json``, ``metrics.csv``,
``summary.json``, ``curves.png``, ``step_times.csv``, ``dist.json``; never
``checkpoint.pt``), into a temporary folder beside the cell's (``runs/.NAME.reuse``)
that is then renamed into place, so that a kill leaves no half-copied run; a leftover
temporary folder is removed when the sweep next starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dana.errors import ConfigError, DanaError
from dana.experiments.layout import hparams_differ, run_settings
from dana.train.backends import RUNNERS
from dana.train.config import TrainConfig
from dana.train.records.rundir import RUN_FILES, RunDir

#: The suffix of the temporary folder a copy is made in.
TEMPORARY = ".reuse"


def settings_key(options: dict[str, Any]) -> str:
    """The settings a run is compared by (:func:`~dana.experiments.layout.run_settings`),
    as canonical JSON."""
    return json.dumps(run_settings(options), sort_keys=True)


class ReusableRuns:
    """The finished simulator runs of some directories, by their settings."""

    def __init__(self, dirs: list[str | Path]):
        self.runs: dict[str, Path] = {}
        for d in dirs:
            path = Path(d)
            if not path.is_dir():
                raise ConfigError(
                    f"--reuse {d}: no such directory; give a sweep's results directory "
                    "(or a directory of run directories)"
                )
            folder = path / "runs" if (path / "runs").is_dir() else path
            for run_path in sorted(p for p in folder.iterdir() if p.is_dir()):
                run = RunDir(run_path)
                if not (run.finished() and run.holds_run()):
                    continue
                try:
                    config = run.read_config()
                except DanaError:  # an unreadable record is not a run to reuse
                    continue
                backend = RUNNERS.get(config.get("backend", TrainConfig.backend))
                if backend is not None and backend.deterministic:
                    self.runs.setdefault(settings_key(config), run_path)

    def __len__(self) -> int:
        return len(self.runs)

    def find(self, options: dict[str, Any]) -> Path | None:
        """The finished run of these settings, if any, unless its algorithm ran with
        other hyper-parameters than the settings give now (a default changed since:
        :func:`~dana.experiments.layout.hparams_differ`)."""
        path = self.runs.get(settings_key(options))
        if path is None or hparams_differ(RunDir(path), options):
            return None
        return path


def copy_run(source: Path, target: RunDir) -> None:
    """Copy the finished run ``source`` to the new run directory ``target`` (whole or
    not at all)."""
    staging = target.path.with_name(f".{target.path.name}{TEMPORARY}")
    if staging.exists() and not _ours(staging):
        raise DanaError(
            f"{staging} holds files dana did not write; move it away and rerun the sweep"
        )
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in RUN_FILES:
        if name != "checkpoint.pt" and (source / name).is_file():
            shutil.copy2(source / name, staging / name)
    staging.rename(target.path)


def remove_leftovers(runs: Path) -> None:
    """Remove the temporary folders of copies a kill cut short."""
    if runs.is_dir():
        for p in runs.glob(f".*{TEMPORARY}"):
            if _ours(p):
                shutil.rmtree(p)


def _ours(staging: Path) -> bool:
    """Whether ``staging`` is a folder of a copy's files only (ours to remove)."""
    return staging.is_dir() and all(q.is_file() and q.name in RUN_FILES for q in staging.iterdir())
