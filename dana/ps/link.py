"""A worker's side of the protocol (:mod:`dana.ps.protocol`): its calls to the head.

Every call goes to shard 0 (the head) only, which makes it on its standby and the other
shards itself, in its own order (:mod:`dana.ps.head`): a push is split into the shards'
parts (:func:`~dana.ps.protocol.split`: contiguous slices of the message, numpy views,
which Ray copies into the call once), all of which go to the head with the call, and
the head sends each to its shard; the other shards' pull replies come back as
references this link fetches directly, and are joined into one flat vector (with one
shard, the reply itself, read-only, straight from Ray's object store: no copy). A push
is therefore applied on every shard or on none: the head takes it or not, and relays
what it takes from its own copies, even if this worker dies the moment after. (Parts
this worker had put in Ray's object store would be owned by it and die with it: the
push would then be applied on shard 0 only. Ray >= 2.56 no longer lets a process put an
object owned by another.)

The head can change: when shard 0 is lost, the driver promotes its standby (named
``NAME-1``, ``NAME-2``, ... after shard 0's ``NAME``). A call to a lost head, or a
reply it owned (``OwnerDiedError``), is sent again, with the same arguments and so the
same sequence number, to the lowest-numbered live one; a standby not promoted yet
answers ``"not-head"`` and is asked again a moment later. The new
head has run every call the lost one answered, so a push it applied already is
answered ``duplicate`` and not applied twice.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import ray
import torch
from torch import Tensor

from dana.ps.layout import Layout
from dana.ps.protocol import Push, Status, split

#: Seconds a worker waits before asking again after a shard was lost (while the driver
#: rebuilds it).
LOST_PAUSE = 0.05

#: Seconds a worker looks for a live head before it gives up (the driver ends the run
#: first when the head cannot be replaced).
HEAD_SECONDS = 300.0

#: How many standbys' names past the last head a worker tries.
NAMES_AHEAD = 4


def lost_errors() -> tuple[type, ...]:
    """A lost actor, or a lost object it owned or stored."""
    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


def head_name(base: str, n: int) -> str:
    """Shard 0's actor name (``n == 0``), or that of its ``n``-th standby."""
    return base if n == 0 else f"{base}-{n}"


def find_head(base: str, start: int = 0) -> tuple[int, Any]:
    """The lowest-numbered live actor among shard 0 and its standbys, from ``start``:
    ``(n, handle)``; waits while none is found."""
    deadline = time.time() + HEAD_SECONDS
    while True:
        for n in range(start, start + NAMES_AHEAD):
            try:
                return n, ray.get_actor(head_name(base, n))
            except ValueError:  # not (or no longer) there
                continue
        if time.time() > deadline:
            raise RuntimeError(f"no live shard 0 among {base} and its standbys")
        time.sleep(LOST_PAUSE)


warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

#: The statuses that end a worker's loop: the run is over, or the worker is not in it.
_OVER = (Status.STOP, Status.GONE)


class Reply(NamedTuple):
    """The servers' answer to a worker's call: the head's status; ``stop``: the run is
    over for this worker (the head, or another shard, said so); ``params``, ``lr``: the
    parameters pulled and their rate (``None``: none served); ``last_seq``, ``joins``
    (a pull): its last push applied and its joins so far."""

    status: Status
    stop: bool
    params: Tensor | None = None
    lr: float = math.nan
    last_seq: int = 0
    joins: int = 0


class ServerLink:
    """Worker ``worker``'s calls to the head, shard 0, whose actor is named ``head``
    (its promoted standbys: ``head-1``, ``head-2``, ...)."""

    def __init__(self, head: str, layout: Layout, worker: int, dtype: torch.dtype):
        self.base, self.layout, self.worker = head, layout, worker
        self.generation, self.head = find_head(head)
        self.buffer = torch.empty(layout.d, dtype=dtype) if layout.servers > 1 else None

    def pull(self, join: bool = False) -> Reply:
        """The parameters to compute at (``None`` unless the status is ``"params"``:
        ``"stop"`` once the run is over, ``"wait"`` while the staleness bound holds the
        worker)."""
        head = self._call(lambda actor: actor.relay_pull.remote(self.worker, join))
        stop = head.status in _OVER
        if head.status is not Status.PARAMS:
            return Reply(head.status, stop, None, head.lr, head.last_seq, head.joins)
        # The head decides which pushes are applied (the others apply what it relays):
        # its last seq is the worker's on every shard.
        others = self._replies(head.others)
        if others is None:  # a shard was lost: pull again once it is rebuilt
            return Reply(Status.WAIT, False, None, head.lr, head.last_seq, head.joins)
        if any(r.status is Status.STOP for r in others):
            return Reply(Status.STOP, True, None, head.lr, head.last_seq, head.joins)
        params = self._join([head.params, *(r.params for r in others)])
        return Reply(Status.PARAMS, False, params, head.lr, head.last_seq, head.joins)

    def push(self, push: Push) -> Reply:
        """Push (``push``: the worker's, over the whole vector) to every shard."""
        parts = split(push, self.layout)
        head = self._call(lambda actor: actor.relay_push.remote(parts))
        return Reply(head.status, head.status in _OVER, lr=head.lr)

    def member(self, join: bool) -> Status:
        """Tell the run that this worker leaves it (``join`` false) or joins it again
        (its master rule's ``leave``/``join``, on every shard): ``"applied"``, or
        ``"duplicate"`` if it already was so."""
        return self._call(lambda actor: actor.relay_member.remote(self.worker, join)).status

    def exchange(self, push: Push) -> Reply:
        """Push and pull in one round trip.

        No parameters: the run is over (``stop``, or this was its last push), or the
        push was held or the pull must wait (bounded staleness).
        """
        parts = split(push, self.layout)
        head = self._call(lambda actor: actor.relay_exchange.remote(parts))
        stop = head.status in _OVER
        if head.params is None:
            return Reply(head.status, stop, None, head.lr)
        others = self._replies(head.others)
        if others is None:  # a shard was lost: the worker pulls on its own
            return Reply(head.status, stop, None, head.lr)
        if any(r.status is not Status.PARAMS for r in others):
            return Reply(head.status, True, None, head.lr)  # (another only refuses when stopped)
        params = self._join([head.params, *(r.params for r in others)])
        return Reply(head.status, stop, params, head.lr)

    def _replies(self, refs: list[Any]) -> list[Any] | None:
        """The other shards' replies; None if one of them was lost, or the head that owned
        the references (its pull is gone; pushes are not: the head replays them into the
        shard it rebuilds, a promoted standby has them)."""
        try:
            return ray.get(refs)
        except lost_errors():
            time.sleep(LOST_PAUSE)
            return None

    def _call(self, call: Callable[[Any], Any]) -> Any:
        """The head's reply to ``call(head)``; a lost head's call is made again on its
        promoted standby (the same arguments)."""
        while True:
            try:
                reply = ray.get(call(self.head))
            except lost_errors():
                self.generation, self.head = find_head(self.base, self.generation + 1)
                continue
            if reply.status is not Status.NOT_HEAD:
                return reply
            # A standby not promoted yet (or the head was only out of reach): look again
            # from shard 0 on, after a pause.
            time.sleep(LOST_PAUSE)
            self.generation, self.head = find_head(self.base, 0)

    def _join(self, pieces: list[Any]) -> Tensor:
        if self.buffer is None:
            return torch.from_numpy(pieces[0])
        for (lo, hi), piece in zip(self.layout.bounds, pieces):
            self.buffer[lo:hi].copy_(torch.from_numpy(piece))
        return self.buffer
