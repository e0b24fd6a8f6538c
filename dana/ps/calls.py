"""The record of the calls the head passed on: what ``dana replay`` rebuilds a run from.

The head numbers every call it passes on to its standby and the other shards
(:mod:`dana.ps.relay`), and every shard runs them in that order, so the order of these
calls is the whole input of every shard's master rule. One row per call
(:class:`CallRecord`): its ``number``, its ``method`` (:data:`METHODS`), its ``worker``
and two numbers, ``arg`` and ``more``:

- a pull: ``arg`` 1 if it is the first of the worker's process (a join), ``more`` the
  worker's incarnation (its stream's seed, :func:`dana.train.task.batches.stream_seed`);
- a push: ``arg`` its sequence number, ``more`` the number of its batch in that stream
  (from 0): a batch costs one integer, not its indices;
- a member call: ``arg`` 1 for a join, 0 for a departure; a stop: nothing. (``--grow-at``
  joins are no calls: every shard makes them at their step itself.)

The head keeps a row once its standby has taken the call (a deposed head's call never
counts: its standby refused it); a standby keeps a row for each call it logs; both send
theirs with every poll. The driver keeps each number once (:class:`CallBook`), saves
them with every checkpoint and writes them at the end of the run to ``replay.npz``
(:func:`write_calls`).
"""

from __future__ import annotations

import io
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dana.atomic import write_atomic
from dana.ps.protocol import Entry, Member, Method, Pull, Push
from dana.train.records.pushlog import ColumnLog
from dana.train.records.rundir import REPLAY_FILE

__all__ = ["REPLAY_FILE", "CallBook", "CallRecord", "call_row", "write_calls"]

#: The methods by their codes in the record.
METHODS = (Method.PULL, Method.PUSH, Method.MEMBER, Method.STOP)

_CODES = {method: code for code, method in enumerate(METHODS)}
_TYPES = {"number": "q", "method": "b", "worker": "l", "arg": "q", "more": "q"}


def call_row(method: Method, arg: Pull | Push | Member | None) -> tuple[int, int, int, int]:
    """``(method code, worker, arg, more)`` of a call (the module docstring)."""
    if isinstance(arg, Pull):
        return _CODES[method], arg.worker, int(arg.join), arg.incarnation
    if isinstance(arg, Push):
        return _CODES[method], arg.worker, arg.seq, arg.batch
    if isinstance(arg, Member):
        return _CODES[method], arg.worker, int(arg.join), 0
    return _CODES[method], -1, 0, 0


class CallRecord(ColumnLog):
    """The rows a head or a standby has kept since the driver last drained them, and the
    head's rows of calls its standby has not taken yet (``pending``)."""

    types = _TYPES

    def __init__(self) -> None:
        super().__init__()
        self.count = 0  # the number of the last row kept
        self.pending: list[tuple[int, ...]] = []

    def note(self, number: int, method: Method, arg: Pull | Push | Member | None) -> None:
        """The head passes call ``number`` on: kept once :meth:`commit` says it was taken."""
        self.pending.append((number, *call_row(method, arg)))

    def commit(self) -> None:
        """The standby took the pending calls (or there is none to take them)."""
        for row in self.pending:
            self._keep(row)
        self.pending = []

    def discard(self) -> None:
        """The standby refused the pending calls: this head was deposed."""
        self.pending = []

    def take(self, entry: Entry) -> None:
        """A standby logged ``entry`` (a repeat is not kept again)."""
        if entry.number > self.count:
            self._keep((entry.number, *call_row(entry.method, entry.args[0])))

    def _keep(self, row: tuple[int, ...]) -> None:
        self.append(**dict(zip(self.columns, row)))
        self.count = row[0]


class CallBook:
    """The driver's rows: each number once, in order (rows come from the head and its
    standby, some twice, the standby's sometimes ahead of the head's).

    A resumed run is made of parts, one per start: ``segments`` (the row where each
    starts: the numbers start again at 1) and ``cuts`` (per part, the steps of the
    checkpoint the next part resumed from: its state is the shards' right after the
    call that reached them; -1: after the part's last call, a checkpoint of the moment,
    or the end). A checkpoint keeps the book (:meth:`state_dict`); ``complete`` is false
    for a run resumed from a checkpoint without one."""

    def __init__(self) -> None:
        self.columns = {name: array(code) for name, code in _TYPES.items()}
        self.ahead: dict[int, tuple[int, ...]] = {}  # rows past a missing number
        self.segments, self.cuts = [0], [-1]
        self.complete = True

    @property
    def next(self) -> int:
        numbers = self.columns["number"]
        return numbers[-1] + 1 if len(numbers) > self.segments[-1] else 1

    def add(self, drained: dict[str, np.ndarray] | None) -> None:
        if drained is None:
            return
        rows = zip(*(drained[name].tolist() for name in _TYPES))
        for row in rows:
            if row[0] >= self.next:
                self.ahead[row[0]] = row
        while self.next in self.ahead:
            for name, value in zip(_TYPES, self.ahead.pop(self.next)):
                self.columns[name].append(value)

    def state_dict(self, cut: int) -> dict[str, Any]:
        """The book for a checkpoint of the shards' state at ``cut`` steps (-1: after
        every call so far)."""
        state: dict[str, Any] = {
            name: torch.from_numpy(np.array(column)) for name, column in self.columns.items()
        }
        state.update(segments=list(self.segments), cuts=[*self.cuts[:-1], cut])
        state["complete"] = self.complete and not self.ahead
        return state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's book (None: it has none): a new part begins."""
        if state is None:
            self.complete = False
            return
        for name, code in _TYPES.items():
            self.columns[name] = array(code, state[name].tolist())
        self.segments = [*(int(x) for x in state["segments"]), len(self.columns["number"])]
        self.cuts = [*(int(x) for x in state["cuts"]), -1]
        self.complete = bool(state["complete"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The rows, the parts, ``complete`` and ``missing``: the first number of the
        last part never received (0: none)."""
        out = {name: np.asarray(column) for name, column in self.columns.items()}
        out.update(segments=np.array(self.segments), cuts=np.array(self.cuts))
        out["complete"] = np.array(self.complete)
        out["missing"] = np.array(self.next if self.ahead else 0)
        return out


def write_calls(path: Path, book: CallBook) -> None:
    """Write ``book`` (:meth:`CallBook.arrays`) to ``path``, atomically."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **book.arrays())
    write_atomic(path, buffer.getvalue())
