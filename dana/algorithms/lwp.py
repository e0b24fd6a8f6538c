"""Linear weight prediction: pull where the master's momentum will have taken it.

Kosson, Chiley, Venigalla, Hestness, Köster, "Pipelined Backpropagation at Scale:
Training Large Models without Batches" (MLSys 2021). In pipelined backpropagation a
gradient is applied ``D`` steps after the weights it was computed at were read; the
weights are read as a linear prediction of where momentum SGD will have moved them by
then, ``w - lr*D*v`` (the velocity ``v`` held constant over the ``D`` steps).

In the three events (pull, compute, push) this is a pull rule: the master runs
heavy-ball momentum ASGD (``v = m*v + g; theta -= lr*v``, one shared ``v``) and a pull
of worker ``i`` sends ``theta - lr*D_i*v``, with ``D_i`` the number of master updates
expected before its gradient lands. ``D_i`` is ``horizon`` when given; by default, the
delay of worker ``i``'s previous push (``k - 1`` with constant timing; 0 before its
first push, so its first pull is not predicted). With one worker every delay is 0: it
is ``torch.optim.SGD(momentum=m)``, as ``multi-asgd``; ``horizon = 1`` sends
``theta - lr*v``, one step further than ``nag-asgd``'s ``theta - lr*m*v``.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("lwp-asgd", momentum=0.5, horizon=3).master(torch.zeros(1), 2)
    >>> _ = master.push(0, torch.ones(1), lr=0.1)  # v = 1, theta = -0.1
    >>> master.pull(1, 0.1, torch.empty(1))  # -0.1 - 0.1*3*1
    tensor([-0.4000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.delay import CountsUpdates
from dana.algorithms.functional import momentum_step, nesterov_pull


class LwpMaster(CountsUpdates, MasterRule):
    """The linear-weight-prediction master (Kosson et al., MLSys 2021): heavy-ball
    momentum ASGD, ``v = m*v + g; theta -= lr*v``
    (:func:`~dana.algorithms.functional.momentum_step`); a pull of worker ``i`` sends the
    prediction ``theta - lr*D_i*v`` (:func:`~dana.algorithms.functional.nesterov_pull`
    ``D_i`` steps ahead), ``D_i`` the ``horizon`` or the delay of ``i``'s last push."""

    state_keys = ("theta", "v", "pulled_at", "updates", "last_delay")

    def __init__(self, params: Tensor, workers: int, momentum: float, horizon: int | None):
        super().__init__(params, workers)
        self.momentum, self.horizon = momentum, horizon
        self.v = torch.zeros_like(self.theta)
        self.init_counts()
        self.last_delay = torch.zeros(workers, dtype=torch.int64)  # of each worker's last push

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.record_pull(worker)
        D = int(self.last_delay[worker]) if self.horizon is None else self.horizon
        return nesterov_pull(self.theta, self.v, lr, 1.0, out, steps=D)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.last_delay[worker] = self.staleness(worker)
        momentum_step(self.theta, self.v, message, self.momentum, lr)
        self.updates += 1
        return True


@dataclass(frozen=True, kw_only=True)
class LwpAsgd(MomentumAlgorithm):
    """Momentum ASGD whose pulls send the linear prediction ``theta - lr*D*v``."""

    name = "lwp-asgd"
    summary = "momentum ASGD, pull at the linear prediction theta - lr*D*v (D: the delay)"
    master_rule = LwpMaster

    horizon: int | None = None  # None: the worker's last delay

    def __post_init__(self) -> None:
        super().__post_init__()
        h = self.horizon
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 0):
            raise ValueError(f"horizon must be an integer >= 0 (or None), got {h!r}")
