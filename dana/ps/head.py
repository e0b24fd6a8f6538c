"""Shard 0, the head: a shard that also orders the run, and its standby, a head in waiting.

A :class:`HeadServer` is a :class:`~dana.ps.shard.ShardServer` (the master rule on shard
0) with the head's job: the workers call it alone (:mod:`dana.ps.protocol`:
``relay_pull``, ``relay_push``, ``relay_exchange``, which carry the other shards' parts
of each push), and it

- decides (the **staleness gate**, bounded staleness): a pull the start gate refuses is
  answered ``"wait"`` (no parameters); a push the push gate holds is answered ``"wait"``
  and not applied, its sequence number not taken: the worker sends it again (the same
  ``seq``) a moment later. ``relay_exchange`` whose push is applied but whose pull must
  wait answers with the push's status and no parameters; the worker then pulls;
- **relays** (:mod:`dana.ps.relay`): once it has applied a push or served a pull it
  makes the same call, numbered, on its standby (waiting for it) and then on every
  other shard, sending each its part from its own copy. Ray runs the calls of one
  caller on an actor in the order they were made, so every shard applies the same
  pushes and serves the same pulls in the same order: its counts, and so its
  staleness, are the head's; and a push is applied on all shards or on none, also when
  its worker dies during the call. ``relay_pull`` and ``relay_exchange`` add to their
  reply the references of the other shards' replies, which the worker fetches directly
  (pulled parameters do not pass through shard 0). The head logs the calls it relays,
  so that the driver can rebuild a lost shard or standby (:mod:`dana.ps.recovery`;
  ``trim``, ``rebind``, ``attach_standby``, ``relay_counters``).

A **standby** (every Ray run, also with one shard, unless ``--no-standby``) is a second
head of shard 0 that has not been promoted: it answers workers'
calls with ``"not-head"``, and receives every call the head passes on, with every
shard's arguments, before anyone else and before the head answers (:meth:`replica`); it
runs shard 0's part exactly as the head did (its staleness gate follows the head's
decisions instead of making its own, and is told the head's waiting workers whenever
one starts waiting: :meth:`waiting`) and keeps the same log. When the head is lost the
driver promotes it (:meth:`promote`: it passes its log on to the other shards, each
skipping what it has run, and decides from then on), then gives it a new standby
(:meth:`attach_standby`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dana.ps.protocol import (
    Entry,
    HeadExchange,
    HeadPull,
    HeadPushed,
    Pulled,
    Push,
    Role,
    Status,
)
from dana.ps.relay import Deposed, Relay
from dana.ps.roles import HeadRole, StandbyRole
from dana.ps.shard import ShardServer
from dana.train.rules.gate import StalenessGate


class HeadServer(ShardServer):
    """Shard 0 and the head's job: the staleness gate, the relay, its standby. What it
    does in each role (``mode``: head, standby, deposed) is :mod:`dana.ps.roles`'s.

    Args (besides :class:`~dana.ps.shard.ShardServer`'s):
        bound: the staleness bound its gate keeps (None: no gate).
        timeout, log_bytes: its relay's wait for the standby (``--server-timeout``) and
            the bytes of its log held in memory (``--relay-log-bytes``).
        peers: the names of the other shards' actors, to which it relays every call
            (resolved by :meth:`begin`).
        standby: a standby of the head: it follows the head until promoted.
        replicated: the head of a run with a standby: log every call, also with one
            shard (False: ``--no-standby``).
    """

    def __init__(
        self,
        params: np.ndarray,
        *,
        bound: int | None,
        timeout: float | None,
        log_bytes: int,
        peers: list[str] | None = None,
        standby: bool = False,
        replicated: bool = False,
        recovered: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(params, **kwargs)
        self.gate = None if bound is None else StalenessGate(bound)
        self.relay = Relay(
            peers or [],
            self.k_max,
            replicated=standby or replicated,
            timeout=timeout,
            limit=log_bytes,
        )
        role = StandbyRole if standby else HeadRole
        self.mode: HeadRole | StandbyRole = role(self.gate, self.relay)
        if recovered is not None:
            self.load_recovery(recovered)

    @property
    def role(self) -> Role:
        return self.mode.role

    def begin(self, clock_zero: float) -> None:
        if self.mode.serves:
            self.relay.connect()
        super().begin(clock_zero)

    # -- a worker's calls, relayed --------------------------------------------------------
    def relay_pull(self, worker: int, join: bool = False) -> HeadPull:
        """:meth:`pull`, then the same pull on the standby and every other shard if it was
        served."""
        if not self.mode.serves:
            return HeadPull(Status.NOT_HEAD, None, math.nan, 0, 0, [])
        if not self.records.live[worker]:  # left, or not joined yet: not served
            return HeadPull(Status.GONE, None, math.nan, self.records.last_seq[worker], 0, [])
        reply = self.pull(worker, join)
        if reply.status is not Status.PARAMS:
            return HeadPull(*reply, [])
        self.relay.pull(worker, self.records.joins[worker])
        others = self._flush()
        if others is None:
            return HeadPull(Status.NOT_HEAD, None, math.nan, 0, 0, [])
        return HeadPull(*reply, others)

    def relay_push(self, parts: list[Push]) -> HeadPushed:
        """:meth:`push` of shard 0's part, then the same push on the standby and every
        other shard (its ``parts[s]``, copied) if it was taken; with the rate of the
        run's next step (a local step's worker takes its next one at it)."""
        if not self.mode.serves:
            return HeadPushed(Status.NOT_HEAD, math.nan)
        if not self.records.live[parts[0].worker]:
            return HeadPushed(Status.GONE, math.nan)
        status = self.push(parts[0])
        self._pass_on(status, parts)
        if self._flush() is None:
            return HeadPushed(Status.NOT_HEAD, math.nan)
        return HeadPushed(status, self.lr())

    def relay_exchange(self, parts: list[Push]) -> HeadExchange:
        """:meth:`exchange`, relayed."""
        if not self.mode.serves:
            return HeadExchange(Status.NOT_HEAD, None, math.nan, [])
        if not self.records.live[parts[0].worker]:
            return HeadExchange(Status.GONE, None, math.nan, [])
        status, params, lr = self.exchange(parts[0])
        self._pass_on(status, parts)
        if params is not None:
            self.relay.pull(parts[0].worker, self.records.joins[parts[0].worker])
        others = self._flush()
        if others is None:
            return HeadExchange(Status.NOT_HEAD, None, math.nan, [])
        return HeadExchange(status, params, lr, others if params is not None else [])

    def relay_member(self, worker: int, join: bool) -> HeadPushed:
        """Worker ``worker`` joins or leaves the run (:meth:`member`), then the same on the
        standby and every other shard, logged like a push (a rebuilt shard replays it)."""
        if not self.mode.serves:
            return HeadPushed(Status.NOT_HEAD, math.nan)
        status = self.member(worker, join)
        if status is Status.APPLIED:
            self.relay.member(worker, join)
            if self._flush() is None:
                return HeadPushed(Status.NOT_HEAD, math.nan)
        return HeadPushed(status, self.lr())

    def relay_admit(self, n: int) -> int:
        """Admit ``n`` more workers now (a request in the run directory), at the next
        indices, as many as there is room for: :meth:`relay_member` of each. How many
        indices are handed out now (the driver starts their actors); -1 if not the head."""
        if not self.mode.serves:
            return -1
        for _ in range(min(n, self.k_max - self.started)):
            if self.member(self.started, True) is Status.APPLIED:
                self.relay.member(self.started - 1, True)
        if self._flush() is None:
            return -1
        return self.started

    def member(self, worker: int, join: bool) -> Status:
        status = super().member(worker, join)
        if status is Status.APPLIED and not join and self.gate is not None:
            self.gate.forget(worker)  # its in-flight place freed, a held push dropped
        return status

    def _pass_on(self, status: Status, parts: list[Push]) -> None:
        if status in (Status.APPLIED, Status.LOCAL):
            self.relay.push(parts)

    def _flush(self) -> list[Any] | None:
        """Pass the calls made on (:meth:`~dana.ps.relay.Relay.flush`): the references of
        the other shards' replies to the last one; None if this head was deposed (its
        standby, promoted, refused them): it answers every worker ``"not-head"`` from
        then on, and its own state, ahead of the run's by this call, is never read."""
        try:
            others = self.relay.flush()[-1]
        except Deposed:
            self.mode = self.mode.deposed()
            return None
        if self.log_full is not None and self.mode.serves:
            self.stopped = True  # (no more calls taken: the driver ends the run, RelayLog)
        return others

    @property
    def log_full(self) -> str | None:
        """Why this server's relay log could not spill (its disk is full), or None."""
        return None if self.relay.log is None else self.relay.log.full

    # -- the gate -------------------------------------------------------------------------
    def pull(self, worker: int, join: bool = False) -> Pulled:
        if join and self.mode.serves:  # (a standby's joins were passed on already)
            self.relay.joined(worker)
        return super().pull(worker, join)

    def push(self, push: Push) -> Status:
        status = super().push(push)
        if status is Status.APPLIED and self.gate is not None:
            self.gate.pushed(push.worker)
        return status

    def _admit(self, worker: int, join: bool) -> bool:
        return self.gate is None or self.mode.admit(worker, join, self.pushes)

    def _may_push(self, worker: int, now: float) -> bool:
        return self.gate is None or self.mode.may_push(worker, self.pushes, now)

    def _waits(self) -> tuple[int, float]:
        waits, wait_time = super()._waits()
        if self.gate is None:
            return waits, wait_time
        return waits + self.gate.waits, wait_time + self.gate.wait_time

    # -- the standby ----------------------------------------------------------------------
    def replica(self, entries: list[Entry]) -> bool:
        """A standby: the head's calls, with every shard's arguments: log each, and run
        shard 0's part of those past this standby's count, as the head did. Refused
        (False) once promoted: they come from a head taken for lost that ran on, and no
        other shard may get them (its head passes a call on only once its standby took
        it, so every call it passed on before is in this log)."""
        if not self.mode.follows:
            return False
        for entry in entries:
            self.relay.record.take(entry)
            self.relay.log.append(entry)
            if entry.number > self.counts.calls:
                self.relayed(entry.call(0))
        return True

    def adopt(self, kept: list[int], entries: list[Entry]) -> None:
        """A new standby: the head's whole log (``kept``: what the driver's snapshots
        cover), then its calls from now on (:meth:`replica`)."""
        self.relay.log.kept = list(kept)
        self.replica(entries)

    def waiting(self, state: dict[str, Any]) -> None:
        """A standby: the workers its head's staleness gate holds now
        (:meth:`~dana.train.rules.gate.StalenessGate.waiting_state`), sent whenever one starts
        waiting, so that once promoted it keeps their places in line (once promoted, they
        come from a deposed head: ignored)."""
        if self.gate is not None and self.mode.follows:
            self.gate.load_waiting(state)

    def promote(self, peers: list[Any]) -> int:
        """The head was lost: this standby is the head now, ``peers`` the other shards.
        Sends them its log (each skips what it has); how many calls."""
        self.mode = self.mode.promoted()
        return self.relay.promote(peers)

    def attach_standby(self, actor: Any, covered: int = 0) -> int:
        """``actor``, rebuilt from a snapshot covering the calls up to ``covered``, is
        this head's standby now (sent the whole log, then the workers waiting for the
        staleness bound); how many calls."""
        sent = self.relay.attach(actor, covered)
        if self.gate is not None:
            self.relay.waiting(self.gate.waiting_state())
        return sent

    # -- the driver's calls ---------------------------------------------------------------
    def trim(self, shard: int, covered: int) -> None:
        """The driver holds a snapshot of receiver ``shard`` (0: the standby) covering the
        relayed calls up to ``covered``: drop the calls no receiver needs any more."""
        self.relay.trim(shard, covered)

    def rebind(self, shard: int, actor: Any, covered: int) -> int:
        """Shard ``shard`` is ``actor`` now, rebuilt from a snapshot covering the calls up
        to ``covered``: send it the calls since, then relay to it. How many were sent."""
        return self.relay.rebind(shard, actor, covered)

    def relay_counters(self) -> dict[str, int]:
        return self.relay.counters()

    def poll(self) -> dict[str, Any]:
        """:meth:`~dana.ps.shard.ShardServer.poll`, with the calls' record
        (:mod:`dana.ps.calls`) and :attr:`log_full`."""
        return {
            **super().poll(),
            "calls": self.relay.record.drain(),
            "log_full": self.log_full,
        }

    def stop(self) -> list[Any]:
        """Stop; also stop the standby and the other shards, after every call relayed to
        them (the references of the other shards' stops)."""
        self.halt()
        return self.relay.stop()

    def counters(self) -> dict[str, Any]:
        gate = {} if self.gate is None else self.gate.counters()
        return {**gate, **super().counters()}

    # -- state ----------------------------------------------------------------------------
    def recovery_state(self) -> dict[str, Any]:
        gate = None if self.gate is None else self.gate.state_dict()
        return {**super().recovery_state(), "gate": gate, "relay": self.relay.state_dict()}

    def load_recovery(self, saved: dict[str, Any]) -> None:
        super().load_recovery(saved)
        if self.gate is not None and saved["gate"] is not None:
            self.gate.load_state_dict(saved["gate"])
        self.relay.load_state_dict(saved["relay"])

    def _keeps_recovery(self) -> bool:
        return self.mode.follows  # (the head's own loss is its standby's job)
