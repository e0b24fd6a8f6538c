"""How much faster are N simulated runs packed into one process than run one after another?

Runs ``--runs`` copies of one simulated run (the small BatchNorm CNN on Fashion-MNIST from
``--data-dir`` or its Debian folder, else synthetic images of its shape; ``dana-slim``,
``--workers`` workers, seeds 0, 1, ...: one shape, so they pack) twice:
one after another with :func:`dana.train.training.train`, and packed with
:func:`dana.sim.pack.train_pack` (``dana sweep --pack N``: their next gradients in one
vectorised call). Each run writes its own directory under a temporary folder. The
device is ``--device`` (``cuda`` on the GPU machine: what packing is for; on a CPU the
vectorised call costs more than it saves). The last line is the sequential time over
the packed time:

    pack speed-up 1.00  (the format)

``--cuda-graph``: every run's gradient calls replayed as CUDA graphs, alone and packed.

Run: ``python bench/pack_throughput.py --device cuda --runs 8`` (bench/gpu.sh runs it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import parse_with_smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.data.datasets import DEFAULT_FASHION_DIR  # noqa: E402
from dana.sim.pack import PackedRun, train_pack  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.training import train  # noqa: E402


def configs(args: argparse.Namespace) -> list[TrainConfig]:
    """The runs: one shape, seeds 0 .. runs - 1."""
    if args.smoke:
        shape = dict(dataset="synthetic", model="linear", train_size=256, test_size=64,
                     batch_size=32, epochs=args.epochs)  # fmt: skip
    else:
        data_dir = args.data_dir or DEFAULT_FASHION_DIR
        shape = dict(model="cnn", train_size=args.train_size, test_size=1000, batch_size=128,
                     epochs=args.epochs)  # fmt: skip
        if Path(data_dir).is_dir():
            shape.update(dataset="fashion-mnist", data_dir=data_dir)
        else:
            shape.update(dataset="synthetic")
    return [
        TrainConfig(
            algorithm="dana-slim",
            workers=args.workers,
            seed=seed,
            device=args.device,
            cuda_graph=args.cuda_graph,
            eval_every=args.epochs,
            **shape,
        )  # fmt: skip
        for seed in range(args.runs)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="runs in the pack")
    parser.add_argument("--workers", type=int, default=16, help="k of each run")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--data-dir", default=None, help="Fashion-MNIST's folder")
    parser.add_argument("--cuda-graph", action="store_true", help="replay the gradient calls")
    args = parse_with_smoke(parser)
    if args.smoke:
        args.runs, args.workers, args.epochs = 2, 2, 0.5
    torch.set_num_threads(args.threads)
    runs = configs(args)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        alone = [train(c, Path(tmp) / f"alone{n}", progress=False) for n, c in enumerate(runs)]
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        packed = train_pack([PackedRun(Path(tmp) / f"packed{n}", c) for n, c in enumerate(runs)])
        together = time.perf_counter() - start
    failed = [r for r in packed if isinstance(r, Exception)]
    if failed:
        raise SystemExit(f"a packed run failed: {failed[0]!r}")
    steps = sum(s["updates"] for s in alone)
    data = runs[0].dataset + " --cuda-graph" * args.cuda_graph
    print(f"{args.runs} runs of k = {args.workers} on {args.device}, {data}, {steps} updates")
    print(f"| one after another | {sequential:.2f} s | {steps / sequential:.1f} updates/s |")
    print(f"| packed | {together:.2f} s | {steps / together:.1f} updates/s |")
    print(f"pack speed-up {sequential / together:.2f}")


if __name__ == "__main__":
    main()
