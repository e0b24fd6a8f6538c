"""The per-push log: compact typed columns, one append per push.

:class:`ColumnLog` is the column store (one ``array.array`` per column, read as an
attribute: ``log.loss``); a subclass names its columns and their types. :class:`PushLog`
is the run's log, the same for every runner (the simulator appends to it as it applies
pushes; the Ray driver merges the shards' logs into one): the worker, the staleness, the
gap, the loss, the learning rate and the time of every push. The summary and the
metrics rows read it (:mod:`dana.train.records.metrics`).

A value may be given as a 0-d tensor, or as :class:`Later` (a tensor and the function
of its value to record). Reading a tensor on a GPU waits for the device (a host
synchronisation), so a log made with ``defer=True`` keeps such values as they are and
reads them all at once, in one copy per dtype, when the log is first read after them
(any column, :meth:`~ColumnLog.numpy`, the state): the records are the same numbers
as a log that read each value when it came.

    >>> import torch
    >>> log = PushLog(defer=True)
    >>> log.append(worker=0, staleness=1, gap=Later(torch.tensor(4.0), lambda v: v ** 0.5),
    ...            loss=torch.tensor(0.5), lr=0.1, sim_time=2.0)
    >>> log.pending, list(log.gap), log.pending
    (1, [2.0], 0)
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from torch import Tensor


class Later(NamedTuple):
    """A value read when the log is: ``then(float(tensor))``."""

    tensor: Tensor
    then: Callable[[float], float]


def _column_property(name: str) -> property:
    return property(lambda self: self._column(name), doc=f"The ``{name}`` column.")


class ColumnLog:
    """Records as typed columns: ``types`` maps each column to its ``array`` type code
    (``"l"`` integers, ``"d"`` floats), in column order."""

    types: ClassVar[dict[str, str]]

    def __init__(self) -> None:
        self.clear()

    #: The column names, in order (set from ``types`` for every subclass).
    columns: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.columns = tuple(cls.types)
        for name in cls.columns:
            setattr(cls, name, _column_property(name))

    def _column(self, name: str) -> array:
        return self._columns[name]

    def _settle(self) -> None:
        """Read the values kept unread (none here: :class:`PushLog`)."""

    def clear(self) -> None:
        self._columns = {name: array(code) for name, code in self.types.items()}

    def append(self, **values: float) -> None:
        for name, column in self._columns.items():
            column.append(values[name])

    def __len__(self) -> int:
        return len(self._columns[self.columns[0]])

    def numpy(self, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
        """The records ``start:stop`` as numpy arrays, by column."""
        self._settle()
        return {name: np.asarray(c[start:stop]) for name, c in self._columns.items()}

    def drain(self) -> dict[str, np.ndarray]:
        """Every record as numpy columns (copies); the log is empty afterwards."""
        self._settle()
        out = {name: np.array(c) for name, c in self._columns.items()}
        self.clear()
        return out

    def state_dict(self) -> dict[str, Tensor]:
        # np.array copies: a view would pin the array.array's buffer, and the next append
        # would raise BufferError (and the snapshot would not be one).
        self._settle()
        return {name: torch.from_numpy(np.array(c)) for name, c in self._columns.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clear()
        for name, code in self.types.items():
            self._columns[name] = array(code, state[name].tolist())


class PushLog(ColumnLog):
    """Per-push records of a run (``numpy()`` gives arrays).

    Args:
        defer: keep the values given as tensors (or :class:`Later`) unread until the
            log is read (the module docstring); else read each one as it comes.
    """

    types = {"worker": "l", "staleness": "l", "gap": "d", "loss": "d", "lr": "d", "sim_time": "d"}

    def __init__(self, defer: bool = False) -> None:
        self.defer = defer
        self._rows: list[tuple[Any, ...]] = []  # rows with values not read yet
        super().__init__()

    @property
    def pending(self) -> int:
        """Records whose values are not read yet."""
        return len(self._rows)

    def append(self, **values: Any) -> None:
        row = tuple(values[name] for name in self.columns)
        if self._rows or (self.defer and any(isinstance(v, Tensor | Later) for v in row)):
            self._rows.append(row)
        else:
            for column, value in zip(self._columns.values(), row):
                column.append(_read(value))

    def __len__(self) -> int:
        return super().__len__() + len(self._rows)

    def _column(self, name: str) -> array:
        self._settle()
        return self._columns[name]

    def clear(self) -> None:
        super().clear()
        self._rows = []

    def _settle(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        lazy = [v.tensor if isinstance(v, Later) else v for r in rows for v in r]
        values = iter(_read_all([v for v in lazy if isinstance(v, Tensor)]))
        columns = list(self._columns.values())
        for row in rows:
            for column, value in zip(columns, row):
                if isinstance(value, Later):
                    value = value.then(next(values))
                elif isinstance(value, Tensor):
                    value = next(values)
                column.append(value)


def _read(value: Any) -> Any:
    """A value now (a tensor's, or a :class:`Later`'s)."""
    if isinstance(value, Later):
        return value.then(float(value.tensor))
    return float(value) if isinstance(value, Tensor) else value


def _read_all(tensors: list[Tensor]) -> list[float]:
    """The values of 0-d ``tensors``, in order: one copy to the host per device and
    dtype."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for n, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(n)
    out: list[float] = [0.0] * len(tensors)
    for places in groups.values():
        read = torch.stack([tensors[n].reshape(()) for n in places]).tolist()
        for n, value in zip(places, read):
            out[n] = float(value)
    return out
