"""A worker's side of the protocol: every call goes to all ``S`` shard servers at once.

A pull asks every shard concurrently and joins the replies into one flat vector (with one
shard, the reply itself, read-only, straight from Ray's object store: no copy). A push
splits the message into the shards' contiguous slices (numpy views; Ray copies each into
its object store once) and sends them concurrently. See :mod:`dana.dist.server` for the
calls and their replies.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import ray
import torch
from torch import Tensor

from dana.dist.layout import Layout
from dana.dist.server import STOP

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ServerLink:
    def __init__(self, servers: list[Any], layout: Layout, worker: int, dtype: torch.dtype):
        self.servers, self.layout, self.worker = servers, layout, worker
        self.probes = [torch.from_numpy(p) for p in layout.probes]
        self.buffer = torch.empty(layout.d, dtype=dtype) if len(servers) > 1 else None

    def pull(self, join: bool = False) -> tuple[Tensor | None, float, int, int]:
        """(parameters or None if the run is over, lr, last seq applied, joins so far)."""
        replies = ray.get([s.pull.remote(self.worker, join) for s in self.servers])
        _, _, lr, _, joins = replies[0]
        last_seq = max(r[3] for r in replies)
        if any(r[0] == STOP for r in replies):
            return None, lr, last_seq, joins
        return self._join([r[1] for r in replies]), lr, last_seq, joins

    def push(
        self,
        seq: int,
        message: Tensor | None,
        loss: float = math.nan,
        offset: Tensor | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> list[str]:
        """Push to every shard; the shards' statuses."""
        calls = self._calls("push", seq, message, loss, offset, buffers)
        return ray.get(calls)

    def exchange(
        self,
        seq: int,
        message: Tensor,
        loss: float = math.nan,
        offset: Tensor | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> tuple[list[str], Tensor | None, float]:
        """Push and pull in one round trip: (statuses, parameters or None if over, lr)."""
        replies = ray.get(self._calls("exchange", seq, message, loss, offset, buffers))
        statuses = [r[0] for r in replies]
        if any(r[1] is None for r in replies):
            return statuses, None, replies[0][2]
        return statuses, self._join([r[1] for r in replies]), replies[0][2]

    def _calls(
        self,
        method: str,
        seq: int,
        message: Tensor | None,
        loss: float,
        offset: Tensor | None,
        buffers: dict[str, np.ndarray] | None,
    ) -> list[Any]:
        pieces = self.layout.split(message.numpy()) if message is not None else None
        calls = []
        for s, server in enumerate(self.servers):
            lo, hi = self.layout.bounds[s]
            off = None
            if offset is not None:
                off = torch.index_select(offset[lo:hi], 0, self.probes[s]).numpy()
            calls.append(
                getattr(server, method).remote(
                    self.worker,
                    seq,
                    None if pieces is None else pieces[s],
                    loss if s == 0 else math.nan,
                    off,
                    buffers if s == 0 else None,
                )
            )
        return calls

    def _join(self, pieces: list[np.ndarray]) -> Tensor:
        if self.buffer is None:
            return torch.from_numpy(pieces[0])
        for (lo, hi), piece in zip(self.layout.bounds, pieces):
            self.buffer[lo:hi].copy_(torch.from_numpy(piece))
        return self.buffer
