"""The threads-under-load benchmark runs (its smoke mode) and prints its figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "threads_under_load.py"


def test_threads_under_load_smoke():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    line = re.search(
        r"threads 1 \(default\): alone ([\d.]+) s, beside a busy process ([\d.]+) s: "
        r"slowdown ([\d.]+)x",
        result.stdout,
    )
    assert line, result.stdout
    alone, loaded, ratio = map(float, line.groups())
    assert alone > 0 and loaded > 0 and ratio > 0  # the times printed are rounded
    assert re.search(r"default slowdown [\d.]+x", result.stdout)
