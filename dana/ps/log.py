"""Per-push records: kept by each server shard, merged by the driver into one log.

Each shard server appends one :class:`ShardLog` entry per push it applies: the worker,
the push's sequence number, the staleness the shard counted (its updates between the
worker's pull of that shard and this push), the gap's sum of squares over the shard's
probe coordinates and their number, and (meaningful on shard 0, the primary) the loss,
the learning rate, the time of the push, the worker's cycle (the time since its
previous push was applied, or since its pull: its step and its exchange with the
servers), the step alone as the worker measured it, and the updates applied so far. The driver drains the entries with ``poll`` and a :class:`LogMerger`
joins the shards' parts of each push by ``(worker, seq)``:

- staleness: the largest of the shards' counts (with one shard, exactly the simulator's
  definition; with several, a push is as stale as its stalest part);
- gap: ``sqrt(sum of squares / number of probes)`` over all shards;
- loss, lr, time, cycle, compute: from shard 0, which also fixes the order of the log.

A shard rebuilt after its loss (:mod:`dana.ps.recovery`) reports again the pushes
replayed since its snapshot, and a standby promoted to shard 0 some pushes its lost head
had reported: entries of a worker with a seq not above the last one taken from that
shard are dropped.

The merged log is a :class:`dana.train.records.pushlog.PushLog` (the simulator's, so
:func:`dana.train.records.metrics.summarize` reads both alike) plus the cycles and step times
that become ``step_times.csv`` (:func:`dana.train.cluster.fit.fit_cluster` reads them).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dana.train.records.pushlog import ColumnLog, PushLog

_TYPES = {
    "worker": "l",
    "seq": "l",
    "staleness": "l",
    "gap_sq": "d",
    "gap_n": "l",
    "loss": "d",
    "lr": "d",
    "time": "d",
    "duration": "d",
    "compute": "d",
    "updates": "l",
    "members": "q",
}


class ShardLog(ColumnLog):
    """The entries a shard has applied since the driver last drained them
    (:meth:`~dana.train.records.pushlog.ColumnLog.drain`)."""

    types = _TYPES


class LogMerger:
    """Joins the shards' entries of each push into the run's log, in shard 0's order."""

    def __init__(self, servers: int):
        self.servers = servers
        self.log = PushLog()
        self.durations = array("d")
        self.computes = array("d")
        self.updates = array("l")  # master updates after each push (for divergence)
        self.members = array("q")  # the live workers at each push, a bitmask
        self._primary: deque[tuple] = deque()
        self._parts: dict[tuple[int, int], list[float]] = {}
        self._seen: dict[tuple[int, int], int] = {}  # (shard, worker) -> last seq taken

    def __len__(self) -> int:
        return len(self.log)

    def add(self, shard: int, columns: dict[str, np.ndarray]) -> None:
        """Take a shard's drained entries; merge every push whose parts are all in."""
        rows = zip(*(columns[name].tolist() for name in ShardLog.columns))
        if shard == 0:
            # A promoted standby reports again some pushes its lost head had reported.
            for row in rows:
                if row[1] > self._seen.get((0, row[0]), 0):
                    self._seen[(0, row[0])] = row[1]
                    self._primary.append(row)
        else:
            for w, seq, stale, gap_sq, gap_n, *_ in rows:
                # A rebuilt shard replays the pushes since its snapshot, some of which
                # its lost self had reported: a worker's pushes come in order, so a seq
                # not above the last one taken is such a repeat.
                if seq <= self._seen.get((shard, w), 0):
                    continue
                self._seen[(shard, w)] = seq
                part = self._parts.setdefault((w, seq), [0, 0.0, 0, 0])
                part[0] = max(part[0], stale)
                part[1] += gap_sq
                part[2] += gap_n
                part[3] += 1
        self._merge(final=False)

    def finish(self) -> None:
        """Merge what is left: pushes some shard never applied (the run's last ones)."""
        self._merge(final=True)
        self._parts.clear()

    def _merge(self, final: bool) -> None:
        others = self.servers - 1
        while self._primary:
            w, seq, stale, gap_sq, gap_n, loss, lr, t, duration, compute, updates, members = (
                self._primary[0]
            )
            part = self._parts.get((w, seq)) if others else None
            if others and not final and (part is None or part[3] < others):
                return
            self._primary.popleft()
            if part is not None:
                del self._parts[(w, seq)]
                stale = max(stale, part[0])
                gap_sq += part[1]
                gap_n += part[2]
            gap = math.sqrt(gap_sq / gap_n) if gap_n else math.nan
            self.log.append(worker=w, staleness=stale, gap=gap, loss=loss, lr=lr, sim_time=t)
            self.durations.append(duration)
            self.computes.append(compute)
            self.updates.append(updates)
            self.members.append(members)

    def state_dict(self, length: int) -> dict[str, Any]:
        """The first ``length`` merged entries, as tensors (for a checkpoint)."""
        state = {k: v[:length] for k, v in self.log.state_dict().items()}
        state["duration"] = torch.from_numpy(np.array(self.durations[:length]))
        state["compute"] = torch.from_numpy(np.array(self.computes[:length]))
        state["updates"] = torch.from_numpy(np.array(self.updates[:length]))
        state["members"] = torch.from_numpy(np.array(self.members[:length], dtype=np.int64))
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.log.load_state_dict({name: state[name] for name in PushLog.columns})
        self.durations = array("d", state["duration"].tolist())
        # (a checkpoint from before the step times were sent has none: unknown)
        compute = state.get("compute")
        self.computes = array(
            "d", compute.tolist() if compute is not None else [math.nan] * len(self.durations)
        )
        self.updates = array("l", state["updates"].tolist())
        # (absent before membership: nobody recorded)
        self.members = array("q", state["members"].tolist() if "members" in state else [])
