"""The slowdown of ``dana train`` when another process keeps a core busy.

Runs the real command (``python -m dana.cli train``, a subprocess with no
``OMP_NUM_THREADS`` set, so that the thread setting under test is the command's own)
alone and beside one competing busy process (a Python loop), alternately, ``--repeats``
times each, and reads each run's training seconds from its ``summary.json`` (start-up
and data loading are left out). For each ``--threads`` setting it prints the median of
each condition and their ratio, e.g.::

    threads 1 (default): alone 1.21 s, beside a busy process 1.65 s: slowdown 1.36x

``--threads 0`` (one per core, torch's own default) is measured for contrast. The load
average before and after is printed: on a machine shared with other work the figures
move with it, so the runs alternate and the medians are compared.

Run: ``python bench/threads_under_load.py`` (about 3 minutes on 2 cores);
``--smoke`` runs a tiny model once in each condition (seconds; tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True:\n    pass\n"


def train_seconds(args: list[str], out: Path) -> float:
    """Training seconds of one ``dana train`` run (its summary's ``wall_seconds``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "dana.cli", "train", *args, "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if result.returncode != 0:
        raise SystemExit(f"dana train failed: {result.stderr.strip()[-500:]}")
    return float(json.loads((out / "summary.json").read_text())["wall_seconds"])


def measure(args: list[str], repeats: int, work: Path) -> tuple[float, float]:
    """Median training seconds (alone, beside one busy process), runs alternating."""
    alone, loaded = [], []
    for r in range(repeats):
        for busy in (False, True) if r % 2 == 0 else (True, False):
            out = work / f"run{len(alone) + len(loaded)}"
            competitor = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
            try:
                seconds = train_seconds(args, out)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
            (loaded if busy else alone).append(seconds)
    return statistics.median(alone), statistics.median(loaded)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model, once each")
    parser.add_argument("--repeats", type=int, default=5, help="runs per condition")
    args = parser.parse_args(argv)
    if args.smoke:
        workload = ["--dataset", "synthetic", "--model", "linear", "--train-size", "256",
                    "--test-size", "64", "--batch-size", "32", "--workers", "2",
                    "--epochs", "1"]  # fmt: skip
        settings, repeats = [("1", "1 (default)")], 1
    else:
        workload = ["--dataset", "synthetic", "--model", "cnn", "--workers", "8",
                    "--epochs", "4", "--eval-every", "1"]  # fmt: skip
        settings, repeats = [("1", "1 (default)"), ("0", "0 (one per core)")], args.repeats
    print(f"cores {len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.2f}")
    print("workload: dana train " + " ".join(workload))
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for value, label in settings:
            work = Path(tmp) / f"threads{value}"
            work.mkdir()
            alone, loaded = measure([*workload, "--threads", value], repeats, work)
            ratio = loaded / alone
            if value == "1":
                worst = ratio
            print(
                f"threads {label}: alone {alone:.2f} s, beside a busy process {loaded:.2f} s: "
                f"slowdown {ratio:.2f}x"
            )
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print(f"default slowdown {worst:.2f}x ({'within' if worst <= 2 else 'OVER'} 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
