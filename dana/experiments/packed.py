"""The process of a pack of runs (``dana sweep --pack N``: :mod:`dana.sim.pack`)::

    python -m dana.experiments.packed --threads T (--config CELL.json --out DIR)... (--resume DIR)...

It prints one line per run and exits 75 when a run was preempted, else 0; each run's
outcome is in its directory (``summary.json``, or not: the line says why).

``python -m dana.experiments.packed --footprint CELL.json`` prints, as JSON, one run's
peak CUDA memory (``run_bytes``: :func:`dana.sim.pack.run_footprint`) and the device's
free memory before it (``free_bytes``): what ``dana sweep --pack auto`` sizes a pack
from, measured in a process of its own so that the sweep holds no device memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dana.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_PREEMPTED, Preempted
from dana.sim.pack import PackedRun, run_footprint, train_pack
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
    parser.add_argument("--footprint", metavar="CELL", help="measure one run's peak memory")
    args = parser.parse_args(argv)
    if args.footprint:
        return _footprint(args.footprint)
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


def _footprint(cell: str) -> int:
    """Print ``{"run_bytes": ..., "free_bytes": ...}`` for the run of ``cell``."""
    import torch

    from dana.train.device import resolve_device

    config = TrainConfig.from_dict(json.loads(Path(cell).read_text()), cell).validate()
    device = resolve_device(config.device)
    if device.type != "cuda":
        print(f"--footprint: {cell} computes on {device}; a footprint is a GPU's", file=sys.stderr)
        return EXIT_BAD_INPUT
    free, _ = torch.cuda.mem_get_info(device)
    print(json.dumps({"run_bytes": run_footprint(config), "free_bytes": free}), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
