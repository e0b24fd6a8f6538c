"""SMEGA2: one momentum vector whatever ``k`` is, and an estimate of the future parameters.

Cohen, Hakimi, Schuster, "SMEGA2: Distributed Asynchronous Deep Neural Network Training
With a Single Momentum Buffer" (ICPP 2022); public code: rafi-cohen/SMEGA2,
``smega2.py``. The master keeps ``theta``, one momentum ``v``, a buffer ``b`` of the
gradients of the current momentum cycle and its position ``c`` in the cycle of ``N``
pushes (``N`` defaults to ``k``: each worker's gradient enters the momentum once per
cycle, as one averaged gradient would in synchronous SGD). A push of ``g``:

- ``b += g``; ``theta -= lr * (g + m*v)`` (``v`` before this push);
- the ``N``-th push of a cycle ends it: ``v = m*v + b/N``, ``b = 0``.

A pull sends the estimate of the parameters ``N`` pushes ahead: the momentum part of the
coming pushes, ``N*m*v`` now and the buffered gradients' share once the momentum is
updated mid-way, ``theta - lr*m*((N + c*(m - 1))*v + (c/N)*b)`` (the authors' "advanced"
estimate; ``advanced=False``: ``theta - lr*m*N*v``), at the rate ``lr`` of the last
push, as the authors' ``estimate()`` reads the optimizer's rate right after its
``step()`` (``trainer.py``: ``optimizer.step()`` then ``optimizer.estimate()``); the
runners' pull passes the next update's rate, which differs from it only while the
schedule moves.

With ``N = 1`` (so also with one worker) ``v = m*v + g`` and ``theta -= lr*v`` on every
push and pulls see ``theta - lr*m*v``: with a constant rate it is ``nag-asgd``, Nesterov
SGD for one worker (under a schedule the two pull at the last and the next rate).

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("smega2", momentum=0.5).master(torch.zeros(1), workers=2)
    >>> _ = master.push(0, torch.ones(1), lr=1.0), master.push(1, torch.ones(1), lr=1.0)
    >>> master.theta, master.v  # v = 0.5*0 + (1 + 1)/2 at the cycle's end
    (tensor([-2.]), tensor([1.]))
    >>> master.pull(0, 1.0, torch.empty(1))  # -2 - 1*0.5*(2 + 0)*1
    tensor([-3.])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.delay import check_threshold
from dana.algorithms.functional import momentum_update, nesterov_pull


class Smega2Master(MasterRule):
    """SMEGA2's master (Cohen, Hakimi, Schuster, ICPP 2022): a push of ``g`` buffers it,
    ``b += g``, and steps ``theta -= lr*(g + m*v)``; the ``N``-th push of a cycle updates
    the one momentum, ``v = m*v + b/N``
    (:func:`~dana.algorithms.functional.momentum_update`). A pull sends the estimate
    ``N`` pushes ahead at the last push's rate, ``theta - lr*m*((N + c*(m-1))*v + (c/N)*b)``
    (:func:`~dana.algorithms.functional.nesterov_pull` that many steps ahead, plus the
    buffer's share; ``advanced=False``: ``theta - lr*m*N*v``)."""

    state_keys = ("theta", "v", "b", "c", "last_lr")

    def __init__(
        self, params: Tensor, workers: int, momentum: float, cycle: int | None, advanced: bool
    ):
        super().__init__(params, workers)
        self.momentum, self.advanced = momentum, advanced
        self.cycle = workers if cycle is None else cycle
        self.v = torch.zeros_like(self.theta)
        self.b = torch.zeros_like(self.theta)
        self.c = 0  # pushes of the current cycle so far
        self.last_lr = 0.0  # the rate of the last push (before any: v = b = 0, unused)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        # The estimate is made at the rate of the last step, as the authors' estimate()
        # reads the optimizer's rate right after step() (rafi-cohen/SMEGA2, trainer.py).
        lr = self.last_lr
        m, N, c = self.momentum, self.cycle, self.c
        if not self.advanced:
            return nesterov_pull(self.theta, self.v, lr, m, out, steps=N)
        nesterov_pull(self.theta, self.v, lr, m, out, steps=N + c * (m - 1.0))
        if c:
            out.add_(self.b, alpha=-lr * m * c / N)
        return out

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        m = self.momentum
        self.last_lr = float(lr)
        self.b.add_(message)
        self.theta.add_(message, alpha=-lr).add_(self.v, alpha=-lr * m)
        self.c = (self.c + 1) % self.cycle
        if self.c == 0:
            momentum_update(self.v, self.b, m, 1.0 / self.cycle)
            self.b.zero_()
        return True


@dataclass(frozen=True, kw_only=True)
class Smega2(MomentumAlgorithm):
    """One master momentum updated once per cycle of ``N`` pushes; pulls see its estimate."""

    name = "smega2"
    summary = "one momentum updated every N = k pushes; pulls see the estimate N pushes ahead"
    master_rule = Smega2Master

    cycle: int | None = None  # None: k
    advanced: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("cycle", self.cycle)
        self._set(advanced=bool(self.advanced))
