"""Shard 0's relay: the calls it passes on to the other shards (always, when ``S > 1``).

With several shards the workers call only shard 0 (which alone keeps the staleness
gate, if any); once shard 0 has applied a push or served a pull it makes the same call
on every other shard (:mod:`dana.ps.server`, "Several shards"). Ray runs the calls of
one caller on an actor in the order they were made, so every shard applies the same
pushes and serves the same pulls in the same order.

:class:`Relay` holds the other shards' actors and the joins still to pass on; it makes
the calls (a push's slices sent from shard 0's own copies, so that they outlive the
worker) and returns their object references (pulled parameters never pass through
shard 0). It logs every call it makes in a :class:`~dana.ps.recovery.RelayLog`, from
which the driver rebuilds a lost shard (:meth:`rebind`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dana.ps.recovery import RelayLog


class Relay:
    """The other shards of a run, by their actors' names (resolved by :meth:`connect`)."""

    def __init__(self, names: list[str], workers: int):
        self.names = list(names)
        self.peers: list[Any] = []  # their actor handles, once connect() has run
        self.rejoined = [False] * workers  # a join to pass on with the worker's next pull
        self.log = RelayLog(len(self.names)) if self.names else None

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
        """The same push on every other shard: its slice of the message (``pieces``;
        ``None`` for a local step) and of the worker's offset."""
        if not self.peers:
            return
        # Copies: the log keeps them after the worker's arguments are gone.
        args = [
            (worker, seq, _copy(None if pieces is None else pieces[s]), math.nan, _copy(offsets[s]))
            for s in range(len(self.peers))
        ]
        self.log.append("push", args)
        for peer, call in zip(self.peers, args):
            peer.push.remote(*call)

    def pull(self, worker: int) -> list[Any]:
        """The same pull on every other shard: the references of their replies."""
        if not self.peers:
            return []
        join, self.rejoined[worker] = self.rejoined[worker], False
        self.log.append("pull", [(worker, join)] * len(self.peers))
        return [peer.pull.remote(worker, join) for peer in self.peers]

    def stop(self) -> list[Any]:
        """Stop every other shard after the calls relayed to it (the references)."""
        if self.peers:
            self.log.append("stop", [()] * len(self.peers))
        return [peer.stop.remote() for peer in self.peers]

    def trim(self, shard: int, covered: int) -> None:
        """The driver holds a snapshot of ``shard`` covering the calls up to ``covered``."""
        self.log.trim(shard, covered)

    def rebind(self, shard: int, actor: Any, covered: int) -> int:
        """Shard ``shard`` is ``actor`` now, rebuilt from a snapshot covering the calls up
        to ``covered``: send it the calls since, then relay to it. How many were sent."""
        self.peers[shard - 1] = actor
        return self.log.replay(actor, shard, covered)

    def counters(self) -> dict[str, int]:
        log = self.log
        if log is None:
            return {"relayed_calls": 0, "log_peak_calls": 0, "log_peak_bytes": 0}
        return {
            "relayed_calls": log.count,
            "log_peak_calls": log.peak,
            "log_peak_bytes": log.peak_bytes,
        }


def _copy(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.array(array)
