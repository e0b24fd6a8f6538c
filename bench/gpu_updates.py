"""How many updates per second does one simulated run make, and what does each cut of
the host's work per push buy?

One run of ``dana train`` (``dana-slim``, the small BatchNorm CNN on Fashion-MNIST,
``--workers`` workers, batch 128) three ways, each the same run:

- ``synced``: the loss and the gap read on the host at every push (what a GPU run did
  before the simulator's ``sync_free``);
- ``sync-free``: the default, the loss and the gap read when the log is;
- ``graph``: sync-free and ``--cuda-graph`` (the forward and backward pass replayed as
  one CUDA graph).

After one untimed run (CUDA's and cuDNN's first calls), each mode runs ``--repeats``
times, alternating; a mode's figure is its median of
``updates / wall seconds of the run`` (``summary.json``: the run alone, not the set-up).
The last line gives the graph's figure over the synced one:

    graph speed-up 1.00  (the format)

Run: ``python bench/gpu_updates.py --device cuda --data-dir DIR`` (bench/gpu.sh runs it;
``--data-dir``: where Fashion-MNIST is; synthetic data of the same shape without it).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path

from common import parse_with_smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import dana.sim.driver as driver  # noqa: E402
from dana.sim import Simulator  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.training import train  # noqa: E402

MODES = ("synced", "sync-free", "graph")


def config(args: argparse.Namespace, mode: str) -> TrainConfig:
    if args.smoke:
        shape = dict(dataset="synthetic", model="linear", train_size=512, test_size=64,
                     batch_size=32, epochs=1.0)  # fmt: skip
    elif args.data_dir:
        shape = dict(dataset="fashion-mnist", model="cnn", data_dir=args.data_dir,
                     batch_size=128, epochs=args.epochs, test_size=1000)  # fmt: skip
    else:
        shape = dict(dataset="synthetic", model="cnn", train_size=60000, test_size=1000,
                     batch_size=128, epochs=args.epochs)  # fmt: skip
    return TrainConfig(
        algorithm="dana-slim", workers=args.workers, device=args.device,
        eval_every=shape["epochs"], cuda_graph=mode == "graph", **shape,
    )  # fmt: skip


def one_run(args: argparse.Namespace, mode: str) -> float:
    """Updates per second of one run in ``mode``."""
    build = driver.Simulator
    driver.Simulator = functools.partial(Simulator, sync_free=mode != "synced")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            summary = train(config(args, mode), Path(tmp) / "run", progress=False)
    finally:
        driver.Simulator = build
    return summary["updates"] / summary["wall_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=None, help="Fashion-MNIST's folder")
    args = parse_with_smoke(parser)
    if args.smoke:
        args.repeats = 1
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    if not args.smoke:
        one_run(args, "graph")
    for _ in range(args.repeats):
        for mode in MODES:
            figures[mode].append(one_run(args, mode))
    where = "Fashion-MNIST" if args.data_dir and not args.smoke else "synthetic data"
    print(f"{args.device}, k = {args.workers}, {where}, medians of {args.repeats} runs:")
    print(f"{'mode':>10} {'updates/s':>10}")
    median = {mode: statistics.median(v) for mode, v in figures.items()}
    for mode in MODES:
        print(f"{mode:>10} {median[mode]:10.1f}")
    print(f"graph speed-up {median['graph'] / median['synced']:.2f}")


if __name__ == "__main__":
    main()
