"""Shard 0's roles: what its actor does as the head, as a standby and once deposed.

A :class:`~dana.ps.head.HeadServer` plays one role at a time, each a class here, and
passes from one to the next only thus::

    StandbyRole --promoted()--> HeadRole --deposed()--> DeposedRole

- a **standby** answers no worker; it takes its head's calls and waiting workers
  (``replica``, ``waiting``: it *follows*), lets its staleness gate follow the head's
  decisions, and its polls carry the snapshots a new standby is built from. The driver
  promotes it when its head is lost;
- the **head** *serves*: it answers the workers, relays their calls, and its staleness
  gate decides, telling its standby whenever a worker starts waiting;
- a **deposed** head was taken for lost while it ran on (its standby, promoted, refused
  its calls): it answers every worker ``"not-head"`` from then on.
"""

from __future__ import annotations

import time

from dana.ps.protocol import Role
from dana.ps.relay import Relay
from dana.train.rules.gate import StalenessGate


class _ShardZero:
    """A role of shard 0's actor, over its staleness gate (``gate``: asked only if there
    is one) and its relay."""

    role: Role
    serves = False  # answers the workers' calls and relays them (the head)
    follows = False  # takes its head's calls and waiting workers (a standby)

    def __init__(self, gate: StalenessGate | None, relay: Relay):
        self.gate, self.relay = gate, relay


class HeadRole(_ShardZero):
    """The head: it serves the workers, and its staleness gate decides."""

    role = Role.HEAD
    serves = True

    def admit(self, worker: int, join: bool, pushes: int) -> bool:
        """The start gate: whether ``worker`` may pull now (its start recorded if so); one
        that starts waiting is passed on to the standby."""
        gate = self.gate
        if join:  # a new process: its earlier incarnation's records go
            gate.forget(worker)
        else:  # (a worker pulls while in flight only to start its step again)
            gate.pushed(worker)
        queued = any(w == worker for w, _ in gate.idle)
        if gate.start(worker, pushes, time.time()):
            return True
        if not queued:
            self.relay.waiting(gate.waiting_state())
        return False

    def may_push(self, worker: int, pushes: int, now: float) -> bool:
        """The push gate: whether ``worker``'s push may be applied now; a push held for
        the first time is passed on to the standby."""
        held = worker in self.gate.held
        if self.gate.may_push(worker, pushes, now):
            return True
        if not held:
            self.relay.waiting(self.gate.waiting_state())
        return False

    def deposed(self) -> DeposedRole:
        return DeposedRole(self.gate, self.relay)


class DeposedRole(HeadRole):
    """A head taken for lost that ran on: it serves no one again (its state, ahead of the
    run's by the call its standby refused, is never read)."""

    role = Role.DEPOSED
    serves = False


class StandbyRole(_ShardZero):
    """A standby: it follows its head, whose gate decided every call it runs."""

    role = Role.STANDBY
    follows = True

    def admit(self, worker: int, join: bool, pushes: int) -> bool:
        self.gate.admit(worker, pushes, join, time.time())  # its head admitted it
        return True

    def may_push(self, worker: int, pushes: int, now: float) -> bool:
        self.gate.resume(worker, now)  # its head applied it
        return True

    def promoted(self) -> HeadRole:
        return HeadRole(self.gate, self.relay)
