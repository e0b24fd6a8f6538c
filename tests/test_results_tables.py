"""The tables docs/RESULTS.md quotes from a script are what the script prints from the
committed records (scripts/text_diloco_tables.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_text_diloco_tables_are_the_scripts_output_on_the_committed_records():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "text_diloco_tables.py"),
         str(ROOT / "docs" / "results" / "text-diloco")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    tables = [t.strip() for t in out.split("\n\n") if t.strip().startswith("|")]
    assert len(tables) == 3
    for table in tables:
        assert table in results, table.splitlines()[0]
