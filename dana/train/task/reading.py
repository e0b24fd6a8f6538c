"""The data of ``dana.fit``: tensors in memory, a ``Dataset`` read per batch, an ``IterableDataset``.

The rule (:func:`data_source` tells which kind a value is):

- ``(x, y)`` tensors or arrays, or a ``torch.utils.data.TensorDataset``
  (:class:`TensorData`): held in memory; a batch is the rows the stream draws.
- A map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``) of
  ``(x, y)`` items (:class:`MapData`): read per batch, item by item, when the batch is
  drawn, then collated (``default_collate``); never collated once up front.
- A ``torch.utils.data.IterableDataset`` with ``__len__`` (the items of one pass;
  :class:`IterData`): read in its own order, ``batch_size`` items a batch, iterated
  again from the start after each pass. Without ``__len__`` an epoch has no length: it
  is refused.
- A ``torch.utils.data.DataLoader`` is refused: dana draws each worker's batches
  itself; pass its dataset (``loader.dataset``) and the batch size.

In each item ``x`` is a tensor, a tuple or a dict of tensors (:mod:`dana.train.task.inputs`:
the model is called ``model(x)``, ``model(*x)``, ``model(**x)``), ``y`` the targets.

Randomness: worker ``w``'s ``s``-th batch of a run seeded ``seed`` has the key
:func:`read_key` ``(seed, w, s)``, and its item ``i`` (the dataset's index, or the
position in the pass of an iterable) is read with torch's, Python's and NumPy's global
generators seeded :func:`item_seed` ``(key, i)``, restored afterwards (:func:`seeded`).
A random transform in ``__getitem__`` therefore draws anew for every batch (it differs
across epochs) and draws the same wherever the batch is read: on the simulator's every
engine (batches are read when drawn, in the simulator's order) and in a Ray worker
(each reads its own data, from the dataset object shipped to it once). Test data are
read once, at the start (items seeded by their index alone).
"""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate

from dana.errors import ArgumentTypeError, ConfigError
from dana.train.task import inputs as I

_LOCK = threading.RLock()
_MASK = 2**63 - 1


def read_key(seed: int, worker: int, step: int) -> int:
    """The key of worker ``worker``'s ``step``-th batch of a run seeded ``seed``."""
    words = [seed % 2**63, worker, step]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0]) & _MASK


def item_seed(key: int, index: int) -> int:
    """The seed item ``index`` of the batch keyed ``key`` is read with (a 64-bit mix)."""
    z = (key + (index + 1) * 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) & _MASK


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Torch's (CPU), Python's and NumPy's global generators seeded ``seed`` inside, and
    put back as they were after (one thread at a time)."""
    with _LOCK:
        cpu = torch.random.default_generator
        saved = cpu.get_state(), random.getstate(), np.random.get_state()
        cpu.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            cpu.set_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])


def _pair(item: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise ConfigError(
            f"{what}: each item of the dataset must be an (x, y) pair (x a tensor, a tuple or "
            f"a dict of tensors), got {type(item).__name__}"
        )
    return item[0], item[1]


def collate(items: list[Any], what: str) -> tuple[I.Inputs, Tensor]:
    """``(x, y)`` of a list of ``(x, y)`` items (``default_collate``)."""
    for item in items[:1]:
        _pair(item, what)
    try:
        x, y = default_collate(items)
    except (TypeError, RuntimeError, ValueError) as e:
        raise ConfigError(
            f"{what}: the dataset's items cannot be stacked into a batch ({e}); each item "
            "must be an (x, y) pair of tensors, numbers, or tuples/dicts of tensors of one "
            "shape each"
        ) from None
    if isinstance(x, list):
        x = tuple(x)
    return x, torch.as_tensor(y)


class TensorData:
    """Examples held in memory: inputs ``x`` (:mod:`dana.train.task.inputs`) and targets ``y``."""

    def __init__(self, x: I.Inputs, y: Tensor, what: str):
        x = I.apply(x, torch.as_tensor) if I.is_structured(x) else torch.as_tensor(x)
        y = torch.as_tensor(y)
        try:
            n = I.count(x)
        except ValueError as e:
            raise ConfigError(f"{what}: {e}") from None
        if y.dim() == 0 or n != len(y):
            shapes = [tuple(t.shape) for t in I.tensors(x)]
            raise ConfigError(
                f"{what}: x and y must have one row per example, got shapes "
                f"{shapes[0] if len(shapes) == 1 else shapes} and {tuple(y.shape)}"
            )
        if n == 0:
            raise ConfigError(f"{what}: no examples")
        for t in I.tensors(x):
            check_finite(t, f"{what}: x")
        check_finite(y, f"{what}: y")
        self.x, self.y, self.n = x, y, n

    @property
    def labels(self) -> Tensor:
        return self.y

    def rows(self, rows: Tensor) -> tuple[I.Inputs, Tensor]:
        rows = rows.to(self.y.device)
        return I.take(self.x, rows), self.y[rows]

    def to(self, device: torch.device, dtype: torch.dtype) -> TensorData:
        """A copy on ``device``, its floating tensors in ``dtype``."""
        moved = copy.copy(self)
        moved.x, moved.y = place(self.x, device, dtype), place(self.y, device, dtype)
        return moved


def check_finite(t: Tensor, what: str) -> None:
    """ConfigError if the floating tensor ``t`` holds a NaN or an infinite value (training
    on it would give NaN), saying how many and how to fix them."""
    if not (t.is_floating_point() or t.is_complex()):
        return
    bad = ~torch.isfinite(t)
    count = int(bad.sum())
    if count:
        rows = int(bad.reshape(len(t), -1).any(1).sum()) if t.dim() else 1
        raise ConfigError(
            f"{what} holds {count:,} NaN or infinite values (in {rows:,} of {len(t):,} "
            "rows), which would train on NaN: drop those rows or fill them (torch.nan_to_num)"
        )


def place(x: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """``x`` (inputs or targets) on ``device``, its floating tensors in ``dtype``."""

    def one(t: Tensor) -> Tensor:
        return t.to(device, dtype) if t.is_floating_point() else t.to(device)

    return I.apply(x, one)


class MapData:
    """A map-style dataset, read per batch (the module docstring)."""

    def __init__(self, dataset: Any, what: str):
        self.dataset, self.what, self.n = dataset, what, len(dataset)
        if self.n == 0:
            raise ConfigError(f"{what}: the dataset is empty")

    @property
    def labels(self) -> Tensor | None:
        """The class labels the dataset declares (``dataset.targets``, torchvision's
        convention), for ``partition``; None without them."""
        targets = getattr(self.dataset, "targets", None)
        if targets is None:
            return None
        targets = torch.as_tensor(targets)
        return targets if targets.dim() == 1 and len(targets) == self.n else None

    def read(self, rows: Tensor, key: int) -> tuple[I.Inputs, Tensor]:
        """The batch of ``rows``, item ``i`` seeded :func:`item_seed` ``(key, i)``."""
        items = []
        for i in rows.tolist():
            with seeded(item_seed(key, i)):
                items.append(self.dataset[i])
        return collate(items, self.what)

    def rows(self, rows: Tensor) -> tuple[I.Inputs, Tensor]:
        return self.read(rows, 0)

    def every(self) -> TensorData:
        """Every item, collated once (test data)."""
        return TensorData(*self.read(torch.arange(self.n), 0), self.what)


class IterData:
    """An iterable dataset with a length, read in its order (the module docstring)."""

    labels = None

    def __init__(self, dataset: Any, what: str):
        try:
            self.n = len(dataset)
        except TypeError:
            raise ConfigError(
                f"{what}: an IterableDataset needs __len__ (the items of one pass), so that "
                "an epoch has a length: define __len__, or pass a map-style Dataset or "
                "(x, y) tensors"
            ) from None
        if self.n == 0:
            raise ConfigError(f"{what}: the dataset is empty")
        self.dataset, self.what = dataset, what
        self._items: Iterator[Any] | None = None
        self._position = 0  # items read from the current pass

    def __getstate__(self) -> dict[str, Any]:  # (shipped to Ray workers unstarted)
        return {**self.__dict__, "_items": None, "_position": 0}

    def _next(self) -> Any:
        if self._items is not None:
            try:
                return next(self._items)
            except StopIteration:
                pass
        self._items, self._position = iter(self.dataset), 0
        try:
            return next(self._items)
        except StopIteration:
            raise ConfigError(f"{self.what}: the IterableDataset yielded no item") from None

    def read(self, count: int, key: int) -> tuple[I.Inputs, Tensor]:
        """The next ``count`` items, the ``j``-th seeded :func:`item_seed` ``(key, j)``."""
        items = []
        for j in range(count):
            with seeded(item_seed(key, j)):
                items.append(self._next())
        return collate(items, self.what)

    def rows(self, rows: Tensor) -> tuple[I.Inputs, Tensor]:
        """The first ``len(rows)`` items of a pass (a probe of the batch's shape)."""
        items = iter(self.dataset)
        return collate([next(items) for _ in range(len(rows))], self.what)

    def every(self) -> TensorData:
        """One pass, collated once (test data)."""
        items = []
        for j, item in enumerate(self.dataset):
            with seeded(item_seed(0, j)):
                items.append(item)
        return TensorData(*collate(items, self.what), self.what)


Data = TensorData | MapData | IterData


def data_source(data: Any, what: str) -> Data:
    """What ``data`` is (the module docstring); ConfigError (a bad value) or
    ArgumentTypeError (a wrong kind) saying what to pass."""
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    if isinstance(data, tuple | list) and len(data) == 2:
        return TensorData(data[0], data[1], what)
    if isinstance(data, DataLoader):
        raise ConfigError(
            f"{what}: a DataLoader batches the data itself, while dana draws each worker's "
            f"batches: pass its dataset ({what}=loader.dataset) and batch_size="
            f"{data.batch_size or 'B'}"
        )
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return TensorData(data.tensors[0], data.tensors[1], what)
    if isinstance(data, IterableDataset):
        return IterData(data, what)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, str):
        return MapData(data, what)
    raise ArgumentTypeError(
        f"{what}: expected (x, y) tensors, a torch.utils.data.Dataset of (x, y) items or an "
        f"IterableDataset with __len__, got {type(data).__name__}"
    )


class ReadBatches:
    """A stream of batches read when drawn (a :class:`MapData`'s rows from ``rows``, a
    :class:`IterData`'s in its order), keyed per worker and step (the module
    docstring). ``per_worker``: the simulator asks each worker's batch by its index
    (:meth:`next_for`); a Ray worker's stream is built for its ``worker`` and asked
    :meth:`next`."""

    per_worker = True

    def __init__(
        self,
        data: MapData | IterData,
        batch_size: int,
        seed: int,
        rows: Any = None,
        worker: int | None = None,
    ):
        if data.n < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the {data.n} examples")
        self.data, self.rows, self.seed, self.worker = data, rows, int(seed), worker
        self.batch_size = batch_size
        self.batches_per_epoch = data.n // batch_size
        self.steps: dict[int, int] = {}  # batches read by each worker

    def next_for(self, worker: int) -> tuple[I.Inputs, Tensor]:
        step = self.steps.get(worker, 0)
        self.steps[worker] = step + 1
        key = read_key(self.seed, worker, step)
        if isinstance(self.data, IterData):
            return self.data.read(self.batch_size, key)
        rows = self.rows
        drawn = rows.next_for(worker) if getattr(rows, "per_worker", False) else rows.next()
        return self.data.read(drawn, key)

    def next(self) -> tuple[I.Inputs, Tensor]:
        if self.worker is None:
            raise ValueError("this stream serves several workers: ask next_for(worker)")
        return self.next_for(self.worker)

    def state_dict(self) -> dict[str, Any]:
        rows = {} if self.rows is None else self.rows.state_dict()
        return {"rows": rows, "steps": [[w, s] for w, s in sorted(self.steps.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.rows is not None:
            self.rows.load_state_dict(state["rows"])
        self.steps = {int(w): int(s) for w, s in state["steps"]}
