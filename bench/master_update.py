"""What does the master pay per push, compared with one ``torch.optim.SGD`` step?

For every registered algorithm and two model sizes (ResNet-20, d = 272,474, and
ResNet-50, d = 25,557,032, as flat float32 vectors), times:

- ``push``: ``master.push(i, message, lr)`` with a precomputed message (a fixed random
  vector; the workers' side, ``workers.message``, is not the master's cost and is left
  out), the workers taken in turn;
- ``push+pull``: the push followed by ``master.pull(i, lr, out)``, as an asynchronous
  runner does once per push (the pushing worker pulls again at once);

against one ``torch.optim.SGD(momentum=0.9)`` step of a flat parameter tensor of the
same size with ``.grad`` set (the default, single-tensor path). The three are timed
side by side in one process, alternating (the order flips every repetition); each
ratio is the median over repetitions of (algorithm time / SGD time) of the same
repetition. Masters with per-worker state hold ``(k, d)`` tensors, so ``k`` is 16 at
ResNet-20 size and 4 at ResNet-50 size (``--workers``): the per-push work of every
rule here does not depend on ``k``, only its memory does.

The last line gives the push-only ratios of ``dana-slim`` and ``dana-zero``, the
larger over the two sizes:

    dana-slim ratio 0.30, dana-zero ratio 1.46

Run: ``python bench/master_update.py`` (about 2.5 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
from common import parse_with_smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import dana.algorithms as A  # noqa: E402

SIZES = {"resnet20": 272_474, "resnet50": 25_557_032}
LR = 0.01


class SgdStep:
    """One ``torch.optim.SGD(momentum=0.9)`` step on a flat tensor whose grad is set."""

    def __init__(self, d: int, generator: torch.Generator):
        self.param = torch.randn(d, generator=generator).requires_grad_()
        self.param.grad = torch.randn(d, generator=generator)
        self.opt = torch.optim.SGD([self.param], lr=LR, momentum=0.9)
        self.opt.step()  # creates the momentum buffer

    def time(self, n: int) -> float:
        step = self.opt.step
        start = time.perf_counter()
        for _ in range(n):
            step()
        return time.perf_counter() - start


class MasterPushes:
    """An algorithm's master rule fed a precomputed message, the workers in turn."""

    def __init__(self, name: str, d: int, k: int, generator: torch.Generator):
        self.master = A.build(name).master(torch.randn(d, generator=generator), k)
        self.message = torch.randn(d, generator=generator)
        self.out = torch.empty(d)
        self.k, self.i = k, 0
        for i in range(k):  # every worker starts with a pull
            self.master.pull(i, LR, self.out)
        self.time(2 * k, pull=True)  # warm up: past any first-push special case

    def time(self, n: int, pull: bool) -> float:
        master, message, out, k = self.master, self.message, self.out, self.k
        i = self.i
        start = time.perf_counter()
        for _ in range(n):
            master.push(i, message, LR)
            if pull:
                master.pull(i, LR, out)
            i = (i + 1) % k
        elapsed = time.perf_counter() - start
        self.i = i
        return elapsed


def measure(name: str, d: int, k: int, sgd: SgdStep, args) -> dict[str, float]:
    gen = torch.Generator().manual_seed(1)
    pushes = MasterPushes(name, d, k, gen)
    n = max(1, round(args.work / d))  # calls per timed block
    t_sgd, t_push, t_pp, r_push, r_pp = [], [], [], [], []
    began = time.perf_counter()
    for rep in range(args.reps):
        if rep >= args.min_reps and time.perf_counter() - began > args.budget:
            break  # a slow rule: fewer repetitions (the count is printed)
        blocks = [
            ("sgd", lambda: sgd.time(n)),
            ("push", lambda: pushes.time(n, pull=False)),
            ("pp", lambda: pushes.time(n, pull=True)),
        ]
        if rep % 2:
            blocks.reverse()
        times = {key: fn() / n for key, fn in blocks}
        t_sgd.append(times["sgd"])
        t_push.append(times["push"])
        t_pp.append(times["pp"])
        r_push.append(times["push"] / times["sgd"])
        r_pp.append(times["pp"] / times["sgd"])
    if not torch.isfinite(pushes.master.params()).all():
        raise RuntimeError(f"{name}: the master's parameters became non-finite")
    med = statistics.median
    return {
        "reps": len(t_sgd),
        "sgd": med(t_sgd),
        "push": med(t_push),
        "pp": med(t_pp),
        "r_push": med(r_push),
        "r_pp": med(r_pp),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument(
        "--workers",
        nargs=2,
        type=int,
        default=(16, 4),
        metavar=("K_RESNET20", "K_RESNET50"),
        help="k at each size (default 16 and 4: (k, d) float32 states are 100 MB per "
        "worker at ResNet-50 size)",
    )
    parser.add_argument("--algorithms", nargs="+", default=list(A.ALGORITHMS))
    parser.add_argument("--reps", type=int, default=9, help="repetitions (median)")
    parser.add_argument("--min-reps", type=int, default=3, help="repetitions even past the budget")
    parser.add_argument(
        "--budget", type=float, default=3.0, help="seconds per algorithm and size (soft)"
    )
    parser.add_argument(
        "--work", type=float, default=2e7, help="elements per timed block (calls = work / d)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parse_with_smoke(parser)
    if args.smoke:
        SIZES["tiny"] = 4096
        args.sizes, args.workers = ["tiny"], (4, 4, 4)  # (k at each size, tiny last)
        args.reps = args.min_reps = 1
        args.budget, args.work = 0.0, 4096
    torch.set_num_threads(args.threads)
    workers = dict(zip(SIZES, args.workers))

    print(
        f"float32, {args.threads} thread(s), {args.min_reps} to {args.reps} repetitions "
        f"({args.budget:g} s budget each); times per call in ms; ratios are medians of "
        "per-repetition ratios to the SGD step"
    )
    header = (
        f"{'algorithm':<14} {'model':<9} {'d':>11} {'k':>3} {'SGD step':>9} {'push':>9} "
        f"{'push+pull':>10} {'push/SGD':>9} {'(push+pull)/SGD':>16} {'reps':>4}"
    )
    print(header)
    print("-" * len(header))
    worst: dict[str, float] = {}
    for model in args.sizes:
        d, k = SIZES[model], workers[model]
        sgd = SgdStep(d, torch.Generator().manual_seed(0))
        for name in args.algorithms:
            r = measure(name, d, k, sgd, args)
            gc.collect()
            worst[name] = max(worst.get(name, 0.0), r["r_push"])
            print(
                f"{name:<14} {model:<9} {d:>11,} {k:>3} {1e3 * r['sgd']:>9.3f} "
                f"{1e3 * r['push']:>9.3f} {1e3 * r['pp']:>10.3f} {r['r_push']:>9.2f} "
                f"{r['r_pp']:>16.2f} {r['reps']:>4}"
            )
        del sgd
        gc.collect()
    print(f"(last line: push-only ratios, the larger over {', '.join(args.sizes)})")
    print(
        f"dana-slim ratio {worst.get('dana-slim', float('nan')):.2f}, "
        f"dana-zero ratio {worst.get('dana-zero', float('nan')):.2f}"
    )


if __name__ == "__main__":
    main()
