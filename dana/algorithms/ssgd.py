"""SSGD: synchronous data-parallel SGD with momentum, the baseline for speed.

The master waits for all ``k`` gradients computed at the same ``theta``, averages them
and takes one momentum step ``v = m*v + mean(g); theta -= lr*v`` (Nesterov:
pulls see ``theta - lr*m*v``, Sutskever form). Runners drive it in rounds: every worker
pulls the same parameters, and a round costs the slowest worker's time. With one worker
it is momentum SGD (or Nesterov SGD).

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("ssgd", momentum=0.0).master(torch.zeros(1), workers=2)
    >>> master.push(0, torch.tensor([1.0]), lr=0.1), master.push(1, torch.tensor([3.0]), lr=0.1)
    (False, True)
    >>> master.theta
    tensor([-0.2000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.functional import momentum_step, nesterov_pull


class SsgdMaster(MasterRule):
    """SSGD's master (synchronous data-parallel SGD, as in Goyal et al. 2017): sums the
    ``k`` gradients of a round, then one momentum step with their mean,
    ``v = m*v + mean(g); theta -= lr*v``
    (:func:`~dana.algorithms.functional.momentum_step`); ``nesterov``: pulls send
    ``theta - lr*m*v`` (:func:`~dana.algorithms.functional.nesterov_pull`)."""

    state_keys = ("theta", "v", "acc", "received")

    def __init__(self, params: Tensor, workers: int, momentum: float, nesterov: bool):
        super().__init__(params, workers)
        self.momentum, self.nesterov = momentum, nesterov
        self.v = torch.zeros_like(self.theta)
        self.acc = torch.zeros_like(self.theta)
        self.received = 0

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        if self.nesterov:
            return nesterov_pull(self.theta, self.v, lr, self.momentum, out)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.acc.add_(message)
        self.received += 1
        if self.received < self.workers:
            return False
        momentum_step(self.theta, self.v, self.acc, self.momentum, lr, 1.0 / self.workers)
        self.acc.zero_()
        self.received = 0
        return True


@dataclass(frozen=True, kw_only=True)
class Ssgd(MomentumAlgorithm):
    """Synchronous SGD: one averaged momentum step per round of ``k`` gradients."""

    name = "ssgd"
    summary = "synchronous SGD: average k gradients per round, one momentum step"
    synchronous = True
    master_rule = SsgdMaster

    nesterov: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(nesterov=bool(self.nesterov))
