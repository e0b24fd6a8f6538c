"""How much slower is simulating k workers than plain PyTorch training of the same steps?

Simulates ``k`` asynchronous workers (``dana-slim``, ``gamma`` timing, the simulator's
defaults: the gap of every push is measured) for ``--pushes`` pushes of the small
BatchNorm CNN (``build_model("cnn")``, 1x28x28 inputs, batch 128), and times it against
a plain PyTorch loop doing the same number of ``torch.optim.SGD(momentum=0.9,
nesterov=True)`` steps on the same architecture and batches drawn from the same batch
stream. Both record the loss of every step (``loss.item()``). Every step of both does
one forward and one backward pass of a batch of 128, so the ratio of the two times is
the cost of the simulator's bookkeeping: loading the worker's parameters, the master
and worker rules, the gap, the pull, the event queue and the log.

Each repetition builds a fresh simulator and a fresh model, takes ``--warmup`` untimed
steps with each, then times ``--pushes`` steps of each, alternating in one process in
chunks of ``--chunk`` steps (the order flips every chunk), so that both see the same
load on a shared machine. A repetition's ratio is the median over its chunks of
(simulator chunk time / plain chunk time), robust to bursts of load from elsewhere.
Both use ``--threads`` torch threads (default 1: on a shared 2-core machine two
threads per process make timings erratic). The last line is the median over
repetitions of that ratio:

    overhead ratio 1.04  (the format)

Run: ``python bench/sim_overhead.py`` (2 to 3.5 minutes on a shared 2-core machine).
``--cluster NAME`` simulates on a cluster model instead (a preset such as
``datacenter``, or a file): the simulator then runs its event loop
(``dana/sim/clock.py``), whose cost over today's clock this measures.
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

import dana.algorithms as A  # noqa: E402
from dana.models import build_model  # noqa: E402
from dana.sim import Simulator  # noqa: E402
from dana.train.task.batches import BatchStream  # noqa: E402
from dana.train.task.flat import FlatModel  # noqa: E402


def load_data(source: str, n: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``n`` Fashion-MNIST training images (or random ones of the same shape)."""
    if source in ("auto", "fashion-mnist"):
        try:
            from dana.data import load_dataset

            ds = load_dataset("fashion-mnist", train_size=n)
            return ds.train_x, ds.train_y, "Fashion-MNIST"
        except Exception as exc:  # noqa: BLE001 - any failure falls back to random data
            if source == "fashion-mnist":
                raise
            print(f"(Fashion-MNIST not loadable: {exc}; using random data)")
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g), "random"


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("cnn", in_channels=1, image_size=28, num_classes=10)


class SimulatorRun:
    """A fresh simulation whose pushes can be timed a chunk at a time."""

    def __init__(self, x, y, args):
        flat = FlatModel(new_model())

        def gradient(params, rows):
            return flat.gradient(params, x[rows], y[rows], F.cross_entropy)

        self.sim = Simulator(
            A.build("dana-slim", momentum=0.9),
            flat.flat.clone(),
            gradient,
            BatchStream(len(x), args.batch_size, seed=0),
            args.workers,
            lr=args.lr,
            timing="gamma",
            seed=0,
            measure_gap=not args.no_gap,
            cluster=args.cluster,
        )

    def steps(self, n: int) -> float:
        start = time.perf_counter()
        self.sim.run(pushes=self.sim.steps + n)
        return time.perf_counter() - start


class PlainRun:
    """The same model trained by a plain PyTorch loop with Nesterov SGD."""

    def __init__(self, x, y, args):
        self.x, self.y = x, y
        self.model = new_model()
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
        self.batches = BatchStream(len(x), args.batch_size, seed=0)
        self.losses: list[float] = []

    def steps(self, n: int) -> float:
        model, opt, x, y = self.model, self.opt, self.x, self.y
        start = time.perf_counter()
        for _ in range(n):
            rows = self.batches.next()
            opt.zero_grad()
            loss = F.cross_entropy(model(x[rows]), y[rows])
            loss.backward()
            opt.step()
            self.losses.append(loss.item())
        return time.perf_counter() - start


def repetition(x, y, args, rep: int) -> tuple[float, float, float]:
    """Seconds of ``args.pushes`` simulator pushes and of as many plain steps, and the
    median over chunks of (simulator chunk time / plain chunk time)."""
    sim, plain = SimulatorRun(x, y, args), PlainRun(x, y, args)
    sim.steps(args.warmup)  # untimed: first touches of buffers, kernel choice
    plain.steps(args.warmup)
    t_sim, t_plain, ratios = [], [], []
    for c, start in enumerate(range(0, args.pushes, args.chunk)):
        n = min(args.chunk, args.pushes - start)
        if (rep + c) % 2 == 0:
            s = sim.steps(n)
            p = plain.steps(n)
        else:
            p = plain.steps(n)
            s = sim.steps(n)
        t_sim.append(s)
        t_plain.append(p)
        ratios.append(s / p)
    assert sim.sim.steps == args.warmup + args.pushes == len(sim.sim.log)
    assert len(plain.losses) == args.warmup + args.pushes
    return sum(t_sim), sum(t_plain), statistics.median(ratios)


def breakdown(x, y, args, steps: int = 100) -> None:
    """Where a step's time goes: the simulator's parts, and the plain loop's SGD step."""
    run, plain = SimulatorRun(x, y, args), PlainRun(x, y, args)
    sim = run.sim
    spent: dict[str, float] = {}

    def timed(obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        setattr(obj, attr, wrapper)

    timed(sim, "gradient", "sim: gradient (load params, forward, backward)")
    timed(sim, "_gap", "sim: gap")
    timed(sim.worker_rule, "message", "sim: workers.message")
    timed(sim.master, "push", "sim: master.push")
    timed(sim.master, "pull", "sim: master.pull")
    timed(plain.opt, "step", "plain: SGD step")
    run.steps(args.warmup)
    plain.steps(args.warmup)
    spent.clear()
    t_sim = t_plain = 0.0
    for c in range(0, steps, args.chunk):
        if c // args.chunk % 2 == 0:
            t_sim += run.steps(args.chunk)
            t_plain += plain.steps(args.chunk)
        else:
            t_plain += plain.steps(args.chunk)
            t_sim += run.steps(args.chunk)
    parts = sorted(spent.items())
    sim_parts = sum(v for k, v in parts if k.startswith("sim"))
    plain_parts = sum(v for k, v in parts if k.startswith("plain"))
    parts += [
        ("sim: the rest (queue, timing, batches, log)", t_sim - sim_parts),
        ("plain: the rest (forward, backward, zero_grad)", t_plain - plain_parts),
    ]
    print(f"breakdown over {steps} steps, ms per step:")
    for key, value in sorted(parts):
        print(f"  {key:<48} {1e3 * value / steps:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=32, help="k (default 32)")
    parser.add_argument("--pushes", type=int, default=200, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=7, help="repetitions (median)")
    parser.add_argument("--chunk", type=int, default=5, help="steps per alternation")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per run")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for both (default 1: steadier)"
    )
    parser.add_argument("--data", choices=("auto", "fashion-mnist", "random"), default="auto")
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--no-gap", action="store_true", help="simulate with measure_gap=False")
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="FILE_OR_PRESET",
        help="simulate on this cluster model (default: none, today's clock)",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="first time the parts of a step (~15 s)"
    )
    args = parse_with_smoke(parser)
    if args.smoke:
        args.workers, args.pushes, args.reps, args.chunk, args.warmup = 4, 4, 1, 2, 1
        args.batch_size, args.data, args.train_size = 16, "random", 256

    torch.set_num_threads(args.threads)
    x, y, source = load_data(args.data, args.train_size)
    d = FlatModel(new_model()).d
    print(
        f"small CNN (d = {d:,}), {source} 1x28x28, batch {args.batch_size}, "
        f"k = {args.workers} (dana-slim, "
        f"{'cluster ' + args.cluster if args.cluster else 'gamma timing'}, "
        f"gap {'off' if args.no_gap else 'on'}), "
        f"{args.pushes} steps per run, {args.reps} repetitions, {args.threads} threads"
    )
    if args.breakdown:
        breakdown(x, y, args)
    sims, plains, ratios = [], [], []
    print(f"{'rep':>3}  {'simulator s':>11}  {'plain s':>8}  {'sum ratio':>9}  {'chunk ratio':>11}")
    for rep in range(args.reps):
        s, p, r = repetition(x, y, args, rep)
        sims.append(s)
        plains.append(p)
        ratios.append(r)
        print(f"{rep:>3}  {s:>11.3f}  {p:>8.3f}  {s / p:>9.3f}  {r:>11.3f}")
    ms_sim = 1000 * statistics.median(sims) / args.pushes
    ms_plain = 1000 * statistics.median(plains) / args.pushes
    print(f"median per step: simulator {ms_sim:.2f} ms, plain loop {ms_plain:.2f} ms")
    print("(chunk ratio: median over the rep's chunks; last line: its median over reps)")
    print(f"overhead ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
