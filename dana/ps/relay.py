"""Shard 0's relay: the calls the head passes on to its standby and to the other shards.

The workers call only the head (shard 0, which alone keeps the staleness gate, if
any); once it has applied a push or served a pull it passes the same call on
(:mod:`dana.ps.head`):

1. to its **standby**, a replica of shard 0, with every shard's arguments, and waits
   for it to answer (so the standby has run, and logged, every call anyone else gets);
2. then to every other shard, its slice only. Ray runs the calls of one caller on an
   actor in the order they were made, so every shard applies the same pushes and serves
   the same pulls in the same order.

:class:`Relay` holds the receivers' actors and the joins still to pass on, numbers and
logs every call in a :class:`~dana.ps.recovery.RelayLog` (a push's slices copied, so
that they outlive the worker), and returns the other shards' pull replies as object
references (pulled parameters never pass through shard 0). From the log the driver
rebuilds a lost receiver (:meth:`rebind`, :meth:`attach`); a promoted standby passes its
own log on (:meth:`promote`).
"""

from __future__ import annotations

import sys
from typing import Any

from dana.ps.calls import CallRecord
from dana.ps.protocol import Entry, Member, Method, Pull, Push
from dana.ps.recovery import RELAY_LOG_BYTES, RelayLog

#: The count a missing standby's snapshot "covers" (``--no-standby``): every call, so
#: that the log is trimmed by the other shards' snapshots alone.
NO_STANDBY = sys.maxsize


class Relay:
    """The other shards of a run, by their actors' names (resolved by :meth:`connect`),
    and shard 0's standby (set by :meth:`attach`).

    ``replicated``: the run has a standby of shard 0 (not with ``--no-standby``): keep
    the log even with no other shard, with shard 0's own part of every call for the
    standby. Without one, the log (only with other shards) holds their parts alone and
    waits for no standby snapshot. ``timeout``: seconds to wait for the standby's answer
    (``--server-timeout``); a standby past it is lost, as a dead one is: killed, and
    rebuilt by the driver. ``limit``: the bytes its log holds in memory at most
    (``--relay-log-bytes``; beyond, calls go to disk: :class:`RelayLog`)."""

    def __init__(
        self,
        names: list[str],
        workers: int,
        replicated: bool = False,
        timeout: float | None = None,
        limit: int = RELAY_LOG_BYTES,
    ):
        self.names = list(names)
        self.others = len(self.names)  # the other shards: S - 1
        self.peers: list[Any] = []  # their actor handles, once connect() has run
        self.standby: Any = None
        self.replicated = replicated
        self.rejoined = [False] * workers  # a join to pass on with the worker's next pull
        self.log = RelayLog(len(self.names) + 1, limit) if self.names or replicated else None
        if self.log is not None and not replicated:
            self.log.kept[0] = NO_STANDBY  # (no standby snapshot to wait for)
        self.outbox: list[Entry] = []  # logged, not yet sent
        self.record = CallRecord()  # every call passed on, for dana replay (dana.ps.calls)
        self.standby_lost = 0  # times the standby did not answer
        self.timeout = timeout

    def connect(self) -> None:
        if self.names:
            import ray

            self.peers = [ray.get_actor(name) for name in self.names]

    def joined(self, worker: int) -> None:
        """``worker``'s process joined: its next relayed pull is a join."""
        self.rejoined[worker] = True

    def push(self, parts: list[Push]) -> None:
        """Log the push, ``parts[s]`` for receiver ``s`` (``parts[0]``: shard 0's own, for
        the standby), to :meth:`flush`."""
        args: list[Push | None] = []
        if self.log is not None:
            # Copies: the log keeps them after the worker's arguments are gone.
            own = parts[0].copy() if self.replicated else None  # (None: no standby to run it)
            args = [own, *(part.copy() for part in parts[1:])]
        self._add(Method.PUSH, args, parts[0])

    def pull(self, worker: int, incarnation: int = 0) -> None:
        """Log the same pull for the standby and every other shard, to :meth:`flush`
        (``incarnation``: the worker's joins so far, for the record)."""
        join, self.rejoined[worker] = self.rejoined[worker], False
        pull = Pull(worker, join, incarnation)
        self._add(Method.PULL, [pull] * (self.others + 1), pull)

    def member(self, worker: int, join: bool) -> None:
        """Log that ``worker`` joined or left, for the standby and every other shard, to
        :meth:`flush`."""
        member = Member(worker, join)
        self._add(Method.MEMBER, [member] * (self.others + 1), member)

    def stop(self) -> list[Any]:
        """Stop the standby and every other shard after the calls passed on to them (the
        references of the other shards' stops)."""
        self._add(Method.STOP, [None] * (self.others + 1), None)
        return self.flush()[-1]

    def flush(self) -> list[list[Any]]:
        """Pass the logged calls on: to the standby first, waiting for its answer, then to
        every other shard. Per call, the references of the other shards' replies.
        :class:`Deposed` (and nothing passed on) if the standby refused them."""
        entries, self.outbox = self.outbox, []
        if not entries:
            self.record.commit()  # (no receiver: nothing to wait for)
            return [[]]
        if self.standby is not None:
            import ray

            try:
                if not _wait(self.standby.replica.remote(entries), self.timeout):
                    self.record.discard()
                    raise Deposed("this head's standby was promoted in its place")
            except (
                ray.exceptions.RayActorError,
                ray.exceptions.ObjectLostError,
                ray.exceptions.GetTimeoutError,
            ):
                # Lost (or hung: killed for certain, so that it never runs on behind
                # this log): the driver builds a new one and this log fills it (attach).
                ray.kill(self.standby, no_restart=True)
                self.standby = None
                self.standby_lost += 1
        self.record.commit()
        return [
            [peer.relayed.remote(entry.call(s)) for s, peer in enumerate(self.peers, start=1)]
            for entry in entries
        ]

    def waiting(self, state: dict[str, Any]) -> None:
        """Pass the staleness gate's waiting workers on to the standby, not waited for:
        Ray runs the head's calls on the standby in the order they were made, so it gets
        them between the calls around them (a wait is no call to log or number: a
        standby that misses the last ones, with its head lost, has the worker wait at
        the back of the line when it asks again)."""
        if self.standby is not None:
            self.standby.waiting.remote(state)

    def _add(
        self,
        method: Method,
        args: list[Pull | Push | Member | None],
        subject: Pull | Push | Member | None,
    ) -> None:
        """Log a call (``subject``: its argument for the record) to :meth:`flush`; without
        a log (no receiver), number it for the record alone."""
        if self.log is None:
            number = self.record.count + len(self.record.pending) + 1
        else:
            entry = self.log.add(method, args)
            self.outbox.append(entry)
            number = entry.number
        self.record.note(number, method, subject)

    def trim(self, shard: int, covered: int) -> None:
        """The driver holds a snapshot of receiver ``shard`` (0: the standby) covering the
        calls up to ``covered``."""
        self.log.trim(shard, covered)

    def rebind(self, shard: int, actor: Any, covered: int) -> int:
        """Shard ``shard`` is ``actor`` now, rebuilt from a snapshot covering the calls up
        to ``covered``: send it the calls since, then relay to it. How many were sent."""
        self.peers[shard - 1] = actor
        return self.log.replay(actor, shard, covered)

    def attach(self, actor: Any, covered: int = 0) -> int:
        """``actor`` is the standby now, rebuilt from a snapshot covering the calls up to
        ``covered``: send it the whole log (it logs every entry and runs those past its
        own count), then wait for it with every call. How many sent."""
        if covered < self.log.kept[0] or (
            self.log.calls and self.log.calls[0].number > covered + 1
        ):
            raise RuntimeError(f"the calls after {covered} are gone: no standby from there")
        # Waited for: a promotion must find the whole log there. In chunks: the log may
        # be larger than the memory it may take (part of it on disk).
        chunks = self.log.chunks()
        _wait(actor.adopt.remote(list(self.log.kept), next(chunks, [])), self.timeout)
        for chunk in chunks:
            _wait(actor.replica.remote(chunk), self.timeout)
        self.standby = actor
        return len(self.log.calls)

    def promote(self, peers: list[Any]) -> int:
        """This standby's shard is the head now; ``peers`` the other shards' actors: send
        each the whole log (each skips the calls it has run), then relay to them. How many
        calls each was sent."""
        self.peers = list(peers)
        self.standby = None
        for entry in self.log.entries():
            for s, peer in enumerate(self.peers, start=1):
                peer.relayed.remote(entry.call(s))
        return len(self.log.calls) if self.peers else 0

    def state_dict(self) -> dict[str, Any]:
        """The joins still to pass on (the log and the receivers are rebuilt otherwise)."""
        return {"rejoined": list(self.rejoined)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rejoined = [bool(j) for j in state["rejoined"]]

    def counters(self) -> dict[str, int]:
        if self.log is None:
            return {"relayed_calls": 0, "log_peak_calls": 0, "log_peak_bytes": 0}
        return {**self.log.counters(), "standby_lost": self.standby_lost}


class Deposed(Exception):
    """The standby refused the head's calls: it was promoted in the head's place (the
    driver took the head for lost, a reply past its deadline, while it ran on). The head
    must pass nothing on: every call it passed on before, its standby had run first."""


def _wait(reply: Any, timeout: float | None = None) -> Any:
    """An actor call's reply, waited for ``timeout`` s at most (a stand-in actor that ran
    the call directly, as in the unit tests, returns the reply itself)."""
    import ray

    return ray.get(reply, timeout=timeout) if isinstance(reply, ray.ObjectRef) else reply
