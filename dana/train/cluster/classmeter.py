"""The bias meter: how many examples of each class are behind the updates applied.

A computation's batch counts for its class shares only once its work reaches the master:
the samples of a gradient computation count when its push is applied, those of a local
step when the push that ends its cycle is applied, and none of a computation lost to a
departure (or still in flight when the run ends). On a cluster where some data is
faster to compute (``class_cost``) or some workers hold other classes (``--partition``)
and run faster, the shares drift from the data's: ``summary.json`` holds both
(``applied_class_counts``, ``data_class_counts``) and ``dana report`` compares them.

    >>> import numpy as np, torch
    >>> meter = ClassMeter(np.array([0, 0, 1, 2]), workers=2)
    >>> meter.computed(0, torch.tensor([0, 2])); meter.computed(1, torch.tensor([3]))
    >>> meter.applied(0); meter.lost(1)
    >>> meter.applied_counts.tolist(), meter.data_counts.tolist()
    ([1, 1, 0], [2, 1, 1])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class ClassMeter:
    """Per worker, the class counts of its computations not yet applied; in all, those
    applied."""

    def __init__(self, labels: np.ndarray | torch.Tensor, workers: int, classes: int | None = None):
        labels = labels.cpu().numpy() if torch.is_tensor(labels) else np.asarray(labels)
        self.labels = labels.astype(np.int64).reshape(-1)
        self.classes = int(classes or (int(self.labels.max()) + 1 if len(self.labels) else 0))
        self.data_counts = np.bincount(self.labels, minlength=self.classes)
        self.pending = np.zeros((workers, self.classes), dtype=np.int64)
        self.applied_counts = np.zeros(self.classes, dtype=np.int64)

    def computed(self, worker: int, batch: Any) -> None:
        """``worker`` computed on ``batch`` (rows, or ``(rows, key)``)."""
        rows = batch[0] if isinstance(batch, tuple) else batch
        rows = rows.cpu().numpy() if torch.is_tensor(rows) else np.asarray(rows)
        self.pending[worker] += np.bincount(self.labels[rows], minlength=self.classes)

    def applied(self, worker: int) -> None:
        """``worker``'s push was applied: its computations since the last one count."""
        self.applied_counts += self.pending[worker]
        self.pending[worker] = 0

    def lost(self, worker: int) -> None:
        """``worker`` left: its computations not yet applied never will be."""
        self.pending[worker] = 0

    def shares(self) -> tuple[list[float], list[float]]:
        """(each class's share of the applied examples, its share of the data)."""
        applied, data = self.applied_counts, self.data_counts
        total_a, total_d = max(1, int(applied.sum())), max(1, int(data.sum()))
        return (applied / total_a).tolist(), (data / total_d).tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.pending.tolist(), "applied": self.applied_counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = np.asarray(state["pending"], dtype=np.int64).reshape(self.pending.shape)
        self.applied_counts = np.asarray(state["applied"], dtype=np.int64)
