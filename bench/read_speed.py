"""How fast does dana read a map-style Dataset, against a plain DataLoader loop over it?

A ``Dataset`` of ``--size`` in-memory 1x28x28 images with a cheap random transform in
``__getitem__`` (noise from torch's generator, a flip from Python's) is read in batches
of ``--batch-size``, two ways: dana's stream, as ``dana.fit`` reads its training data (a
:class:`~dana.train.task.reading.ReadBatches` over the shuffled rows of a
``BatchStream``, each batch read under the generators seeded once by its key), and a
plain ``for x, y in DataLoader(dataset, batch_size, shuffle=True)`` loop. Both use
``--num-workers`` reader processes (default 0: one reader, in process) and torch on
``--threads`` threads (default 1).

Each repetition builds both anew, reads ``--warmup`` untimed batches with each, then
times ``--batches`` batches of each, alternating in chunks of ``--chunk`` (the order
flips every chunk), so that both see the same load on a shared machine. A repetition's
ratio is the median over its chunks of (dana items/s / DataLoader items/s); the last
line is the median over repetitions:

    read speed ratio 0.93  (the format)

Run: ``python bench/read_speed.py`` (about 6 s on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from common import parse_with_smoke
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.train.task.batches import BatchStream  # noqa: E402
from dana.train.task.reading import MapData, ReadBatches  # noqa: E402


class Images(Dataset):
    """Random 1x28x28 images and labels; each read adds noise and flips half of them."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 28, 28, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i] + 0.1 * torch.randn(1, 28, 28)
        return (x.flip(-1) if random.random() < 0.5 else x), self.y[i]


class DanaReads:
    """dana's stream of a worker's batches (a Ray worker's: read ahead with readers),
    each taken as the gradient takes it."""

    def __init__(self, dataset: Images, args):
        self.data = MapData(dataset, "train", args.num_workers)
        rows = BatchStream(len(dataset), args.batch_size, seed=0)
        self.stream = ReadBatches(self.data, args.batch_size, 0, rows, worker=0)

    def read(self, n: int) -> float:
        start = time.perf_counter()
        stream = self.stream
        for _ in range(n):
            stream.take(stream.next())
        return time.perf_counter() - start

    def close(self) -> None:
        self.data.close()


class LoaderReads:
    """A plain DataLoader loop, started again after each pass."""

    def __init__(self, dataset: Images, args):
        workers = args.num_workers
        self.loader = DataLoader(
            dataset,
            args.batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        self.batches = iter(self.loader)

    def read(self, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            try:
                next(self.batches)
            except StopIteration:
                self.batches = iter(self.loader)
                next(self.batches)
        return time.perf_counter() - start

    def close(self) -> None:
        del self.batches


def repetition(dataset: Images, args, rep: int) -> tuple[float, float, float]:
    """Items/s of dana and of the DataLoader over ``args.batches`` batches each, and the
    median over chunks of their ratio."""
    dana, loader = DanaReads(dataset, args), LoaderReads(dataset, args)
    try:
        dana.read(args.warmup)  # untimed: reader processes starting, first touches
        loader.read(args.warmup)
        t_dana, t_loader, ratios = [], [], []
        for c, start in enumerate(range(0, args.batches, args.chunk)):
            n = min(args.chunk, args.batches - start)
            sides = (dana, loader) if (rep + c) % 2 == 0 else (loader, dana)
            times = {side: side.read(n) for side in sides}
            t_dana.append(times[dana])
            t_loader.append(times[loader])
            ratios.append(times[loader] / times[dana])  # (items/s: the inverse of time)
    finally:
        dana.close()
        loader.close()
    items = args.batches * args.batch_size
    return items / sum(t_dana), items / sum(t_loader), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="items in the Dataset")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=300, help="timed batches per side")
    parser.add_argument("--chunk", type=int, default=10, help="batches per alternation")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches per side")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (median)")
    parser.add_argument(
        "--num-workers", type=int, default=0, help="reader processes of both (0: in process)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parse_with_smoke(parser)
    if args.smoke:
        args.size, args.batch_size, args.batches, args.chunk = 256, 16, 4, 2
        args.warmup, args.reps = 1, 1

    torch.set_num_threads(args.threads)
    dataset = Images(args.size)
    print(
        f"{args.size:,} images 1x28x28 (noise and a flip per read), batch {args.batch_size}, "
        f"{args.num_workers} reader processes, {args.threads} torch threads, "
        f"{args.batches} batches per side, {args.reps} repetitions"
    )
    print(f"{'rep':>3}  {'dana items/s':>12}  {'DataLoader items/s':>18}  {'chunk ratio':>11}")
    ratios = []
    for rep in range(args.reps):
        dana, loader, ratio = repetition(dataset, args, rep)
        ratios.append(ratio)
        print(f"{rep:>3}  {dana:>12,.0f}  {loader:>18,.0f}  {ratio:>11.3f}")
    print("(chunk ratio: dana items/s / DataLoader items/s, the median over the rep's chunks)")
    print(f"read speed ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
