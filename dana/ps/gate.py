"""Bounded staleness on a server: the simulator's start and push gates, answered at once.

``--max-staleness s`` on Ray keeps the rule of :mod:`dana.sim.simulator` (module
docstring, "Bounded staleness"; docs/ALGORITHMS.md): no push is applied with a staleness
above ``s``. One server decides (shard 0, the only one with a gate; with several shards
it relays every push and pull to the others in its own order, see
:mod:`dana.ps.server`). The in-flight workers (pulled, not yet pushed; a worker taking
local steps stays in flight) are kept in the order of their pulls; ``U`` counts the
pushes applied and ``p_j`` is ``U`` at worker ``j``'s pull.

- start: a pull is served only while at most ``s`` workers are in flight, first come
  first served among the workers waiting to start (the simulator's idle queue): the
  ``n``-th waiter may start when at least ``n`` of the ``s + 1`` places are free;
- push: a push is applied only if every older in-flight worker ``j``, of rank ``r``,
  has ``U - p_j + r <= s``. The oldest in-flight worker is never held.

A refused call is answered at once (``"wait"``) and the worker asks again a moment
later: the server never waits, and a held push is not applied (nor its sequence number
taken) until a retry is allowed. Waits are timed here, from the first refusal to the
call that is allowed: ``wait_time`` (seconds, summed over workers) and ``waits``.

A worker process that joins (a start, a restart after a crash) drops its earlier
records: a dead in-flight worker holds the others only until Ray has restarted it, and
the driver :meth:`forget`s one that is gone for good.

    >>> gate = StalenessGate(bound=0)
    >>> gate.start(0, pushes=0, now=0.0), gate.start(1, pushes=0, now=0.0)  # one at a time
    (True, False)
    >>> gate.may_push(0, pushes=0, now=1.0)
    True
    >>> gate.pushed(0)
    >>> gate.start(0, pushes=1, now=2.0), gate.start(1, pushes=1, now=2.0)  # 1 came first
    (False, True)
    >>> gate.waits, gate.wait_time
    (1, 2.0)
"""

from __future__ import annotations

from typing import Any


class StalenessGate:
    """The two gates of bounded staleness ``bound`` and the records they need."""

    def __init__(self, bound: int):
        self.bound = bound
        self.inflight: list[int] = []  # pulled, not yet pushed: oldest pull first
        self.pulled: dict[int, int] = {}  # pushes applied at each in-flight worker's pull
        self.idle: list[tuple[int, float]] = []  # (worker, since): waiting to start
        self.held: dict[int, float] = {}  # worker -> since: its push is held
        self.waits = 0
        self.wait_time = 0.0
        self.held_starts = self.held_pushes = 0

    def start(self, worker: int, pushes: int, now: float) -> bool:
        """Start ``worker`` (it pulls now, after ``pushes`` pushes) if the start gate
        allows it; otherwise it waits in line from ``now`` on and False."""
        free = self.bound + 1 - len(self.inflight)
        for n, (w, since) in enumerate(self.idle):
            if w == worker:
                if n >= free:
                    return False
                del self.idle[n]
                self._waited(now - since)
                break
        else:
            if len(self.idle) >= free:
                self.idle.append((worker, now))
                self.held_starts += 1
                return False
        self.inflight.append(worker)
        self.pulled[worker] = pushes
        return True

    def may_push(self, worker: int, pushes: int, now: float) -> bool:
        """Whether applying ``worker``'s push now keeps the bound; if not, it is held."""
        for rank, j in enumerate(self.inflight, start=1):
            if j == worker:
                break
            if pushes - self.pulled[j] + rank > self.bound:
                if worker not in self.held:
                    self.held[worker] = now
                    self.held_pushes += 1
                return False
        since = self.held.pop(worker, None)
        if since is not None:
            self._waited(now - since)
        return True

    def pushed(self, worker: int) -> None:
        """``worker``'s push was applied: it is no longer in flight."""
        if worker in self.pulled:
            self.inflight.remove(worker)
            del self.pulled[worker]

    def forget(self, worker: int) -> None:
        """Drop every record of ``worker`` (it joins afresh, or is gone for good)."""
        self.pushed(worker)
        self.idle = [(w, t) for w, t in self.idle if w != worker]
        self.held.pop(worker, None)

    def counters(self) -> dict[str, Any]:
        return {
            "max_staleness": self.bound,
            "waits": self.waits,
            "wait_time": self.wait_time,
            "held_starts": self.held_starts,
            "held_pushes": self.held_pushes,
        }

    def _waited(self, seconds: float) -> None:
        self.waits += 1
        self.wait_time += max(seconds, 0.0)
