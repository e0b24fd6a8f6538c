"""Images per second of ``dana train`` against a plain PyTorch training loop.

``dana train``'s own training path (a :class:`~dana.sim.driver.SimRun` built from a
:class:`~dana.train.config.TrainConfig`: the dataset, the model made flat, the
simulator with its gap and staleness records, and the per-step callback that watches
for divergence and drives the progress bar) simulating ``k = 16`` workers with
``dana-slim`` on the small CNN and Fashion-MNIST, against a plain loop of
``torch.optim.SGD(momentum=0.9, nesterov=True)`` steps over the same model, batch size
and data. The two alternate in chunks in one process (the order flips every chunk),
after untimed warm-up steps; evaluation is left out of both. The last line is the
median over chunks of (dana images/s / plain images/s):

    throughput ratio 0.97

Run: ``python bench/train_throughput.py`` (about 2 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import parse_with_smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.models import build_model  # noqa: E402
from dana.sim.driver import SimRun  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.records.progress import Progress  # noqa: E402
from dana.train.records.rundir import RunDir  # noqa: E402
from dana.train.task.batches import BatchStream  # noqa: E402
from dana.train.task.problem import Problem  # noqa: E402


class DanaTrain:
    """``dana train``'s training steps, a chunk at a time."""

    def __init__(self, config: TrainConfig, out: Path):
        self.problem = Problem(config)
        self.run = SimRun(config, RunDir(out), self.problem, config.build_algorithm())
        self.callback = self.run._tick(Progress(enabled=False))

    def steps(self, n: int) -> float:
        sim = self.run.sim
        start = time.perf_counter()
        sim.run(pushes=sim.steps + n, callback=self.callback)
        return time.perf_counter() - start


class PlainLoop:
    def __init__(self, problem: Problem, config: TrainConfig):
        ds = problem.dataset
        self.x, self.y = ds.train_x, ds.train_y
        torch.manual_seed(config.seed)
        self.model = build_model(config.model, ds.channels, ds.image_size, ds.num_classes)
        self.model.train()
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=config.lr,
            momentum=config.momentum,
            nesterov=True,
            weight_decay=config.weight_decay,
        )
        self.batches = BatchStream(len(self.x), config.batch_size, seed=config.seed)

    def steps(self, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            rows = self.batches.next()
            self.opt.zero_grad()
            loss = F.cross_entropy(self.model(self.x[rows]), self.y[rows])
            loss.backward()
            self.opt.step()
            loss.item()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400, help="timed steps of each")
    parser.add_argument("--chunk", type=int, default=20, help="steps per alternation")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--model", default="cnn")
    args = parse_with_smoke(parser)
    if args.smoke:
        args.workers, args.steps, args.chunk, args.warmup = 4, 4, 2, 1
        args.dataset, args.model = "synthetic", "linear"

    torch.set_num_threads(args.threads)
    config = TrainConfig(
        algorithm="dana-slim", workers=args.workers, dataset=args.dataset, model=args.model,
        lr=0.05, epochs=1000, eval_every=1000,
    ).validate()  # fmt: skip
    dana = DanaTrain(config, Path("/tmp/dana-bench-throughput"))
    plain = PlainLoop(dana.problem, config)
    dana.steps(args.warmup)
    plain.steps(args.warmup)
    B = config.batch_size
    ratios, t_dana, t_plain = [], 0.0, 0.0
    for c in range(args.steps // args.chunk):
        if c % 2 == 0:
            d, p = dana.steps(args.chunk), plain.steps(args.chunk)
        else:
            p, d = plain.steps(args.chunk), dana.steps(args.chunk)
        t_dana, t_plain = t_dana + d, t_plain + p
        ratios.append(p / d)  # (images/s of dana) / (images/s of plain)
    n = args.steps // args.chunk * args.chunk
    print(
        f"{config.model} on {config.dataset}, batch {B}, dana-slim k = {args.workers}, "
        f"{n} steps each, chunks of {args.chunk}, {args.threads} thread(s)"
    )
    print(f"dana train: {n * B / t_dana:8.0f} images/s")
    print(f"plain loop: {n * B / t_plain:8.0f} images/s")
    print(f"throughput ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
