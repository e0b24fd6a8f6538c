"""ASGD and its momentum variants: the baselines DANA is measured against.

- ``asgd``: plain asynchronous SGD, ``theta -= lr * g`` (Recht et al. 2011; Dean et
  al. 2012). With one worker it is SGD.
- ``nag-asgd``: one master momentum ``v`` shared by all workers, Nesterov look-ahead on
  pull: ``v = m*v + g; theta -= lr*v``, pull sends ``theta - lr*m*v``. With one worker
  it is Nesterov SGD in Sutskever form.
- ``multi-asgd``: one momentum per worker, ``v_i = m*v_i + g; theta -= lr*v_i``, pull
  sends ``theta``. With one worker it is ``torch.optim.SGD(momentum=m)``.

Example::

    >>> import torch, dana.algorithms as A
    >>> algo = A.build("nag-asgd", momentum=0.9)
    >>> master = algo.master(torch.zeros(3), workers=2)
    >>> master.push(0, torch.ones(3), lr=0.1)
    True
    >>> master.pull(1, lr=0.1, out=torch.empty(3))
    tensor([-0.1900, -0.1900, -0.1900])
"""

from __future__ import annotations

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, MasterRule, MomentumAlgorithm
from dana.algorithms.functional import momentum_step, nesterov_pull


class AsgdMaster(MasterRule):
    """ASGD's master (Recht et al. 2011; Dean et al. 2012): ``theta -= lr*g`` per push,
    pulls send ``theta``."""

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.theta.add_(message, alpha=-lr)
        return True


class Asgd(Algorithm):
    """Asynchronous SGD without momentum: ``theta -= lr * g`` on every push."""

    name = "asgd"
    summary = "asynchronous SGD, no momentum: theta -= lr*g"
    master_rule = AsgdMaster


class NagAsgdMaster(MasterRule):
    """NAG-ASGD's master: one shared momentum, ``v = m*v + g; theta -= lr*v``
    (:func:`~dana.algorithms.functional.momentum_step`); a pull sends the Nesterov
    look-ahead ``theta - lr*m*v`` (:func:`~dana.algorithms.functional.nesterov_pull`;
    Sutskever et al. 2013)."""

    state_keys = ("theta", "v")

    def __init__(self, params: Tensor, workers: int, momentum: float):
        super().__init__(params, workers)
        self.momentum = momentum
        self.v = torch.zeros_like(self.theta)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        return nesterov_pull(self.theta, self.v, lr, self.momentum, out)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        momentum_step(self.theta, self.v, message, self.momentum, lr)
        return True


class NagAsgd(MomentumAlgorithm):
    """ASGD with one Nesterov momentum at the master (look-ahead on pull)."""

    name = "nag-asgd"
    summary = "ASGD with one shared Nesterov momentum at the master"
    master_rule = NagAsgdMaster


class MultiAsgdMaster(MasterRule):
    """Multi-ASGD's master (a baseline of Hakimi et al., arXiv 1907.11612): one heavy-ball
    momentum per worker (Polyak 1964), ``v_i = m*v_i + g; theta -= lr*v_i``
    (:func:`~dana.algorithms.functional.momentum_step`); pulls send ``theta``."""

    state_keys = ("theta", "v")

    def __init__(self, params: Tensor, workers: int, momentum: float):
        super().__init__(params, workers)
        self.momentum = momentum
        self.v = self.per_worker_zeros()

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        momentum_step(self.theta, self.v[worker], message, self.momentum, lr)
        return True


class MultiAsgd(MomentumAlgorithm):
    """ASGD with one momentum vector per worker at the master."""

    name = "multi-asgd"
    summary = "ASGD with one momentum vector per worker at the master"
    master_rule = MultiAsgdMaster
