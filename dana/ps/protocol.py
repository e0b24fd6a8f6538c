"""What the workers and the shard servers say to each other: the one protocol.

Every argument and reply is a numpy array or a plain value (and, from the head, Ray
object references), wrapped in the small named types below; the statuses and roles are
``str`` enums, so that logs and ``dist.json`` show their plain values. (The driver's
calls, ``poll``, ``stop``, ``trim``, ..., are the servers' own methods,
:mod:`dana.ps.shard` and :mod:`dana.ps.head`, made by :mod:`dana.ps.group`.)

A worker calls the head (shard 0), which relays (:mod:`dana.ps.head`):

- ``relay_pull(worker, join) -> HeadPull``: the parameters to compute at, at the
  learning rate ``lr`` (``status`` :attr:`Status.PARAMS`), or no parameters:
  :attr:`Status.STOP` once the run is over, :attr:`Status.WAIT` while the staleness
  bound holds the worker, :attr:`Status.NOT_HEAD` from a standby not promoted yet or
  a deposed head. ``join`` marks the first pull of a worker process; the reply tells it
  the sequence number of its last push applied and how often it has joined. ``others``: the
  references of the other shards' :class:`Pulled` replies, which the worker fetches.
- ``relay_push(parts) -> HeadPushed``: one :class:`Push` per shard (:func:`split`), the
  head's first; :attr:`Status.APPLIED`, :attr:`Status.LOCAL` (a local step, counted),
  :attr:`Status.DUPLICATE` (a repeat, not applied again), :attr:`Status.STOP` (after
  the run's end), :attr:`Status.WAIT` (held: sent again later with the same ``seq``);
  and the rate of the run's next step, at which a worker taking local steps takes its
  next one (the simulator reads the schedule at every step, so the Ray worker does too).
- ``relay_exchange(parts) -> HeadExchange``: a push and then a pull, one round trip.
- ``relay_member(worker, join) -> HeadPushed``: worker ``worker`` left the run (``join``
  false: the master rule's ``leave(worker, lr)``) or joined it (``join(worker)``);
  :attr:`Status.APPLIED`, or :attr:`Status.DUPLICATE` when it was already so (a call
  sent again). Made by the driver (a worker gone for good, workers added) or by an
  emulated worker itself (its cluster's departures; :mod:`dana.ps.emulation`). The
  head answers every call of a worker that is not in the run :attr:`Status.GONE`.

The head passes every call it takes on to its standby and the other shards as a
numbered :class:`Call` (its log keeps them as :class:`Entry`, one argument per
receiver); a receiver runs it through :func:`apply`, the one place where a relayed call
meets a server's methods.

A push is one :class:`Push` record: the worker's message, its loss, its rule's
``theta_offset`` and the model's buffers. :func:`split` cuts it into the shards' parts;
with a codec (``--compress``, :mod:`dana.train.rules.codecs`) the worker encodes each shard's
part itself (its message is then a list of :class:`~dana.train.rules.codecs.Payload`, one per
shard, which :func:`split` hands out) and each shard decodes its own in ``push``
(:func:`message_tensor`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, NamedTuple

import numpy as np
import torch

from dana.ps.layout import Layout
from dana.train.rules.codecs import Payload, build_codec


class _Named(str, Enum):
    """A ``str`` enum that prints and serialises as its plain value."""

    __str__ = str.__str__
    __format__ = str.__format__


class Status(_Named):
    """A server's answer to a call."""

    APPLIED = "applied"  # the push was applied
    DUPLICATE = "duplicate"  # a push applied already (its seq is not new): not again
    LOCAL = "local"  # a local step (no message): counted, nothing applied
    STOP = "stop"  # the run is over: nothing applied or served
    PARAMS = "params"  # a pull served: the parameters come with it
    WAIT = "wait"  # bounded staleness: refused for now; ask again
    NOT_HEAD = "not-head"  # a standby not (yet) promoted, or a deposed head: ask again
    GONE = "gone"  # the worker is not in the run (it left, or has not joined): stop


class Role(_Named):
    """What a server actor is: the head (shard 0, which relays), a standby of the head
    (a head in waiting, until promoted), another shard, or a deposed head (one the driver
    took for lost, its standby promoted in its place, that was still running: it serves
    no one again)."""

    HEAD = "head"
    STANDBY = "standby"
    SHARD = "shard"
    DEPOSED = "deposed"


class Method(_Named):
    """A call the head relays."""

    PULL = "pull"
    PUSH = "push"
    STOP = "stop"
    MEMBER = "member"  # a worker left or joined (dana.ps.membership)


@dataclass(frozen=True)
class Push:
    """A worker's push (to one shard: its part of it).

    ``message``: the worker rule's message (``None``: a local step; with a codec, its
    :class:`~dana.train.rules.codecs.Payload`, or the whole push's list of them, one per
    shard, before :func:`split`); ``seq``: the push's
    number (each worker numbers its pushes 1, 2, 3, ...); ``loss``: at the computed
    batch; ``offset``: the rule's ``theta_offset(1.0)`` (the worker's whole vector, or a
    shard's probe coordinates of it: :func:`split`), to measure the gap against the
    true ``theta``; ``buffers``: the model's buffers (BatchNorm statistics);
    ``compute``: the seconds the worker spent on the step (its gradient and message,
    with the emulated step time's pad), without the exchange with the servers;
    ``batch``: the number of its batch in the worker's stream of this process (from 0;
    -1: not said), for :mod:`dana.ps.replay`."""

    worker: int
    seq: int
    message: np.ndarray | Payload | list[Payload] | None
    loss: float = math.nan
    offset: np.ndarray | None = None
    buffers: dict[str, np.ndarray] | None = None
    compute: float = math.nan
    batch: int = -1

    def copy(self) -> Push:
        """The same push owning its arrays (a log keeps it after the sender's are gone)."""
        message = self.message
        return replace(
            self,
            message=message.copy() if isinstance(message, Payload) else _copy(message),
            offset=_copy(self.offset),
            buffers=None
            if self.buffers is None
            else {k: _copy(v) for k, v in self.buffers.items()},
        )

    @property
    def nbytes(self) -> int:
        arrays = [self.message, self.offset, *(self.buffers or {}).values()]
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray | Payload))


def split(push: Push, layout: Layout) -> list[Push]:
    """Each shard's part of ``push`` (a worker's, over the whole vector): its slice of the
    message (a view) and the probe coordinates of its slice of the offset; the loss, the
    buffers and the step time go to shard 0 alone. A message encoded already (a list of
    payloads, one per shard) is handed out as it is."""
    message = push.message
    if isinstance(message, np.ndarray):
        message = layout.split(message)
    elif message is not None and len(message) != layout.servers:
        raise ValueError(f"a push of {len(message)} payloads to {layout.servers} shards")
    parts = []
    for s, (lo, hi) in enumerate(layout.bounds):
        offset = None if push.offset is None else push.offset[lo:hi][layout.probes[s]]
        parts.append(
            Push(
                push.worker,
                push.seq,
                None if message is None else message[s],
                push.loss if s == 0 else math.nan,
                offset,
                push.buffers if s == 0 else None,
                push.compute if s == 0 else math.nan,
                push.batch,
            )
        )
    return parts


@dataclass(frozen=True)
class Member:
    """Worker ``worker`` joins the run (``join``) or leaves it: the master rule's
    ``join(worker)`` or ``leave(worker, lr)`` (:mod:`dana.ps.membership`)."""

    worker: int
    join: bool


@dataclass(frozen=True)
class Pull:
    """A pull of ``worker``; ``join``: the first of its process (a start, a restart);
    ``incarnation``: the head's count of its joins (its process's stream seed)."""

    worker: int
    join: bool = False
    incarnation: int = 0


class Pulled(NamedTuple):
    """A shard's answer to a pull (``params`` only with :attr:`Status.PARAMS`)."""

    status: Status
    params: np.ndarray | None
    lr: float
    last_seq: int
    joins: int


class Exchanged(NamedTuple):
    """A shard's answer to an exchange: the push's status and the pull's parameters
    (``None``: the run is over, the push was held, or the pull must wait)."""

    status: Status
    params: np.ndarray | None
    lr: float


class HeadPull(NamedTuple):
    """The head's answer to a worker's pull: shard 0's and the references of the other
    shards' :class:`Pulled` (empty unless the pull was served)."""

    status: Status
    params: np.ndarray | None
    lr: float
    last_seq: int
    joins: int
    others: list[Any]


class HeadPushed(NamedTuple):
    """The head's answer to a worker's push: its status and the rate of the run's next
    step (``NaN`` from a standby not promoted yet)."""

    status: Status
    lr: float


class HeadExchange(NamedTuple):
    """The head's answer to a worker's exchange: shard 0's and the references of the
    other shards' :class:`Pulled` (empty unless the pull was served)."""

    status: Status
    params: np.ndarray | None
    lr: float
    others: list[Any]


class Call(NamedTuple):
    """A relayed call as one receiver runs it: its ``number`` in the head's order,
    ``method`` and argument (a :class:`Pull`, a :class:`Push`, a :class:`Member`;
    ``None`` for a stop)."""

    number: int
    method: Method
    arg: Pull | Push | Member | None


class Entry(NamedTuple):
    """A relayed call in the head's log: ``args[s]`` is receiver ``s``'s argument
    (``args[0]``: the standby's, shard 0's own; ``None`` where there is none)."""

    number: int
    method: Method
    args: list[Pull | Push | Member | None]

    def call(self, receiver: int) -> Call:
        return Call(self.number, self.method, self.args[receiver])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.args if isinstance(a, Push))


def apply(server: Any, call: Call) -> Any:
    """Run relayed ``call`` on ``server`` (a :class:`~dana.ps.shard.ShardServer`): its
    reply."""
    if call.method is Method.PULL:
        return server.pull(call.arg.worker, call.arg.join)
    if call.method is Method.PUSH:
        return server.push(call.arg)
    if call.method is Method.MEMBER:
        return server.member(call.arg.worker, call.arg.join)
    return server.halt()


def message_tensor(message: np.ndarray | Payload, out: torch.Tensor | None = None) -> torch.Tensor:
    """A shard's part of a message as the master rule takes it: decoded if encoded (into
    ``out`` if given)."""
    if isinstance(message, Payload):
        return build_codec(message.codec).decode(message, out)
    return torch.from_numpy(message)


def _copy(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.array(array)
