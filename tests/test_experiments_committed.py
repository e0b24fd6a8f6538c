"""The reports committed under docs/results are what `dana report` makes of the run
records committed next to them (docs/RESULTS.md quotes these reports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dana.cli import main

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
#: The time-to-target options each committed report was made with (none: the default
#: targets, the baseline's final error + 0.5 pp and + 1 pp).
TARGETS: dict[str, list[str]] = {}


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.iterdir() if (p / "runs").is_dir()))
def test_committed_report_is_made_from_the_committed_runs(name, tmp_path, capsys):
    out = tmp_path / name
    assert main(["report", str(RESULTS / name), "--out", str(out), *TARGETS.get(name, [])]) == 0
    capsys.readouterr()
    assert (out / "report.md").read_text() == (RESULTS / name / "report.md").read_text()
