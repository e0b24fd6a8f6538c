"""SA-ASGD: staleness-aware ASGD, each gradient's learning rate divided by its staleness.

Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep Learning"
(IJCAI 2016). The master counts its updates and remembers the count at each worker's
pull (``k`` integers); a push of staleness ``s`` (updates since that pull) is applied
with ``lr / max(s, 1)``: ``v = m*v + g/max(s, 1); theta -= lr*v`` (``m = 0``: plain
``theta -= lr/max(s, 1) * g``). With constant timing and ``k`` workers every push after
the first round has staleness ``k - 1``, so it runs at ``lr / (k - 1)``; with one
worker it is SGD (momentum SGD).

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("sa-asgd", momentum=0.0).master(torch.zeros(1), workers=3)
    >>> out = torch.empty(1)
    >>> _ = [master.pull(i, 0.1, out) for i in range(3)]
    >>> _ = [master.push(i, torch.tensor([1.0]), lr=0.1) for i in range(3)]  # s = 0, 1, 2
    >>> master.theta  # -0.1 * (1 + 1/1 + 1/2)
    tensor([-0.2500])
"""

from __future__ import annotations

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.functional import momentum_step


class SaAsgdMaster(MasterRule):
    """SA-ASGD's master (Zhang et al., IJCAI 2016): counts updates and each worker's
    count at its pull; a push of staleness ``s`` takes a momentum step with its gradient
    scaled by ``1/max(s, 1)`` (:func:`~dana.algorithms.functional.momentum_step`)."""

    state_keys = ("theta", "v", "pulled_at", "updates")

    def __init__(self, params: Tensor, workers: int, momentum: float):
        super().__init__(params, workers)
        self.momentum = momentum
        self.v = torch.zeros_like(self.theta) if momentum > 0 else None
        self.pulled_at = torch.zeros(workers, dtype=torch.int64)  # updates at each pull
        self.updates = 0

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.pulled_at[worker] = self.updates
        return out.copy_(self.theta)

    def staleness(self, worker: int) -> int:
        """Master updates since ``worker``'s last pull."""
        return self.updates - int(self.pulled_at[worker])

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        scale = 1.0 / max(self.staleness(worker), 1)
        momentum_step(self.theta, self.v, message, self.momentum, lr, scale)
        self.updates += 1
        return True


class SaAsgd(MomentumAlgorithm):
    """ASGD with each push's learning rate divided by its staleness (optional momentum)."""

    name = "sa-asgd"
    summary = "staleness-aware ASGD: lr/max(staleness, 1) per push, optional momentum"
    master_rule = SaAsgdMaster
