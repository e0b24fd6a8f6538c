"""The per-push log: compact typed columns, one append per push.

:class:`ColumnLog` is the column store (one ``array.array`` per column); a subclass
names its columns and their types. :class:`PushLog` is the run's log, the same for
every runner (the simulator appends to it as it applies pushes; the Ray driver merges
the shards' logs into one): the worker, the staleness, the gap, the loss, the learning
rate and the time of every push. The summary and the metrics rows read it
(:mod:`dana.train.records.metrics`).
"""

from __future__ import annotations

from array import array
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor


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

    def clear(self) -> None:
        for name, code in self.types.items():
            setattr(self, name, array(code))

    def append(self, **values: float) -> None:
        for name in self.types:
            getattr(self, name).append(values[name])

    def __len__(self) -> int:
        return len(getattr(self, next(iter(self.types))))

    def numpy(self, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
        """The records ``start:stop`` as numpy arrays, by column."""
        return {name: np.asarray(getattr(self, name)[start:stop]) for name in self.types}

    def drain(self) -> dict[str, np.ndarray]:
        """Every record as numpy columns (copies); the log is empty afterwards."""
        out = {name: np.array(getattr(self, name)) for name in self.types}
        self.clear()
        return out

    def state_dict(self) -> dict[str, Tensor]:
        # np.array copies: a view would pin the array.array's buffer, and the next append
        # would raise BufferError (and the snapshot would not be one).
        return {name: torch.from_numpy(np.array(getattr(self, name))) for name in self.types}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, code in self.types.items():
            setattr(self, name, array(code, state[name].tolist()))


class PushLog(ColumnLog):
    """Per-push records of a run (``numpy()`` gives arrays)."""

    types = {"worker": "l", "staleness": "l", "gap": "d", "loss": "d", "lr": "d", "sim_time": "d"}
