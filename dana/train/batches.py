"""One shuffled stream of mini-batches, shared by all workers.

Every gradient computation takes the next batch of the stream (ALGORITHMS.md, "The
simulation model"). Each epoch is a fresh permutation of the ``n`` examples drawn from
the stream's own generator, cut into ``n // batch_size`` batches (the remainder is left
out). A batch is a tensor of example indices.

    >>> s = BatchStream(10, 4, seed=0)
    >>> s.batches_per_epoch, s.next().shape
    (2, torch.Size([4]))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class BatchStream:
    def __init__(self, n: int, batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if n < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} examples")
        self.n, self.batch_size = n, batch_size
        self.batches_per_epoch = n // batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(n, generator=self.generator)
        self.position = 0  # batches taken from the current permutation
        self.epoch = 0

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
