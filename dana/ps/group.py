"""The driver's shard group: it starts, watches, promotes and rebuilds the server actors.

A run's servers are ``S`` shard actors (shard 0, the head, a
:class:`~dana.ps.head.HeadServer` on the driver's node; the others
:class:`~dana.ps.shard.ShardServer` s) and, unless ``--no-standby``, a standby of the
head. :class:`ShardGroup` holds them and keeps them whole (:mod:`dana.ps.recovery`):

- a lost shard ``s >= 1`` is rebuilt from the driver's latest snapshot of it and the
  head's log of the calls since (:meth:`ShardGroup.rebuild`);
- a lost head is replaced by its standby, promoted (:meth:`ShardGroup.promote`), and a
  new standby is built in the background, attached once it is up; a lost standby is
  replaced the same way;
- the loss of the head and its standby together, of the head of a run without a
  standby, or of a server while the run starts that no standby can stand in for, ends
  the run with :class:`~dana.errors.FaultError` (exit status 4: ``--resume``).

The standby's own life (built, replaced, attached) is :class:`~dana.ps.standby.Standby`'s.

Every reply of a server is waited for in one place, :meth:`ShardGroup.reply`, which
turns a lost server (its death, or the loss of a reply it owned or stored:
``OwnerDiedError``, ``ObjectReconstructionFailedError``, a lost node's replies) into
:class:`~dana.ps.cluster.ServerLost`; the calls are explicit (``lambda server:
server.poll.remote()``), and :meth:`ShardGroup.each` and :meth:`ShardGroup.on_head`
repair what was lost and go on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, NoReturn

from dana.errors import DanaError, FaultError
from dana.ps.accounting import ServerCounters
from dana.ps.cluster import READY_SECONDS, ServerLost, server_options
from dana.ps.head import HeadServer
from dana.ps.settings import ServerArgs
from dana.ps.shard import ShardServer
from dana.ps.standby import Standby
from dana.train.records import preempt
from dana.train.records.rundir import RunDir

#: Seconds between two looks of the driver at the servers.
POLL_SECONDS = 0.2


class ShardGroup:
    """The run's server actors: ``servers[s]`` (``servers[0]``, the head) and the head's
    standby (``spare``).

    Args:
        ray: the ``ray`` module.
        run: the run directory (its checkpoint and path name the way on after a fault).
        server_args: per shard, what its server is built from (again when a lost one is
            rebuilt, and the standby from shard 0's).
        standby: whether the head has a standby (False: ``--no-standby``).
        cpus: logical CPUs per actor.
        workers: the run's workers (for messages).
        steps_now: the run's step count now (for the records of faults).
        timeout: seconds to wait for a running server's reply (``--server-timeout``):
            one past it is lost, as a dead one is.
    """

    def __init__(
        self,
        ray: Any,
        run: RunDir,
        server_args: list[ServerArgs],
        *,
        standby: bool,
        cpus: float,
        workers: int,
        steps_now: Callable[[], int],
        timeout: float = 60.0,
    ):
        self.ray, self.run, self.server_args = ray, run, server_args
        self.S, self.with_standby, self.cpus = len(server_args), standby, cpus
        self.workers, self.steps_now, self.timeout = workers, steps_now, timeout
        self.prefix = f"dana-{uuid.uuid4().hex[:12]}"
        self.names = [f"{self.prefix}-shard{s}" for s in range(self.S)]
        self.servers: list[Any] = []
        self.fail = partial(unsurvivable, run)  # (raises FaultError)
        self.spare = Standby(
            ray, self._standby, lambda: self.servers[0], self.reply, self.fail, steps_now
        )
        self.recovery: dict[int, dict[str, Any]] = {}  # shard s >= 1's latest snapshot
        self.placement: dict[str, dict[str, str]] = {}  # actor -> its node
        self.rebuilt: list[dict[str, Any]] = []  # one record per shard rebuilt
        self.log_full: str | None = None  # a relay log's full disk, as the last poll found

    @property
    def standby(self) -> Any:
        """The standby's actor (None: none, or a new one is starting)."""
        return self.spare.actor

    # -- starting -----------------------------------------------------------------------
    def create(self) -> None:
        """Create the server actors (they start meanwhile: :meth:`start`)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Shard 0 orders the run and keeps the log to rebuild the others: on the driver's
        # node, whose loss would end the run anyway.
        node = self.ray.get_runtime_context().get_node_id()
        here = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True)}
        self.servers = [self._actor(0, self.names[0], here, replicated=self.with_standby)]
        self.servers += [self._actor(s, self.names[s]) for s in range(1, self.S)]
        if self.with_standby:
            self.spare.start()

    def start(self, deadline: float) -> None:
        """Wait for the servers to start; the ones lost meanwhile are replaced
        (:meth:`_lost_at_start`)."""
        ready = {f"shard{s}": server.ready.remote() for s, server in enumerate(self.servers)}
        if self.standby is not None:
            ready["standby"] = self.standby.ready.remote()
        self._lost_at_start(self.wait_ready(ready, deadline))

    def attach_standby(self) -> None:
        """Attach the first standby to the head (once every actor has started)."""
        if self.standby is None:
            return
        try:
            self.reply(self.servers[0].attach_standby.remote(self.standby))
        except ServerLost:  # (the head's error, or the standby's it passed on)
            self._lost_at_start([n for n in ("shard0", "standby") if not self.alive(n)])

    def wait_ready(self, ready: dict[str, Any], deadline: float) -> list[str]:
        """Wait for actors' ``ready`` replies (by name: servers', then workers') and note
        where each started; the servers lost as they started (killed, their process or
        node lost). DanaError if one's constructor raised, a worker was lost, or they are
        not all up by ``deadline``; :class:`~dana.errors.Preempted` at a signal meanwhile
        (:func:`~dana.train.records.preempt.preempted_at_start`)."""
        ray, done = self.ray, []
        while len(done) < len(ready) and time.time() < deadline:
            if preempt.requested():
                raise preempt.preempted_at_start(str(self.run.path), self.run.checkpoint.is_file())
            timeout = min(POLL_SECONDS, max(0.0, deadline - time.time()))
            done, _ = ray.wait(list(ready.values()), num_returns=len(ready), timeout=timeout)
        if len(done) < len(ready):
            raise DanaError(
                f"the run's {self.S + int(self.with_standby) + self.workers} Ray actors "
                f"({self.S} server shards{' and a standby' if self.with_standby else ''}, "
                f"{self.workers} workers, "
                f"{self.cpus:.3g} CPU each) did not all start within {READY_SECONDS:g} s; "
                f"the cluster has {ray.available_resources()} free of "
                f"{ray.cluster_resources()}: free CPUs (other jobs may hold them) or use "
                "fewer --workers"
            )
        lost = []
        for name, ref in ready.items():
            try:
                self.placement[name] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                if name.startswith("worker") or e.actor_init_failed:  # (its __init__ raised)
                    raise DanaError(f"the Ray actors could not start: {e}") from None
                lost.append(name)
            except ray.exceptions.RayError as e:
                raise DanaError(f"the Ray actors could not start: {e}") from None
        return lost

    def begin(self, clock_zero: float) -> None:
        """Start every server's clock (log times count from ``clock_zero``); a server lost
        meanwhile is handled as at the start (:meth:`_lost_at_start`), and the others
        are started again (a second ``begin`` changes nothing)."""
        self.spare.clock_zero = clock_zero
        while True:
            actors = {f"shard{s}": server for s, server in enumerate(self.servers)}
            if self.standby is not None:
                actors["standby"] = self.standby
            refs = {name: a.begin.remote(clock_zero) for name, a in actors.items()}
            lost: list[str] = []
            for name, ref in refs.items():
                try:
                    self.reply(ref)
                except ServerLost:
                    lost.append(name)
                except self.ray.exceptions.RayTaskError:  # (the head found a lost shard gone)
                    dead = [n for n in actors if n not in lost and not self.alive(n)]
                    if not dead:
                        raise
                    lost += dead
            if not lost:
                return
            self._lost_at_start(lost)

    def alive(self, name: str) -> bool:
        """Whether server ``name`` (``shardS``, ``standby``) answers."""
        actor = self.standby if name == "standby" else self.servers[int(name[5:])]
        try:
            self.reply(actor.ready.remote())
            return True
        except ServerLost:
            return False

    def _lost_at_start(self, lost: list[str]) -> None:
        """Servers lost while the run started (before any worker's call): a lost shard 0
        is replaced by its standby as at any other time (:meth:`promote`: it has run the
        same nothing), a lost standby rebuilt; without a standby, or with another shard
        lost, the run cannot go on (exit status 4)."""
        for name in lost:
            self.placement.pop(name, None)
        others = [name for name in lost if name not in ("shard0", "standby")]
        if others:
            self.fail(f"parameter-server shard {others[0][5:]} was lost while the run started")
        if "shard0" in lost:
            if not self.with_standby:
                self.fail(
                    "shard 0 was lost while the run started, and this run has no standby "
                    "(--no-standby)"
                )
            if "standby" in lost:
                self.fail("shard 0 and its standby were both lost while the run started")
            where = self.placement.pop("standby", None)
            self.promote()
            if where is not None:
                self.placement["shard0"] = where
        elif "standby" in lost:
            self.placement.pop("standby", None)
            self.spare.replace()

    def _actor(self, s: int, name: str, options: dict[str, Any] | None = None, **more: Any) -> Any:
        """A new actor of shard ``s`` named ``name`` (``options``: Ray's, over
        :func:`~dana.ps.cluster.server_options`), from its starting arguments and ``more``."""
        args, kwargs = self.server_args[s]
        if s == 0:  # (a HeadServer: it relays to the other shards)
            more["peers"] = self.names[1:] or None
        options = {**server_options(self.cpus), **(options or {})}
        actor = self.ray.remote(HeadServer if s == 0 else ShardServer).options(name=name, **options)
        return actor.remote(*args, **kwargs, **more)

    def _standby(self, number: int, saved: dict[str, Any] | None) -> Any:
        """A standby of shard 0 named after it, from its snapshot ``saved`` (None: from
        shard 0's starting arguments)."""
        return self._actor(0, f"{self.names[0]}-{number}", standby=True, recovered=saved)

    # -- calls ----------------------------------------------------------------------------
    def reply(self, ref: Any, timeout: float | None = None) -> Any:
        """A server's reply (``ref``: its call's); :class:`~dana.ps.cluster.ServerLost` if
        the server, or the node holding the reply, is gone, or no reply came within
        ``timeout`` s (default: the run's ``--server-timeout``: a hung or paused server
        is lost; the caller kills it for certain before replacing it). (Every reply of
        a server is waited for here.)"""
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.timeout if timeout is None else timeout)
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.GetTimeoutError,
        ) as e:
            raise ServerLost(str(e)) from e

    def each(self, call: Callable[[Any], Any]) -> list[Any]:
        """Every shard's reply to ``call(server)`` (None from a shard just rebuilt, whose
        replayed calls may not have run yet, or from a head just replaced by its
        standby); a lost shard ``s >= 1`` is rebuilt, a lost head replaced."""
        refs = [call(server) for server in self.servers]
        replies: list[Any] = []
        for s, ref in enumerate(refs):
            try:
                replies.append(self.reply(ref))
            except ServerLost:
                if s == 0:
                    self.promote()
                else:
                    self.rebuild(s)
                replies.append(None)
        return replies

    def on_head(self, call: Callable[[Any], Any]) -> Any:
        """The head's reply to ``call(head)``; a lost head is replaced by its standby,
        which is asked in its place."""
        while True:
            try:
                return self.reply(call(self.servers[0]))
            except ServerLost:
                self.promote()

    # -- the run's calls ------------------------------------------------------------------
    def poll(self) -> list[dict[str, Any] | None]:
        """Every shard's poll reply (None: lost, or just rebuilt; a lost head's: its
        standby's), and the recovery snapshots they carry kept."""
        # The standby first: what it has run, the head had run before (it waits for the
        # standby); so its log entries and snapshots are dropped, unless the head was
        # lost before its reply, when they stand for the head's (the merger drops repeats).
        spare = self.spare.ask(lambda standby: standby.poll.remote())
        self.standby_calls = None if spare is None else spare["calls"]  # (dana.ps.calls)
        if spare is not None and spare["recovery"] is not None:
            # (kept before a promotion below: the new standby is built from it)
            self._keep_snapshot(0, spare["recovery"])
        replies = self.each(lambda server: server.poll.remote())
        if replies[0] is None:
            replies[0] = spare
        # (the head's or the standby's relay log that found its disk full: the run ends)
        self.log_full = next(
            (r["log_full"] for r in (replies[0], spare) if r and r["log_full"]), None
        )
        for s, reply in enumerate(replies[1:], start=1):
            if reply is not None and reply["recovery"] is not None:
                self._keep_snapshot(s, reply["recovery"])
        return replies

    def _keep_snapshot(self, s: int, saved: dict[str, Any]) -> None:
        """Receiver ``s``'s (0: the standby's) latest snapshot: the head and the standby
        drop the calls it covers."""
        if s == 0:
            self.spare.saved = saved
        else:
            self.recovery[s] = saved
        for server in (self.servers[0], self.standby):
            if server is not None:
                server.trim.remote(s, saved["calls"])

    def stop(self) -> None:
        """Stop every shard (the head stops its standby and the others after what it
        relayed; a lost head's standby is promoted and stopped)."""
        for ref in self.on_head(lambda head: head.stop.remote()):
            try:
                self.reply(ref)
            except ServerLost:  # the stop is in the log: replayed to whoever lacks it
                self.each(lambda server: server.ready.remote())  # rebuilds or promotes

    def settle(self, timeout: float = READY_SECONDS) -> None:
        """Wait until the standby and every shard have run every call the head relayed to
        them (a rebuilt one runs the replayed ones first), so that the last poll has
        everything."""
        deadline = time.time() + timeout
        while True:
            count = self.relay_counters()["relayed_calls"]
            shards = self.each(lambda server: server.counters.remote())[1:]
            if self.standby is not None:  # (one still starting is not waited for)
                shards.append(self.spare.ask(lambda standby: standby.counters.remote()))
            if all(c is not None and c["calls"] == count for c in shards):
                return
            if time.time() > deadline:
                ran = [None if c is None else c["calls"] for c in shards]
                raise FaultError(
                    f"the server shards did not all run the {count} calls shard 0 relayed "
                    f"within {timeout:g} s (shards 1.., then the standby, ran {ran}); "
                    "continue from the last checkpoint with "
                    f"`dana train --resume {self.run.path}`"
                )
            time.sleep(POLL_SECONDS / 4)

    def relay_counters(self) -> dict[str, int]:
        return self.on_head(lambda head: head.relay_counters.remote())

    def counters(self) -> ServerCounters:
        """The end of the run: every shard's counters, the head's relay's and the
        standby's (None: none), with where each actor started and the repairs made."""
        shards = self.each(lambda server: server.counters.remote())
        while None in shards:  # a shard lost at the very end: rebuilt, asked again
            self.settle()
            shards = self.each(lambda server: server.counters.remote())
        relay, spare = self.relay_counters(), self.spare
        standby = None if self.standby is None else spare.ask(lambda a: a.counters.remote())
        return ServerCounters(
            shards, relay, standby, self.placement, self.rebuilt, spare.promotions, spare.rebuilt
        )

    def kill(self) -> None:
        for actor in self.servers:
            self.ray.kill(actor, no_restart=True)
        self.spare.kill()

    # -- faults ---------------------------------------------------------------------------
    def promote(self) -> None:
        """The head (shard 0) was lost: its standby, which has run every call the head
        passed on, becomes the head (:meth:`~dana.ps.standby.Standby.promote`)."""
        started = time.time()
        self.ray.kill(self.servers[0], no_restart=True)  # (a lost reply need not mean death)
        if not self.with_standby:
            self.fail("shard 0 was lost, and this run has no standby (--no-standby)")
        self.servers[0] = self.spare.promote(self.servers[1:], started)

    def rebuild(self, s: int) -> None:
        """Rebuild lost shard ``s >= 1`` from its latest snapshot and the head's log of the
        calls since (:mod:`dana.ps.recovery`); the run goes on meanwhile."""
        started = time.time()
        saved = self.recovery.get(s)
        name = f"{self.prefix}-shard{s}-rebuilt{len(self.rebuilt) + 1}"
        self.ray.kill(self.servers[s], no_restart=True)  # (a lost reply need not mean death)
        actor = self._actor(s, name, recovered=saved)
        covered = 0 if saved is None else saved["calls"]
        try:
            where = self.reply(actor.ready.remote(), timeout=READY_SECONDS)
        except (ServerLost, self.ray.exceptions.RayError) as e:
            self.fail(f"parameter-server shard {s} was lost and could not be rebuilt ({e})")
        # (a lost head's standby, promoted, relays to the old shard s: rebind it again)
        replayed = self.on_head(lambda head: head.rebind.remote(s, actor, covered))
        self.servers[s] = actor
        self.rebuilt.append(
            {
                "shard": s,
                "steps": self.steps_now(),
                "snapshot_age": None if saved is None else started - saved["time"],
                "replayed_calls": replayed,
                "seconds": time.time() - started,
                "node": where,
            }
        )


def unsurvivable(run: RunDir, what: str) -> NoReturn:
    """End ``run`` with :class:`~dana.errors.FaultError`: ``what`` happened, and it cannot
    go on (``--resume`` from its checkpoint, if it has one)."""
    where = (
        "continue from the last checkpoint with"
        if run.checkpoint.exists()
        else "it has no checkpoint yet: start it again from the beginning with"
    )
    raise FaultError(
        f"{what}: the run cannot go on; {where} `dana train --resume {run.path}`"
    ) from None
