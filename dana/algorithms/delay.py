"""Rules that act on each push's delay: Ringmaster's cut-off and delay-adaptive steps.

The delay (staleness) ``s`` of a push is the number of master updates since the pull
that gave the worker its parameters; the master counts its updates and keeps the count
at each worker's pull (``k`` integers, nothing ``(k, d)``).

- ``ringmaster-asgd``: Maranjyan, Tyurin, Richtarik, "Ringmaster ASGD: The First
  Asynchronous SGD with Optimal Time Complexity" (ICML 2025). ASGD that applies a
  gradient only if its delay is below a threshold ``R``: ``theta -= lr*g`` if
  ``s < R``, else the gradient is dropped (the push does not move the master and is not
  an update). ``R`` defaults to ``2k`` (the paper sets ``R`` from constants a run does
  not know; see docs/ALGORITHMS.md). With ``R > k - 1`` and constant timing nothing is
  dropped and it is ASGD; with one worker (``s = 0``) it is SGD.
- ``delay-adaptive-asgd``: Mishchenko, Bach, Even, Woodworth, "Asynchronous SGD Beats
  Minibatch SGD Under Arbitrary Delays" (NeurIPS 2022). ASGD whose step shrinks for a
  gradient delayed beyond the concurrency ``C``: ``theta -= lr*min(1, C/s)*g``. ``C``
  defaults to the number of workers ``k``. A push of delay at most ``C`` is a full
  ASGD step, so with one worker it is SGD and with constant timing it is ASGD.

:func:`delay_adaptive_scale` is the step factor, shared with ``ormo-da``.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("ringmaster-asgd", R=1).master(torch.zeros(1), workers=2)
    >>> out = torch.empty(1)
    >>> _ = master.pull(0, 0.1, out), master.pull(1, 0.1, out)
    >>> master.push(0, torch.ones(1), lr=0.1), master.push(1, torch.ones(1), lr=0.1)
    (True, False)
    >>> master.theta  # worker 1's gradient had delay 1, not below R = 1: dropped
    tensor([-0.1000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, MasterRule


class CountsUpdates:
    """Mixin for a master rule: its update count and the count at each worker's pull.

    Call :meth:`init_counts` in ``__init__`` and :meth:`record_pull` in ``pull``; the
    rule adds ``updates`` after every push that moves its parameters.
    """

    workers: int
    pulled_at: Tensor
    updates: int

    def init_counts(self) -> None:
        self.pulled_at = torch.zeros(self.workers, dtype=torch.int64)
        self.updates = 0

    def record_pull(self, worker: int) -> None:
        self.pulled_at[worker] = self.updates

    def staleness(self, worker: int) -> int:
        """Master updates since ``worker``'s last pull."""
        return self.updates - int(self.pulled_at[worker])


def check_threshold(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1 (or None for the default), got {value!r}")
    return value


def delay_adaptive_scale(staleness: int, concurrency: int) -> float:
    """``min(1, C/s)``: a full step up to the concurrency ``C``, ``C/s`` beyond it."""
    return 1.0 if staleness <= concurrency else concurrency / staleness


class RingmasterMaster(CountsUpdates, MasterRule):
    """Ringmaster ASGD's master (Maranjyan, Tyurin, Richtarik, ICML 2025): a push of delay
    ``s < R`` takes the step ``theta -= lr*g``; one of delay ``s >= R`` is dropped (not
    an update); ``R = 2k`` unless given. Pulls send ``theta``."""

    state_keys = ("theta", "pulled_at", "updates", "dropped")

    def __init__(self, params: Tensor, workers: int, R: int | None):
        super().__init__(params, workers)
        self.R = 2 * workers if R is None else R
        self.init_counts()
        self.dropped = 0  # gradients dropped so far

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.record_pull(worker)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        if self.staleness(worker) >= self.R:
            self.dropped += 1
            return False
        self.theta.add_(message, alpha=-lr)
        self.updates += 1
        return True


@dataclass(frozen=True, kw_only=True)
class RingmasterAsgd(Algorithm):
    """ASGD that drops every gradient whose delay is ``R`` or more."""

    name = "ringmaster-asgd"
    summary = "ASGD that drops a gradient whose delay is R or more (default R = 2k)"
    master_rule = RingmasterMaster

    R: int | None = None  # None: 2k

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("R", self.R)


class DelayAdaptiveMaster(CountsUpdates, MasterRule):
    """The delay-adaptive master (Mishchenko, Bach, Even, Woodworth, NeurIPS 2022): a push
    of delay ``s`` takes the step ``theta -= lr*min(1, C/s)*g``
    (:func:`delay_adaptive_scale`), ``C`` the concurrency (``k`` unless given). Pulls
    send ``theta``."""

    state_keys = ("theta", "pulled_at", "updates")

    def __init__(self, params: Tensor, workers: int, concurrency: int | None):
        super().__init__(params, workers)
        self.concurrency = workers if concurrency is None else concurrency
        self.init_counts()

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.record_pull(worker)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        scale = delay_adaptive_scale(self.staleness(worker), self.concurrency)
        self.theta.add_(message, alpha=-lr * scale)
        self.updates += 1
        return True


@dataclass(frozen=True, kw_only=True)
class DelayAdaptive:
    """The hyper-parameter of a delay-adaptive rate ``lr*min(1, C/s)``: the concurrency
    ``C`` (None: ``k``), an integer >= 1. A base of the algorithms that take it, before
    their :class:`~dana.algorithms.base.Algorithm` base (its field comes last)."""

    concurrency: int | None = None  # None: k

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("concurrency", self.concurrency)

    def concurrency_for(self, workers: int) -> int:
        """``C`` in a run of ``workers`` workers."""
        return workers if self.concurrency is None else self.concurrency


@dataclass(frozen=True, kw_only=True)
class DelayAdaptiveAsgd(DelayAdaptive, Algorithm):
    """ASGD with the step ``lr*min(1, C/s)`` for a push of delay ``s``."""

    name = "delay-adaptive-asgd"
    summary = "ASGD with step lr*min(1, C/delay), C the concurrency (default k)"
    master_rule = DelayAdaptiveMaster
