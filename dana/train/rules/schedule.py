"""The learning-rate schedule: linear warm-up, then step decay.

As in the DANA authors' code: over the first ``warmup_epochs`` the rate grows linearly,
per update, from ``lr / workers`` to ``lr``; afterwards it is multiplied by
``decay_factor`` (0.1) at each epoch in ``decay_epochs``. Progress is measured in epochs
of data consumed (fractional), so asynchronous runs and SSGD's rounds share one clock;
:func:`next_rate` says where a runner reads it.

    >>> s = LRSchedule(0.1, workers=4, warmup_epochs=1, decay_epochs=(2,))
    >>> s(0.0), s(0.5), s(1.5), s(2.0)
    (0.025, 0.0625, 0.1, 0.010000000000000002)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    workers: int = 1
    warmup_epochs: float = 0.0
    decay_epochs: Sequence[float] = field(default_factory=tuple)
    decay_factor: float = 0.1

    def __post_init__(self) -> None:
        check_lr(self.lr)
        if not self.warmup_epochs >= 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {self.warmup_epochs!r}")
        if not 0 < self.decay_factor <= 1:
            raise ValueError(f"decay_factor must be in (0, 1], got {self.decay_factor!r}")
        epochs = tuple(float(e) for e in self.decay_epochs)
        if any(e <= 0 for e in epochs) or list(epochs) != sorted(epochs):
            raise ValueError(
                f"decay_epochs must be positive and increasing, got {list(self.decay_epochs)}"
            )
        object.__setattr__(self, "decay_epochs", epochs)

    def __call__(self, epoch: float) -> float:
        """The learning rate at ``epoch`` (fractional epochs of data consumed)."""
        if epoch < self.warmup_epochs:
            start = self.lr / self.workers
            lr = start + (self.lr - start) * epoch / self.warmup_epochs
        else:
            lr = self.lr
        return lr * self.decay_factor ** bisect.bisect_right(self.decay_epochs, epoch)


def check_lr(lr: float) -> float:
    """``lr``, checked: a positive, finite number (ValueError otherwise)."""
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    return lr


def constant_schedule(lr: float) -> Callable[[float], float]:
    """A rate of ``lr`` at every epoch (:func:`check_lr`)."""
    check_lr(lr)
    return lambda epoch: lr


def next_rate(
    schedule: Callable[[float], float],
    steps: int,
    updates: int,
    workers: int,
    batches_per_epoch: int,
    synchronous: bool,
    round_steps: int = 1,
) -> float:
    """The learning rate of a runner's next update: ``schedule`` read at a fractional epoch.

    Asynchronous: every gradient computation is an update, read at the data consumed so
    far, ``steps / batches_per_epoch``. Synchronous (``ssgd``, ``diloco``): a round of
    ``workers`` workers' ``round_steps`` computations each is one update, read once at the
    round's start, ``updates * workers * round_steps / batches_per_epoch``, so that every
    step and push of the round carries the rate of the data consumed before it (round
    ``r`` reads the schedule at epoch ``r * workers * round_steps / batches_per_epoch``).
    The simulator and the shard servers both read it here.
    """
    if synchronous:
        return schedule(updates * workers * round_steps / batches_per_epoch)
    return schedule(steps / batches_per_epoch)
