"""The driver's side of shard 0's standby: building it, and replacing it when it is gone.

The standby is a second :class:`~dana.ps.head.HeadServer` of shard 0, not yet promoted,
that runs every call its head passes on (:mod:`dana.ps.head`). The run starts one
(:meth:`Standby.start`); when the head is lost the driver promotes it
(:meth:`Standby.promote`), and when it is promoted or lost a new one is built in the
background (:meth:`Standby.replace`: from
the driver's latest snapshot of the standby, or shard 0's starting arguments before the
first), named ``NAME-1``, ``NAME-2``, ... after shard 0's ``NAME`` (the workers find a
promoted one by name). Once it is up, the head sends it its log
(:meth:`Standby.attach_coming`); the run goes on without one meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

from dana.ps.cluster import READY_SECONDS, ServerLost, server_options
from dana.ps.head import HeadServer


class Standby:
    """The standby of a :class:`~dana.ps.group.ShardGroup` (``group``): the actor in place
    (``actor``; None while a new one starts), the one starting (``coming``), how many
    were built (their names' numbers), the records of the promotions and of the
    standbys rebuilt."""

    def __init__(self, group: Any):
        self.group = group
        self.actor: Any = None
        self.coming: tuple[Any, Any, float, dict[str, Any] | None] | None = None
        self.built = 0
        self.promotions: list[dict[str, Any]] = []  # one record per lost head
        self.rebuilt: list[dict[str, Any]] = []

    def start(self) -> None:
        """The run's first standby, from shard 0's starting arguments."""
        self.actor = self._build(None)

    def promote(self, peers: list[Any], started: float) -> Any:
        """The head, lost at ``started``, is replaced by this standby, which has run every
        call the head passed on: it sends its log to the other shards (``peers``) and
        becomes the head (its actor, returned); then a new standby is started."""
        group = self.group
        if not group.with_standby:
            group.unsurvivable("shard 0 was lost, and this run has no standby (--no-standby)")
        if self.actor is None:
            group.unsurvivable("shard 0 was lost while its standby was being rebuilt")
        try:
            sent = group.reply(self.actor.promote.remote(peers))
        except ServerLost:
            group.unsurvivable("shard 0 and its standby were both lost")
        head, self.actor = self.actor, None
        self.promotions.append(
            {"steps": group.steps_now(), "resent_calls": sent, "seconds": time.time() - started}
        )
        self.replace()
        return head

    def replace(self) -> None:
        """Start a new standby (the last one was lost or promoted), from the group's latest
        snapshot of the standby; :meth:`attach_coming` attaches it once it is up."""
        if self.actor is not None:
            self.group.ray.kill(self.actor, no_restart=True)
        self.actor = None
        saved = self.group.recovery[0]
        actor = self._build(saved)
        self.coming = (actor, actor.ready.remote(), time.time(), saved)

    def ask(self, call: Any) -> Any:
        """The standby's reply to ``call(standby)``; None if there is none (a new one is on
        its way: attached here once it has started) or it was lost (a new one is
        started)."""
        if self.actor is None:
            self.attach_coming()
            return None
        try:
            return self.group.reply(call(self.actor))
        except ServerLost:
            self.replace()
            return None

    def attach_coming(self) -> None:
        """Attach the standby under way to the head (which sends it its log) once it has
        started."""
        if self.coming is None:
            return
        group, ray = self.group, self.group.ray
        actor, ready, started, saved = self.coming
        done, _ = ray.wait([ready], timeout=0)
        if not done:
            if time.time() - started > READY_SECONDS:
                group.unsurvivable(
                    f"shard 0's standby did not start within {READY_SECONDS:g} s (no room)"
                )
            return
        self.coming = None
        try:
            where = group.reply(ready)
        except (ServerLost, ray.exceptions.RayError) as e:
            group.unsurvivable(f"shard 0's standby could not be rebuilt ({e})")
        if saved is None:  # (built from the starting arguments: start its clock too)
            try:
                group.reply(actor.begin.remote(group.clock_zero))
            except ServerLost:  # (lost already: another one)
                ray.kill(actor, no_restart=True)
                self.replace()
                return
        try:
            covered = 0 if saved is None else saved["calls"]
            sent = group.reply(group.servers[0].attach_standby.remote(actor, covered))
        except ServerLost:  # the head too, before its new standby had anything
            group.unsurvivable("shard 0 was lost while its standby was rebuilt")
        except ray.exceptions.RayTaskError as e:  # (a log trimmed too far: never expected)
            group.unsurvivable(f"shard 0's standby could not be rebuilt ({e})")
        self.actor = actor
        self.rebuilt.append(
            {
                "steps": group.steps_now(),
                "snapshot_age": None if saved is None else started - saved["time"],
                "sent_calls": sent,
                "seconds": time.time() - started,
                "node": where,
            }
        )

    def kill(self) -> None:
        coming = [self.coming[0]] if self.coming is not None else []
        for actor in [self.actor, *coming]:
            if actor is not None:
                self.group.ray.kill(actor, no_restart=True)

    def _build(self, saved: dict[str, Any] | None) -> Any:
        """A standby actor of shard 0, from its snapshot ``saved`` (None: from shard 0's
        starting arguments)."""
        group = self.group
        args, kwargs = group.server_args[0]
        self.built += 1
        return (
            group.ray.remote(HeadServer)
            .options(name=f"{group.names[0]}-{self.built}", **server_options(group.cpus))
            .remote(*args, **kwargs, peers=group.names[1:] or None, standby=True, recovered=saved)
        )
