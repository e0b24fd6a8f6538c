"""Rebuilding a lost server shard, or shard 0's standby, while the run goes on.

Shard 0 (the head) orders the run: once it has applied a push or served a pull, it
makes the same call on its **standby** (a replica of shard 0, waiting for it to answer)
and then on every other shard (:mod:`dana.ps.server`, :mod:`dana.ps.relay`). Every
call it passes on is numbered ``1, 2, 3, ...``; each receiver runs a call only if its
number is the next one it expects (:meth:`ShardServer.relayed`: a repeat is skipped),
so a call sent twice (a replay, a promotion) runs once. The order is the whole input
of a receiver: its state is a deterministic function of the calls it ran. So:

- **the log** (:class:`RelayLog`, kept by the head and, identically, by the standby):
  every call passed on, with its arguments for every shard (``args[0]``: shard 0's own,
  for the standby; a push's slices copied, so that they outlive their worker), from the
  oldest snapshot the driver holds on;
- **the snapshots** (:func:`recovery_state`): the standby and each shard ``s >= 1``
  count the calls they have run, and every :data:`SNAPSHOT_SECONDS` their ``poll``
  reply carries their whole state with that count. The driver keeps the latest one of
  each (in its own process) and tells the head and the standby to drop the calls every
  snapshot covers (:meth:`RelayLog.trim`);
- **a lost shard ``s >= 1``**: a new actor from its latest snapshot (before the first
  one, from the shard's starting arguments), and the head sends it every logged call
  after the snapshot's count (:meth:`RelayLog.replay`), then passes calls on to it;
- **a lost standby**: the same, from the standby's snapshot; the head sends it the whole
  log (it logs every entry and runs those past its count), then waits for it again;
- **a lost head**: the standby has run every call the head passed on to anyone (it
  answered before the head went on), so it is promoted: it passes its log on to the
  other shards (each skips what it has) and becomes the head; the workers send their
  unanswered calls again to it, with the same sequence numbers (a push it has already
  applied is answered ``duplicate``); then a new standby is built from the latest
  standby snapshot and the new head's log.

Losing the head and its standby at once (or the driver) is not survived: the run ends
with :class:`~dana.errors.FaultError` (exit status 4) and ``--resume`` continues from the
last checkpoint.
"""

from __future__ import annotations

import copy as copy_module
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: Seconds between two snapshots of a shard ``s >= 1`` for its recovery.
SNAPSHOT_SECONDS = 1.0


class RelayLog:
    """The calls the head passed on since the driver's oldest snapshot of a receiver.

    Entries are ``(number, method, args)``, ``args[s]`` the call's arguments for shard
    ``s`` (``args[0]``: the standby's, shard 0's own). ``kept[s]``: the count that the
    driver's latest snapshot of receiver ``s`` (0: the standby) covers.
    """

    def __init__(self, shards: int):
        self.count = 0  # calls logged so far: the number of the last one
        self.calls: deque[tuple[int, str, list[tuple]]] = deque()
        self.kept = [0] * shards
        self.bytes = 0  # of the arrays held
        self.peak, self.peak_bytes = 0, 0  # the most held at once (for dist.json)

    def append(self, method: str, args: list[tuple], number: int | None = None) -> int:
        """Log a call (``args[s]``: shard ``s``'s); its number. ``number``: a copy of
        another log's entry (the standby's log); a repeat is not logged again."""
        if number is None:
            number = self.count + 1
        elif number <= self.count:
            return number
        elif number != self.count + 1:
            if self.calls:
                raise RuntimeError(f"relayed call {number} after {self.count}: one is missing")
            self.count = number - 1  # a rebuilt standby's log starts at the head's oldest
        self.count = number
        self.calls.append((number, method, args))
        self.bytes += _nbytes(args)
        self.peak = max(self.peak, len(self.calls))
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return number

    def trim(self, shard: int, covered: int) -> None:
        """Receiver ``shard``'s latest snapshot covers the calls up to ``covered``."""
        self.kept[shard] = max(self.kept[shard], covered)
        oldest = min(self.kept)
        while self.calls and self.calls[0][0] <= oldest:
            self.bytes -= _nbytes(self.calls.popleft()[2])

    def replay(self, actor: Any, shard: int, covered: int) -> int:
        """Send ``actor`` (the new shard ``shard >= 1``) every call after ``covered``, in
        order; how many. Calls before ``covered`` must not have been trimmed."""
        if covered < self.kept[shard]:
            raise RuntimeError(f"shard {shard}'s calls up to {self.kept[shard]} are gone")
        replayed = 0
        for number, method, args in self.calls:
            if number > covered:
                actor.relayed.remote(number, method, *args[shard])
                replayed += 1
        return replayed


def _nbytes(args: list[tuple]) -> int:
    total = 0
    for call in args:
        for a in call:
            if isinstance(a, np.ndarray):
                total += a.nbytes
            elif isinstance(a, dict):  # (a push's buffers)
                total += sum(v.nbytes for v in a.values() if isinstance(v, np.ndarray))
    return total


def recovery_state(server: Any) -> dict[str, Any]:
    """Everything a shard ``s >= 1`` or a standby needs to continue as itself: its
    checkpoint state, the per-worker records, the staleness gate's, the snapshot points
    still to come and the relayed calls run."""

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
        "gate": None if server.gate is None else copy_module.deepcopy(vars(server.gate)),
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
    if server.gate is not None and saved.get("gate") is not None:
        vars(server.gate).update(copy_module.deepcopy(saved["gate"]))
    server.snapshots.points = [int(p) for p in saved["points"]]
    server.clock_zero = float(saved["clock_zero"])
