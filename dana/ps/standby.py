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
from collections.abc import Callable
from typing import Any, NoReturn

from dana.ps.cluster import READY_SECONDS, ServerLost


class Standby:
    """The standby of a :class:`~dana.ps.group.ShardGroup`: the actor in place (``actor``;
    None while a new one starts), the one starting (``coming``), how many were built
    (their names' numbers), the records of the promotions and of the standbys rebuilt;
    the driver's latest snapshot of it (``saved``) and the servers' clock
    (``clock_zero``), which the group sets.

    Args (the group's):
        ray: the ``ray`` module.
        build: a new standby actor, number ``n``, from a snapshot (None: from shard 0's
            starting arguments).
        head: the head's actor now.
        reply: a server's reply to a call (:meth:`~dana.ps.group.ShardGroup.reply`).
        fail: end the run, which cannot go on (:func:`~dana.ps.group.unsurvivable`).
        steps_now: the run's step count now (for the records).
    """

    def __init__(
        self,
        ray: Any,
        build: Callable[[int, dict[str, Any] | None], Any],
        head: Callable[[], Any],
        reply: Callable[[Any], Any],
        fail: Callable[[str], NoReturn],
        steps_now: Callable[[], int],
    ):
        self.ray, self.build, self.head = ray, build, head
        self.reply, self.fail, self.steps_now = reply, fail, steps_now
        self.actor: Any = None
        self.coming: tuple[Any, Any, float, dict[str, Any] | None] | None = None
        self.built = 0
        self.saved: dict[str, Any] | None = None
        self.clock_zero: float | None = None
        self.promotions: list[dict[str, Any]] = []  # one record per lost head
        self.rebuilt: list[dict[str, Any]] = []

    def start(self) -> None:
        """The run's first standby, from shard 0's starting arguments."""
        self.actor = self._build(None)

    def promote(self, peers: list[Any], started: float) -> Any:
        """The head, lost at ``started``, is replaced by this standby, which has run every
        call the head passed on: it sends its log to the other shards (``peers``) and
        becomes the head (its actor, returned); then a new standby is started."""
        if self.actor is None:
            self.fail("shard 0 was lost while its standby was being rebuilt")
        try:
            sent = self.reply(self.actor.promote.remote(peers))
        except ServerLost:
            self.fail("shard 0 and its standby were both lost")
        head, self.actor = self.actor, None
        self.promotions.append(
            {"steps": self.steps_now(), "resent_calls": sent, "seconds": time.time() - started}
        )
        self.replace()
        return head

    def replace(self) -> None:
        """Start a new standby (the last one was lost or promoted), from the latest
        snapshot of the standby; :meth:`attach_coming` attaches it once it is up."""
        if self.actor is not None:
            self.ray.kill(self.actor, no_restart=True)
        self.actor = None
        saved = self.saved
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
            return self.reply(call(self.actor))
        except ServerLost:
            self.replace()
            return None

    def attach_coming(self) -> None:
        """Attach the standby under way to the head (which sends it its log) once it has
        started."""
        if self.coming is None:
            return
        ray, fail = self.ray, self.fail
        actor, ready, started, saved = self.coming
        done, _ = ray.wait([ready], timeout=0)
        if not done:
            if time.time() - started > READY_SECONDS:
                fail(f"shard 0's standby did not start within {READY_SECONDS:g} s (no room)")
            return
        self.coming = None
        try:
            where = self.reply(ready)
        except (ServerLost, ray.exceptions.RayError) as e:
            fail(f"shard 0's standby could not be rebuilt ({e})")
        if saved is None:  # (built from the starting arguments: start its clock too)
            try:
                self.reply(actor.begin.remote(self.clock_zero))
            except ServerLost:  # (lost already: another one)
                ray.kill(actor, no_restart=True)
                self.replace()
                return
        try:
            covered = 0 if saved is None else saved["calls"]
            sent = self.reply(self.head().attach_standby.remote(actor, covered))
        except ServerLost:  # the head too, before its new standby had anything
            fail("shard 0 was lost while its standby was rebuilt")
        except ray.exceptions.RayTaskError as e:  # (a log trimmed too far: never expected)
            fail(f"shard 0's standby could not be rebuilt ({e})")
        self.actor = actor
        self.rebuilt.append(
            {
                "steps": self.steps_now(),
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
                self.ray.kill(actor, no_restart=True)

    def _build(self, saved: dict[str, Any] | None) -> Any:
        self.built += 1
        return self.build(self.built, saved)
