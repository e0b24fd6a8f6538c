"""A worker's side of the protocol: every call goes to all ``S`` shard servers at once.

A pull asks every shard concurrently and joins the replies into one flat vector (with one
shard, the reply itself, read-only, straight from Ray's object store: no copy). A push
splits the message into the shards' contiguous slices (numpy views; Ray copies each into
its object store once) and sends them concurrently. See :mod:`dana.ps.server` for the
calls and their replies.

With ``relay`` (always, when ``S > 1``) every call goes to shard 0 only, which makes it
on the other shards itself, in its own order: the other shards' slices go to shard 0
with the call, and shard 0 sends each to its shard; their pull replies come back as
references this link fetches directly. A push is therefore applied on every shard or
on none: shard 0 takes it or not, and relays what it takes from its own copies, even
if this worker dies the moment after. (Slices this worker had put in Ray's object store
would be owned by it and die with it: the push would then be applied on shard 0 only.
Ray >= 2.56 no longer lets a process put an object owned by another.)

The head can change: when shard 0 is lost, the driver promotes its standby (named
``NAME-1``, ``NAME-2``, ... after shard 0's ``NAME``). A call to a lost head, or a
reply it owned (``OwnerDiedError``), is sent again, with the same arguments and so the
same sequence number, to the lowest-numbered live one; a standby not promoted yet
answers :data:`~dana.ps.server.NOT_HEAD` and is asked again a moment later. The new
head has run every call the lost one answered, so a push it applied already is
answered ``duplicate`` and not applied twice.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import ray
import torch
from torch import Tensor

from dana.ps.layout import Layout
from dana.ps.server import NOT_HEAD, PARAMS, STOP, WAIT

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


class ServerLink:
    """``servers``: the shards' actors; ``relay``: call shard 0 only, which relays;
    ``head``: shard 0's actor name, to find its promoted standby when it is lost."""

    def __init__(
        self,
        servers: list[Any],
        layout: Layout,
        worker: int,
        dtype: torch.dtype,
        relay: bool = False,
        head: str | None = None,
    ):
        self.servers, self.layout, self.worker = servers, layout, worker
        self.relay = relay
        self.base, self.generation = head, 0
        self.probes = [torch.from_numpy(p) for p in layout.probes]
        self.buffer = torch.empty(layout.d, dtype=dtype) if len(servers) > 1 else None

    def pull(self, join: bool = False) -> tuple[str, Tensor | None, float, int, int]:
        """(status, parameters (None unless status is "params": "stop" once the run is
        over, "wait" while the staleness bound holds the worker), lr, last seq applied,
        joins so far)."""
        if self.relay:
            *head, refs = self._head("relay_pull", self.worker, join)
            others = self._replies(refs)
            if others is None:  # a shard was lost: pull again once it is rebuilt
                return WAIT, None, head[2], head[3], head[4]
            replies = [tuple(head), *others]
        else:
            replies = ray.get([s.pull.remote(self.worker, join) for s in self.servers])
        # Shard 0 decides which pushes are applied (the others apply what it relays):
        # its last seq is the worker's on every shard.
        status, _, lr, last_seq, joins = replies[0]
        if any(r[0] == STOP for r in replies):
            return STOP, None, lr, last_seq, joins
        if status != PARAMS:
            return status, None, lr, last_seq, joins
        return PARAMS, self._join([r[1] for r in replies]), lr, last_seq, joins

    def push(
        self,
        seq: int,
        message: Tensor | None,
        loss: float = math.nan,
        offset: Tensor | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> list[str]:
        """Push to every shard; the shards' statuses (shard 0's only when relayed)."""
        if self.relay:
            return [self._relayed("relay_push", seq, message, loss, offset, buffers)]
        calls = self._calls("push", seq, message, loss, offset, buffers)
        return ray.get(calls)

    def exchange(
        self,
        seq: int,
        message: Tensor,
        loss: float = math.nan,
        offset: Tensor | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> tuple[list[str], Tensor | None, float]:
        """Push and pull in one round trip: (statuses, parameters or None, lr).

        No parameters: the run is over (a status says "stop" or this was its last push),
        or the push was held or the pull must wait (bounded staleness).
        """
        if self.relay:
            status, params, lr, refs = self._relayed(
                "relay_exchange", seq, message, loss, offset, buffers
            )
            if params is None:
                return [status], None, lr
            replies = self._replies(refs)
            if replies is None:  # a shard was lost: the worker pulls on its own
                return [status], None, lr
            if any(r[0] != PARAMS for r in replies):
                return [status, STOP], None, lr  # (another shard only refuses when stopped)
            return [status], self._join([params, *(r[1] for r in replies)]), lr
        replies = ray.get(self._calls("exchange", seq, message, loss, offset, buffers))
        statuses = [r[0] for r in replies]
        if any(r[1] is None for r in replies):
            return statuses, None, replies[0][2]
        return statuses, self._join([r[1] for r in replies]), replies[0][2]

    def _replies(self, refs: list[Any]) -> list[Any] | None:
        """The other shards' replies; None if one of them was lost, or the head that owned
        the references (its pull is gone; pushes are not: the head replays them into the
        shard it rebuilds, a promoted standby has them)."""
        try:
            return ray.get(refs)
        except lost_errors():
            time.sleep(LOST_PAUSE)
            return None

    def _head(self, method: str, *args: Any) -> Any:
        """Call ``method`` on the head and wait for its reply; a lost head's call is sent
        again to its promoted standby (the same arguments)."""
        while True:
            try:
                reply = ray.get(getattr(self.servers[0], method).remote(*args))
            except lost_errors():
                if self.base is None:
                    raise
                self.generation, self.servers[0] = find_head(self.base, self.generation + 1)
                continue
            if (reply if isinstance(reply, str) else reply[0]) != NOT_HEAD:
                return reply
            # A standby not promoted yet (or the head was only out of reach): look again
            # from shard 0 on, after a pause.
            time.sleep(LOST_PAUSE)
            self.generation, self.servers[0] = find_head(self.base, 0)

    def _parts(
        self, message: Tensor | None, offset: Tensor | None
    ) -> tuple[list[np.ndarray] | None, list[np.ndarray | None]]:
        """The shards' slices of the message and their probe coordinates of ``offset``."""
        pieces = self.layout.split(message.numpy()) if message is not None else None
        offsets: list[np.ndarray | None] = []
        for s, (lo, hi) in enumerate(self.layout.bounds):
            off = None
            if offset is not None:
                off = torch.index_select(offset[lo:hi], 0, self.probes[s]).numpy()
            offsets.append(off)
        return pieces, offsets

    def _calls(
        self,
        method: str,
        seq: int,
        message: Tensor | None,
        loss: float,
        offset: Tensor | None,
        buffers: dict[str, np.ndarray] | None,
    ) -> list[Any]:
        pieces, offsets = self._parts(message, offset)
        return [
            getattr(server, method).remote(
                self.worker,
                seq,
                None if pieces is None else pieces[s],
                loss if s == 0 else math.nan,
                offsets[s],
                buffers if s == 0 else None,
            )
            for s, server in enumerate(self.servers)
        ]

    def _relayed(
        self,
        method: str,
        seq: int,
        message: Tensor | None,
        loss: float,
        offset: Tensor | None,
        buffers: dict[str, np.ndarray] | None,
    ) -> Any:
        """Call shard 0's relaying ``method``, with the other shards' slices: its reply."""
        pieces, offsets = self._parts(message, offset)
        # By value: shard 0 holds them once it runs the call, and relays its own copies
        # (a reference to an object this worker put would die with the worker).
        others = None if pieces is None else pieces[1:]
        return self._head(
            method,
            self.worker,
            seq,
            None if pieces is None else pieces[0],
            loss,
            offsets[0],
            buffers,
            others,
            offsets[1:],
        )

    def _join(self, pieces: list[np.ndarray]) -> Tensor:
        if self.buffer is None:
            return torch.from_numpy(pieces[0])
        for (lo, hi), piece in zip(self.layout.bounds, pieces):
            self.buffer[lo:hi].copy_(torch.from_numpy(piece))
        return self.buffer
