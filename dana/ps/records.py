"""A shard server's records: its counters, its per-worker records and its gap probes.

Each is a small state object with ``state_dict()`` / ``load_state_dict()`` (plain values
and numpy arrays), restored only through its owner, the server
(:meth:`~dana.ps.shard.ShardServer.load_recovery`); a checkpoint keeps a part of them
(:meth:`Counts.resume`, :meth:`WorkerRecords.resume`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class Counts:
    """A shard's counters (``dist.json``, per shard)."""

    steps: int = 0  # gradient computations heard of, local ones included
    updates: int = 0  # times the master's parameters moved (synchronous: once per round)
    pushes: int = 0  # messages applied
    local_steps: int = 0
    duplicates: int = 0  # pushes sent again: answered "duplicate", not applied again
    rejected: int = 0  # pushes refused after the run's end
    seq_gaps: int = 0  # pushes whose number skipped one (never expected)
    calls: int = 0  # pulls, pushes and stops run (on a receiver: relayed calls)
    repeats: int = 0  # relayed calls skipped (run already)
    call_gaps: int = 0  # relayed calls missed (never expected: counted for the tests)
    waits_before: int = 0  # waits for the staleness bound before a resume
    wait_before: float = 0.0  # and their seconds

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for field in fields(self):
            kind = type(getattr(self, field.name))
            setattr(self, field.name, kind(state[field.name]))

    def resume(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint's counts (its waits: the whole run's so far)."""
        self.steps, self.updates = int(checkpoint["steps"]), int(checkpoint["updates"])
        self.pushes, self.local_steps = int(checkpoint["pushes"]), int(checkpoint["local_steps"])
        self.waits_before = int(checkpoint.get("waits", 0))  # (absent before dana-ray/1 had it)
        self.wait_before = float(checkpoint.get("wait_time", 0.0))


class WorkerRecords:
    """Per worker: the number of its last push applied (``last_seq``), its pushes applied,
    its joins, the master's updates at its last pull (``pulled_at``), whether it is in
    the run (``live``: the first ``live`` of them at the start) and when its current
    step began (``cycle_start``: this process's clock, not saved)."""

    def __init__(self, workers: int, live: int | None = None):
        live = workers if live is None else live
        self.live = [i < live for i in range(workers)]
        self.last_seq = [0] * workers
        self.applied = [0] * workers
        self.joins = [0] * workers
        self.pulled_at = [0] * workers
        self.cycle_start = [time.time()] * workers

    def restart_clocks(self) -> None:
        self.cycle_start = [time.time()] * len(self.cycle_start)

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_seq": list(self.last_seq),
            "applied": list(self.applied),
            "joins": list(self.joins),
            "pulled_at": list(self.pulled_at),
            "live": list(self.live),
        }

    @property
    def members(self) -> int:
        """The live workers as a bitmask (bit ``i``: worker ``i``)."""
        return sum(1 << i for i, live in enumerate(self.live) if live)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume(state)
        self.pulled_at = [int(u) for u in state["pulled_at"]]

    def resume(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint's records (its ``last_seq``, ``applied``, ``joins``)."""
        self.last_seq = [int(s) for s in checkpoint["last_seq"]]
        self.applied = [int(s) for s in checkpoint["applied"]]
        self.joins = [int(s) for s in checkpoint["joins"]]
        if "live" in checkpoint:  # (absent before membership: every worker was live)
            self.live = [bool(x) for x in checkpoint["live"]]


class GapProbes:
    """The gap ``RMS(theta_now - p_i)`` on this shard's probe coordinates
    (:class:`~dana.ps.layout.Layout`): per worker, what it pulled there and its rule's
    ``theta_offset(1)`` there (``dana-slim``'s ``m * v_i``), with their sum."""

    def __init__(self, probe: np.ndarray, workers: int, dtype: torch.dtype):
        self.probe = torch.from_numpy(probe)
        self.n = n = len(self.probe)
        self.pulled = torch.zeros(workers, n, dtype=dtype)  # each p_i on the probes
        self.offsets: Tensor | None = None  # each worker's theta_offset(1) on the probes
        self.offset_sum: Tensor | None = None
        self._diff = torch.empty(n, dtype=dtype)

    def record_pull(self, worker: int, params: Tensor) -> None:
        torch.index_select(params, 0, self.probe, out=self.pulled[worker])

    def gap_sq(self, worker: int, reference: Tensor, lr: float) -> float:
        """``sum((theta_now - p_i)^2)`` over the probes, theta the true one: the master's
        ``reference`` plus ``lr`` times the workers' offsets."""
        diff = torch.index_select(reference, 0, self.probe, out=self._diff)
        if self.offset_sum is not None:
            diff.add_(self.offset_sum, alpha=lr)
        diff.sub_(self.pulled[worker])
        return float(diff.dot(diff))

    def set_offset(self, worker: int, offset: np.ndarray) -> None:
        new = torch.from_numpy(offset)
        if self.offsets is None:
            self.offsets = torch.zeros_like(self.pulled)
            self.offset_sum = torch.zeros_like(self._diff)
        self.offset_sum.add_(new).sub_(self.offsets[worker])
        self.offsets[worker].copy_(new)

    def clear_offset(self, worker: int) -> None:
        """A worker left: its rule's offset is gone (0)."""
        if self.offsets is not None:
            self.offset_sum.sub_(self.offsets[worker])
            self.offsets[worker].zero_()

    def state_dict(self) -> dict[str, Any]:
        return {
            "pulled_probes": _numpy(self.pulled),
            "offsets": _numpy(self.offsets),
            "offset_sum": _numpy(self.offset_sum),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pulled = torch.from_numpy(np.array(state["pulled_probes"]))
        if state["offsets"] is not None:
            self.offsets = torch.from_numpy(np.array(state["offsets"]))
            self.offset_sum = torch.from_numpy(np.array(state["offset_sum"]))


def _numpy(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy().copy()
