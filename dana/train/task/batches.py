"""Streams of mini-batches: one shuffled stream shared by all workers, or one per worker.

Every gradient computation takes the next batch of the stream (ALGORITHMS.md, "The
clock, exactly as simulated"). Each epoch is a fresh permutation of the ``n`` examples drawn from
the stream's own generator, cut into ``n // batch_size`` batches (the remainder is left
out). A batch is a tensor of example indices.

:class:`KeyedBatchStream` (for augmented training data) gives each batch with its
*key* ``(rows, key)``: the seed of that batch's augmentation draws, made from the
stream's seed and the batch's number in the stream. A batch's augmentation is then
fixed when the batch is drawn (at the worker's pull), whenever and on whichever thread
its gradient is computed, so computing several workers' gradients at once
(:mod:`dana.sim.compute`) gives the sequential simulator's run.

:class:`WorkerBatches` (``--partition dirichlet:ALPHA`` or ``shards:N``,
:mod:`dana.train.cluster.partition`) gives each worker a stream of its own over its part of the
training set: a :class:`BatchStream` (or :class:`KeyedBatchStream`) per worker, seeded
``SeedSequence([seed, worker])``, its batches mapped to the part's examples. An epoch is
still ``n // batch_size`` batches of the whole set (each worker's stream cycles its part
at its own pace). A runner asks each worker's next batch with :meth:`WorkerBatches.next_for`.

    >>> s = BatchStream(10, 4, seed=0)
    >>> s.batches_per_epoch, s.next().shape
    (2, torch.Size([4]))
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


class BatchStream:
    def __init__(self, n: int, batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if n < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} examples")
        self.n, self.batch_size, self.seed = n, batch_size, int(seed)
        self.batches_per_epoch = n // batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(n, generator=self.generator)
        self.position = 0  # batches taken from the current permutation
        self.epoch = 0

    @property
    def drawn(self) -> int:
        """Batches drawn from the stream so far (the next batch's number)."""
        return self.epoch * self.batches_per_epoch + self.position

    def next(self) -> Tensor:
        if self.position == self.batches_per_epoch:
            self.perm = torch.randperm(self.n, generator=self.generator)
            self.position = 0
            self.epoch += 1
        start = self.position * self.batch_size
        self.position += 1
        return self.perm[start : start + self.batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "perm": self.perm.clone(),
            "position": self.position,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["perm"]) != self.n:
            raise ValueError(
                f"batch stream state is for {len(state['perm'])} examples, not {self.n}"
            )
        self.generator.set_state(state["generator"])
        self.perm = state["perm"].clone()
        self.position = int(state["position"])
        self.epoch = int(state["epoch"])


def batch_key(seed: int, number: int) -> int:
    """The augmentation seed of batch ``number`` of the stream seeded ``seed``."""
    return int(np.random.SeedSequence([seed % 2**63, number]).generate_state(1, np.uint64)[0])


class KeyedBatchStream(BatchStream):
    """A :class:`BatchStream` whose batches come with their keys: ``(rows, key)``,
    ``key = batch_key(seed, number)`` (the module docstring says why)."""

    def next(self) -> tuple[Tensor, int]:  # type: ignore[override]
        number = self.drawn
        return super().next(), batch_key(self.seed, number)


def batches_for(
    partition: str,
    labels: Any,
    batch_size: int,
    seed: int,
    workers: int,
    keyed: bool = False,
) -> BatchStream | WorkerBatches:
    """The stream(s) of a run: for ``partition`` ``iid`` one shared stream (a
    :class:`KeyedBatchStream` when ``keyed``), else :class:`WorkerBatches` over the
    parts :func:`dana.train.cluster.partition.partition` gives (each at least a batch)."""
    from dana.train.cluster.partition import partition as split

    n = len(labels)
    if partition == "iid":
        return (KeyedBatchStream if keyed else BatchStream)(n, batch_size, seed=seed)
    if torch.is_tensor(labels):
        if labels.is_floating_point() or labels.dim() != 1:
            from dana.errors import ConfigError

            raise ConfigError(
                f"--partition {partition} splits the data by class: it needs integer class "
                "labels (one per example); use --partition iid"
            )
        labels = labels.cpu().numpy()
    parts = split(labels, workers, seed, partition, min_size=batch_size)
    return WorkerBatches(parts, n, batch_size, seed=seed, keyed=keyed)


def stream_seed(seed: int, worker: int, incarnation: int) -> int:
    """The seed of a Ray worker ``worker``'s own batch stream in its ``incarnation``-th
    process (a restart or a resume draws a new order)."""
    return int(np.random.SeedSequence([seed, worker, incarnation]).generate_state(1)[0])


def worker_seed(seed: int, worker: int) -> int:
    """The seed of worker ``worker``'s own stream."""
    return int(np.random.SeedSequence([seed % 2**63, worker]).generate_state(1, np.uint64)[0] >> 1)


class WorkerBatches:
    """One stream per worker over its part of the training set (module docstring).

    ``parts``: each worker's examples (indices into the training set); ``n``: the size
    of the whole set (an epoch is ``n // batch_size`` batches); ``keyed``: each batch
    comes with its augmentation key, ``(rows, key)``."""

    per_worker = True

    def __init__(self, parts: list, n: int, batch_size: int, seed: int = 0, keyed: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if n < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} examples")
        self.parts = [torch.as_tensor(np.asarray(p), dtype=torch.int64) for p in parts]
        self.n, self.batch_size, self.seed, self.keyed = n, batch_size, int(seed), keyed
        self.batches_per_epoch = n // batch_size
        stream = KeyedBatchStream if keyed else BatchStream
        self.streams = [
            stream(len(p), batch_size, seed=worker_seed(seed, i)) for i, p in enumerate(self.parts)
        ]

    def next_for(self, worker: int) -> Tensor | tuple[Tensor, int]:
        """Worker ``worker``'s next batch (examples of its part)."""
        batch = self.streams[worker].next()
        if self.keyed:
            rows, key = batch
            return self.parts[worker][rows], key
        return self.parts[worker][batch]

    def state_dict(self) -> dict[str, Any]:
        return {"streams": [s.state_dict() for s in self.streams]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state.get("streams", ())) != len(self.streams):
            raise ValueError(
                f"the saved batches are {len(state.get('streams', ()))} workers' streams, "
                f"not {len(self.streams)}"
            )
        for stream, s in zip(self.streams, state["streams"]):
            stream.load_state_dict(s)
