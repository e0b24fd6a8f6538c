"""The process of a pack of runs (``dana sweep --pack N``: :mod:`dana.sim.pack`)::

    python -m dana.experiments.packed --threads T (--config CELL.json --out DIR)... (--resume DIR)...

It prints one line per run and exits 75 when a run was preempted, else 0; each run's
outcome is in its directory (``summary.json``, or not: the line says why).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dana.errors import EXIT_OK, EXIT_PREEMPTED, Preempted
from dana.sim.pack import PackedRun, train_pack
from dana.train.config import TrainConfig
from dana.train.resources import use_threads
from dana.version import __version__


def main(argv: list[str] | None = None) -> int:
    """The pack's process (the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m dana.experiments.packed")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--config", action="append", default=[], help="a new run's config")
    parser.add_argument("--out", action="append", default=[], help="its run directory")
    parser.add_argument("--resume", action="append", default=[], help="a run to continue")
    args = parser.parse_args(argv)
    if len(args.config) != len(args.out):
        parser.error("give one --out per --config")
    threads = use_threads(args.threads)
    runs = [
        PackedRun(Path(out), TrainConfig.from_dict(json.loads(Path(c).read_text()), c).validate())
        for c, out in zip(args.config, args.out)
    ] + [PackedRun(Path(r)) for r in args.resume]
    results = train_pack(runs, threads=threads, version=__version__)
    for run, result in zip(runs, results):
        if isinstance(result, dict):
            what = "diverged" if result.get("diverged") else "finished"
        else:
            what = f"{type(result).__name__}: {result}"
        print(f"dana pack: {run.out}: {what}", flush=True)
    return EXIT_PREEMPTED if any(isinstance(r, Preempted) for r in results) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
