"""The data of ``dana.fit``: tensors in memory, a ``Dataset`` read per batch, an ``IterableDataset``.

The rule (:func:`data_source` tells which kind a value is):

- ``(x, y)`` tensors or arrays, or a ``torch.utils.data.TensorDataset``
  (:class:`TensorData`): held in memory; a batch is the rows the stream draws.
- A map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``) of
  ``(x, y)`` items (:class:`MapData`): read per batch, item by item, when the batch is
  drawn, then collated (``default_collate``); never collated once up front. With
  ``num_workers=N`` (DataLoader's option) ``N`` reader processes of each process that
  reads (the simulator's, each Ray worker's) read whole batches while it computes.
- A ``torch.utils.data.IterableDataset`` with ``__len__`` (the items of one pass;
  :class:`IterData`): read in its own order, ``batch_size`` items a batch, iterated
  again from the start after each pass, in process (``num_workers`` does not apply).
  Without ``__len__`` an epoch has no length: it is refused.
- A ``torch.utils.data.DataLoader`` is refused: dana draws each worker's batches
  itself; pass its dataset (``loader.dataset``) and the batch size.

In each item ``x`` is a tensor, a tuple or a dict of tensors (:mod:`dana.train.task.inputs`:
the model is called ``model(x)``, ``model(*x)``, ``model(**x)``), ``y`` the targets.

Randomness, once per batch: worker ``w``'s ``s``-th batch of a run seeded ``seed`` has the
key :func:`read_key` ``(seed, w, s)``; torch's, Python's and NumPy's global generators are
seeded with it once, the batch's items read in their drawn order (an iterable's: its
order), and the generators put back (:func:`read_items`, :func:`seeded`). A random
transform in ``__getitem__`` therefore draws anew for every batch (it differs across
epochs) and draws the same wherever and by whichever process the batch is read: on the
simulator's every engine (batches drawn in the simulator's order), in a Ray worker
(each reads its own data, from the dataset object shipped to it once), in process or
by a reader. Test data are read a batch at a time at each evaluation, never collated
whole: in order, batch ``j`` under the key ``j`` (the same draws at every evaluation).
"""

from __future__ import annotations

import copy
import itertools
import multiprocessing
import random
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate

from dana.errors import ArgumentTypeError, ConfigError
from dana.train.device import to_device
from dana.train.task import inputs as I
from dana.train.task.evaluation import in_batches

_LOCK = threading.RLock()
_MASK = 2**63 - 1
#: Batches submitted ahead per reader process where the next ones are known (a Ray
#: worker's own stream, the test set): DataLoader's ``prefetch_factor``.
AHEAD = 2

#: Inputs and targets of a batch.
Pair = tuple[I.Inputs, Tensor]
#: A map-style dataset's batch as handed out: ``(rows, key)`` (:class:`ReadBatches`).
Drawn = tuple[Tensor, int]


def read_key(seed: int, worker: int, step: int) -> int:
    """The key of worker ``worker``'s ``step``-th batch of a run seeded ``seed``."""
    words = [seed % 2**63, worker, step]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0]) & _MASK


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


def collate(items: list[Any], what: str) -> Pair:
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


def read_items(dataset: Any, rows: Iterable[int], key: int, what: str) -> Pair:
    """Items ``rows`` of ``dataset`` read in that order under the generators seeded ``key``
    once (:func:`seeded`), collated: every read of a map-style dataset, here or in a
    reader process."""
    with seeded(key):
        items = [dataset[i] for i in rows]
    return collate(items, what)


_READING: tuple[Any, str] | None = None  # a reader process's dataset and its name


def _start_reader(dataset: Any, what: str) -> None:
    global _READING
    torch.set_num_threads(1)  # (as DataLoader's workers: the readers share the cores)
    _READING = dataset, what


def _read_in_reader(rows: list[int], key: int) -> Pair:
    return read_items(_READING[0], rows, key, _READING[1])


def _result(batch: Future | Pair) -> Pair:
    """A submitted batch's ``(x, y)``: a reader's once read."""
    return batch.result() if isinstance(batch, Future) else batch


def ahead(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """``items`` in order, each taken from ``items`` ``depth`` items before it is given
    (taking one submits its read: ``depth`` reads run ahead)."""
    queue = deque(itertools.islice(items, depth))
    for item in items:
        queue.append(item)
        yield queue.popleft()
    yield from queue


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

    def rows(self, rows: Tensor) -> Pair:
        rows = rows.to(self.y.device)
        return I.take(self.x, rows), self.y[rows]

    def batches(self, size: int) -> Iterator[Pair]:
        """Every example in order, ``size`` a batch (test data)."""
        return in_batches(self.x, self.y, size)

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
    """``x`` (inputs or targets) on ``device``, its floating tensors in ``dtype``; from
    the CPU to a GPU without waiting (:func:`~dana.train.device.to_device`)."""

    def one(t: Tensor) -> Tensor:
        return to_device(t.to(dtype) if t.is_floating_point() else t, device)

    return I.apply(x, one)


class MapData:
    """A map-style dataset, read per batch (the module docstring); ``num_workers``
    reader processes, started when first needed (:meth:`close` stops them)."""

    def __init__(self, dataset: Any, what: str, num_workers: int = 0):
        self.dataset, self.what, self.n = dataset, what, len(dataset)
        if self.n == 0:
            raise ConfigError(f"{what}: the dataset is empty")
        self.num_workers = num_workers
        self._readers: ProcessPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:  # (shipped to Ray workers without readers)
        return {**self.__dict__, "_readers": None}

    @property
    def labels(self) -> Tensor | None:
        """The class labels the dataset declares (``dataset.targets``, torchvision's
        convention), for ``partition``; None without them."""
        targets = getattr(self.dataset, "targets", None)
        if targets is None:
            return None
        targets = torch.as_tensor(targets)
        return targets if targets.dim() == 1 and len(targets) == self.n else None

    def read(self, rows: Tensor, key: int) -> Pair:
        """The batch of ``rows`` keyed ``key`` (:func:`read_items`), read here now."""
        return read_items(self.dataset, rows.tolist(), key, self.what)

    def submit(self, rows: Tensor, key: int) -> Future | Pair:
        """The batch of ``rows`` keyed ``key``: read now, or with readers the future of
        one of them reading it."""
        if not self.num_workers:
            return self.read(rows, key)
        if self._readers is None:
            self._readers = ProcessPoolExecutor(
                self.num_workers,
                multiprocessing.get_context(),  # (the default, as DataLoader's)
                initializer=_start_reader,
                initargs=(self.dataset, self.what),
            )
        return self._readers.submit(_read_in_reader, rows.tolist(), key)

    def rows(self, rows: Tensor) -> Pair:
        return self.read(rows, 0)

    def batches(self, size: int) -> Iterator[Pair]:
        """Every item in order, ``size`` a batch, batch ``j`` keyed ``j`` (test data)."""
        starts = range(0, self.n, size)
        batches = (
            self.submit(torch.arange(s, min(s + size, self.n)), j) for j, s in enumerate(starts)
        )
        return map(_result, ahead(batches, AHEAD * self.num_workers))

    def close(self) -> None:
        """Stop the reader processes (new ones start if it reads again)."""
        if self._readers is not None:
            self._readers.shutdown(cancel_futures=True)
            self._readers = None


class IterData:
    """An iterable dataset with a length, read in its order (the module docstring)."""

    labels = None
    num_workers = 0  # (read in process, in its order)

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

    def read(self, count: int, key: int) -> Pair:
        """The next ``count`` items, under the generators seeded ``key`` once."""
        with seeded(key):
            items = [self._next() for _ in range(count)]
        return collate(items, self.what)

    def rows(self, rows: Tensor) -> Pair:
        """The first ``len(rows)`` items of a pass (a probe of the batch's shape)."""
        items = iter(self.dataset)
        return collate([next(items) for _ in range(len(rows))], self.what)

    def batches(self, size: int) -> Iterator[Pair]:
        """One pass of a fresh iterator, ``size`` items a batch, batch ``j`` under the
        generators seeded ``j`` (test data)."""
        items = iter(self.dataset)
        for j in itertools.count():
            with seeded(j):
                batch = list(itertools.islice(items, size))
            if not batch:
                return
            yield collate(batch, self.what)


Data = TensorData | MapData | IterData


def check_num_workers(num_workers: Any) -> int:
    """``num_workers`` (reader processes, 0: none), or ConfigError."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(
            f"num_workers must be an integer >= 0 (reader processes of a Dataset, 0: read "
            f"in process), got {num_workers!r}"
        )
    return num_workers


def data_source(data: Any, what: str, num_workers: int = 0) -> Data:
    """What ``data`` is (the module docstring), a map-style dataset read by
    ``num_workers`` reader processes; ConfigError (a bad value) or ArgumentTypeError (a
    wrong kind) saying what to pass."""
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    num_workers = check_num_workers(num_workers)
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
        return MapData(data, what, num_workers)
    raise ArgumentTypeError(
        f"{what}: expected (x, y) tensors, a torch.utils.data.Dataset of (x, y) items or an "
        f"IterableDataset with __len__, got {type(data).__name__}"
    )


@contextmanager
def reading(*sources: Data) -> Iterator[None]:
    """Inside: ``sources`` are read (their reader processes start when first needed);
    on the way out their readers are stopped."""
    try:
        yield
    finally:
        for source in sources:
            if isinstance(source, MapData):
                source.close()


class ReadBatches:
    """A stream of batches read when drawn (a :class:`MapData`'s rows from ``rows``, a
    :class:`IterData`'s in its order), keyed per worker and step (the module
    docstring). ``per_worker``: the simulator asks each worker's batch by its index
    (:meth:`next_for`); a Ray worker's stream is built for its ``worker`` and asked
    :meth:`next` (with readers its next batches are read ahead: its state then counts
    them, and a Ray worker's stream is never checkpointed).

    A map-style dataset's batch is handed out as ``(rows, key)`` (as
    :class:`~dana.train.task.batches.KeyedBatchStream`'s: what a checkpoint holds), its
    read submitted then; :meth:`take` gives its examples (read again after a resume).
    An iterable's batch is handed out read."""

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
        self.steps: dict[int, int] = {}  # batches drawn by each worker
        self._held: dict[int, Future | Pair] = {}  # key: a batch handed out, not yet taken
        self._last: dict[int, int] = {}  # worker: the key of the batch it was handed last
        self._own: Iterator[Drawn | Pair] | None = None  # (next()'s, read ahead)

    def _drawn(self, worker: int) -> Drawn | Pair:
        """Worker ``worker``'s next batch: ``(rows, key)``, its read submitted (an
        iterable's: read now)."""
        step = self.steps.get(worker, 0)
        self.steps[worker] = step + 1
        key = read_key(self.seed, worker, step)
        if isinstance(self.data, IterData):
            return self.data.read(self.batch_size, key)
        rows = self.rows
        drawn = rows.next_for(worker) if getattr(rows, "per_worker", False) else rows.next()
        self._held[key] = self.data.submit(drawn, key)
        return drawn, key

    def _handed(self, worker: int, batch: Drawn | Pair) -> Drawn | Pair:
        """``batch``, handed to ``worker``: its batch before, if never taken (a worker
        that left), is dropped."""
        if isinstance(self.data, MapData):
            self._held.pop(self._last.get(worker), None)
            self._last[worker] = batch[1]
        return batch

    def next_for(self, worker: int) -> Drawn | Pair:
        """Worker ``worker``'s next batch (the simulator's)."""
        return self._handed(worker, self._drawn(worker))

    def next(self) -> Drawn | Pair:
        """This stream's worker's next batch (a Ray worker's), the next ones read ahead."""
        if self.worker is None:
            raise ValueError("this stream serves several workers: ask next_for(worker)")
        if self._own is None:
            draws = (self._drawn(self.worker) for _ in itertools.count())
            self._own = ahead(draws, AHEAD * self.data.num_workers)
        return self._handed(self.worker, next(self._own))

    def take(self, batch: Drawn | Pair) -> Pair:
        """The ``(x, y)`` of a batch handed out: of ``(rows, key)`` as submitted (read
        now if not held: after a resume), an iterable's as read."""
        if isinstance(self.data, IterData):
            return batch
        rows, key = batch
        held = self._held.pop(key, None)
        return self.data.read(rows, key) if held is None else _result(held)

    def state_dict(self) -> dict[str, Any]:
        rows = {} if self.rows is None else self.rows.state_dict()
        return {"rows": rows, "steps": [[w, s] for w, s in sorted(self.steps.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.rows is not None:
            self.rows.load_state_dict(state["rows"])
        self.steps = {int(w): int(s) for w, s in state["steps"]}
        self._held.clear()
        self._own = None
