"""Shard 0's relay: the calls it passes on to the other shards (bounded staleness, ``S > 1``).

With several shards and a staleness bound, only shard 0 keeps the gate, and the workers
call only shard 0; once shard 0 has applied a push or served a pull it makes the same
call on every other shard (:mod:`dana.ps.server`, "Bounded staleness"). Ray runs the
calls of one caller on an actor in the order they were made, so every shard applies
the same pushes and serves the same pulls in the same order.

:class:`Relay` holds the other shards' actors and the joins still to pass on; it makes
the calls and returns their object references (the data never pass through shard 0).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class Relay:
    """The other shards of a run, by their actors' names (resolved by :meth:`connect`)."""

    def __init__(self, names: list[str], workers: int):
        self.names = list(names)
        self.peers: list[Any] = []  # their actor handles, once connect() has run
        self.rejoined = [False] * workers  # a join to pass on with the worker's next pull

    def connect(self) -> None:
        if self.names:
            import ray

            self.peers = [ray.get_actor(name) for name in self.names]

    def joined(self, worker: int) -> None:
        """``worker``'s process joined: its next relayed pull is a join."""
        self.rejoined[worker] = True

    def push(
        self,
        worker: int,
        seq: int,
        pieces: list[Any] | None,
        offsets: list[np.ndarray | None],
    ) -> None:
        """The same push on every other shard: its slice of the message (``pieces``,
        object references; ``None`` for a local step) and of the worker's offset."""
        for s, peer in enumerate(self.peers):
            piece = None if pieces is None else pieces[s]
            peer.push.remote(worker, seq, piece, math.nan, offsets[s], None)

    def pull(self, worker: int) -> list[Any]:
        """The same pull on every other shard: the references of their replies."""
        join, self.rejoined[worker] = self.rejoined[worker], False
        return [peer.pull.remote(worker, join) for peer in self.peers]

    def stop(self) -> list[Any]:
        """Stop every other shard after the calls relayed to it (the references)."""
        return [peer.stop.remote() for peer in self.peers]
