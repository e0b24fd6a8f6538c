"""Rebuilding a lost server shard while the run goes on: snapshots plus a replay log.

With ``S > 1`` shards, shard 0 relays every call to the others, in one order
(:mod:`dana.ps.server`, :mod:`dana.ps.relay`). That order is the whole input of shard ``s >= 1``: its state
is a deterministic function of the calls shard 0 relayed to it. So:

- **the log** (:class:`RelayLog`, kept by shard 0): every call shard 0 relays, numbered
  ``1, 2, 3, ...``, with its arguments (a push's slice of the message copied, so that it
  outlives its worker), from the last snapshot of each shard on;
- **the snapshots** (:func:`recovery_state`): each shard ``s >= 1`` counts the relayed
  calls it has run, and its ``poll`` reply carries, every :data:`SNAPSHOT_SECONDS`, its
  whole state with that count. The driver keeps the latest one of every shard (in its
  own process, which a shard's death does not take) and tells shard 0 to drop the
  calls it covers (:meth:`RelayLog.trim`);
- **recovery**: when a shard ``s >= 1`` dies, the driver starts a new actor from its
  latest snapshot (:func:`load_recovery`; before the first one, from the shard's
  starting arguments) and shard 0 sends it, in order, every logged call after the
  snapshot's count, then relays to it as before (:meth:`RelayLog.replay`). Pushes,
  pulls and stops run again exactly as the lost shard ran them (the master rules are
  deterministic), so the new shard is the lost one: no applied push lost, none applied
  twice. The workers whose pull replies it lost pull again.

Shard 0 itself, the one that orders the run and keeps the log, is not rebuilt: its loss
ends the run with :class:`~dana.errors.FaultError` (exit status 4) and ``--resume``
continues from the last checkpoint. The driver places shard 0 on its own node, so that
only the loss of the driver's node (or shard 0's process) does that.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: Seconds between two snapshots of a shard ``s >= 1`` for its recovery.
SNAPSHOT_SECONDS = 1.0


class RelayLog:
    """The calls shard 0 relayed since the driver's latest snapshot of each shard."""

    def __init__(self, peers: int):
        self.count = 0  # calls relayed so far: the number of the last one
        # (number, method, the arguments for each other shard: shard s's at s - 1)
        self.calls: deque[tuple[int, str, list[tuple]]] = deque()
        self.kept = [0] * peers  # per other shard: the count its latest snapshot covers
        self.bytes = 0  # of the message slices held
        self.peak, self.peak_bytes = 0, 0  # the most held at once (for dist.json)

    def append(self, method: str, args: list[tuple]) -> None:
        """Log a call made on every other shard (``args[s - 1]``: shard ``s``'s)."""
        self.count += 1
        self.calls.append((self.count, method, args))
        self.bytes += _nbytes(args)
        self.peak = max(self.peak, len(self.calls))
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def trim(self, shard: int, covered: int) -> None:
        """Shard ``shard``'s latest snapshot covers the calls up to ``covered``."""
        self.kept[shard - 1] = max(self.kept[shard - 1], covered)
        oldest = min(self.kept)
        while self.calls and self.calls[0][0] <= oldest:
            self.bytes -= _nbytes(self.calls.popleft()[2])

    def replay(self, actor: Any, shard: int, covered: int) -> int:
        """Send ``actor`` (the new shard ``shard``) every call after ``covered``, in
        order; how many. Calls before ``covered`` must not have been trimmed."""
        if covered < self.kept[shard - 1]:
            raise RuntimeError(f"shard {shard}'s calls up to {self.kept[shard - 1]} are gone")
        replayed = 0
        for number, method, args in self.calls:
            if number > covered:
                getattr(actor, method).remote(*args[shard - 1])
                replayed += 1
        return replayed


def _nbytes(args: list[tuple]) -> int:
    return sum(a.nbytes for call in args for a in call if isinstance(a, np.ndarray))


def recovery_state(server: Any) -> dict[str, Any]:
    """Everything a shard ``s >= 1`` needs to continue as itself: its checkpoint state,
    the per-worker records, the snapshot points still to come and the relayed calls run."""

    def copy(t: Tensor | None) -> np.ndarray | None:
        return None if t is None else t.numpy().copy()

    return {
        "state": server.state(),
        "calls": server.calls,
        "duplicates": server.duplicates,
        "rejected": server.rejected,
        "seq_gaps": server.seq_gaps,
        "pulled_probes": copy(server.pulled_probes),
        "offsets": copy(server.offsets),
        "offset_sum": copy(server.offset_sum),
        "pulled_at": list(server.pulled_at),
        "rejoined": list(server.relay.rejoined),
        "stopped": server.stopped,
        "points": list(server.snapshots.points),
        "clock_zero": server.clock_zero,
        "time": time.time(),
    }


def load_recovery(server: Any, saved: dict[str, Any]) -> None:
    """Make a freshly built ``server`` the shard that :func:`recovery_state` saved."""
    server.load_state(saved["state"])
    server.calls = int(saved["calls"])
    server.duplicates, server.rejected = int(saved["duplicates"]), int(saved["rejected"])
    server.seq_gaps = int(saved["seq_gaps"])
    server.pulled_probes = torch.from_numpy(np.array(saved["pulled_probes"]))
    if saved["offsets"] is not None:
        server.offsets = torch.from_numpy(np.array(saved["offsets"]))
        server.offset_sum = torch.from_numpy(np.array(saved["offset_sum"]))
    server.pulled_at = [int(u) for u in saved["pulled_at"]]
    server.relay.rejoined = [bool(j) for j in saved["rejoined"]]
    server.stopped = bool(saved["stopped"])
    server.snapshots.points = [int(p) for p in saved["points"]]
    server.clock_zero = float(saved["clock_zero"])
