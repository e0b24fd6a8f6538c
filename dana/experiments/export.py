"""Copy a results directory's small files elsewhere (e.g. into docs/), without checkpoints.

For every finished (or diverged) run: ``config.json``, ``metrics.csv`` and
``summary.json``, under the same relative path; the sweep's ``sweep.json``, each cell's
status that of its records in the copy (``finished``, ``diverged``; ``failed``, or
``pending`` where the copy has no run: not a rerun's ``skipped`` or a running sweep's
``running``), and the cell files of failed cells. ``dana report`` reruns on the copy and
gives the same report. Incomplete runs are left out: their numbers are not results yet.
"""

from __future__ import annotations

import json
from pathlib import Path

from dana.atomic import write_atomic, write_text_atomic
from dana.errors import DanaError
from dana.experiments.results import load_results

RUN_FILES = ("config.json", "metrics.csv", "summary.json")


def export_results(source: str | Path, dest: str | Path) -> int:
    """Copy the small files of ``source``'s finished runs into ``dest``; the run count."""
    source, dest = Path(source), Path(dest)
    if dest.resolve() == source.resolve():
        raise DanaError(f"--export {dest}: the copy must go to another directory")
    results = load_results(source)
    copied = 0
    for run in results.runs:
        relative = run.path.relative_to(source)
        if run.status in ("finished", "diverged"):
            for name in RUN_FILES:
                if (run.path / name).is_file():
                    _copy(run.path / name, dest / relative / name)
            copied += 1
        elif run.status == "failed" and (source / "cells" / f"{run.path.name}.json").is_file():
            name = f"{run.path.name}.json"
            _copy(source / "cells" / name, dest / "cells" / name)
    if (source / "sweep.json").is_file():
        _copy(source / "sweep.json", dest / "sweep.json")
        _record_statuses(dest)
    return copied


def _record_statuses(dest: Path) -> None:
    """``dest``'s ``sweep.json`` with each cell's status that of its records in ``dest``
    (runs exported before included), not the sweep's word of the moment."""
    found = {run.path.name: run.status for run in load_results(dest).runs}
    sweep = json.loads((dest / "sweep.json").read_text())
    for cell in sweep.get("cells", []):
        kept = "failed" if cell.get("status") == "failed" else "pending"
        cell["status"] = found.get(cell["name"], kept)
    write_text_atomic(dest / "sweep.json", json.dumps(sweep, indent=2) + "\n")


def _copy(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst`` whole or not at all (a WriteError naming ``dst`` when it
    cannot be written)."""
    write_atomic(dst, src.read_bytes())
