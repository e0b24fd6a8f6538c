"""DC-ASGD: delay-compensated ASGD.

Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous Stochastic Gradient Descent with
Delay Compensation" (ICML 2017). The master remembers the parameters ``p_i`` it sent to
each worker and compensates each gradient with a cheap diagonal estimate of the Hessian,
``g~ = g + lc * g*g * (theta - p_i)``, then takes a momentum step (``m = 0.9`` by default, as for every momentum method here):
``v = m*v + g~; theta -= lr*v`` (``m = 0``: plain ``theta -= lr*g~``).

``lc`` defaults to 0.04 (the paper's constant variant, DC-ASGD-c). With
``adaptive=True`` (DC-ASGD-a) the coefficient is ``lc / sqrt(ms + eps)`` element-wise,
``ms`` a moving average (decay ``ms_decay = 0.95``) of ``g*g``; that paper uses
``lc = 2`` there. With ``lc = 0`` it is momentum ASGD.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("dc-asgd", momentum=0.0, lc=0.5).master(torch.zeros(1), 2)
    >>> _ = master.pull(0, 0.1, torch.empty(1)), master.pull(1, 0.1, torch.empty(1))
    >>> _ = master.push(0, torch.tensor([2.0]), lr=0.1), master.push(1, torch.tensor([2.0]), lr=0.1)
    >>> master.theta  # the second gradient: 2 + 0.5*4*(-0.2 - 0) = 1.6
    tensor([-0.3600])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import (
    MasterRule,
    MomentumAlgorithm,
    RemembersPulls,
    check_decay,
    check_nonnegative,
    check_positive,
)
from dana.algorithms.functional import delay_compensate, momentum_step


class DcAsgdMaster(RemembersPulls, MasterRule):
    """DC-ASGD's master (Zheng et al., ICML 2017): remembers each worker's ``p_i``,
    compensates ``g~ = g + lc*g*g*(theta - p_i)``
    (:func:`~dana.algorithms.functional.delay_compensate`; ``adaptive``: ``lc`` divided
    by ``sqrt(ms + eps)``, ``ms`` the moving average of ``g*g``), then
    ``v = m*v + g~; theta -= lr*v`` (:func:`~dana.algorithms.functional.momentum_step`)."""

    state_keys = ("theta", "v", "sent", "ms")

    def __init__(
        self,
        params: Tensor,
        workers: int,
        momentum: float,
        lc: float,
        adaptive: bool,
        ms_decay: float,
        eps: float,
    ):
        super().__init__(params, workers)
        self.momentum, self.lc, self.ms_decay, self.eps = momentum, lc, ms_decay, eps
        self.v = torch.zeros_like(self.theta) if momentum > 0 else None
        self.sent = self.per_worker_zeros()
        self.ms = torch.zeros_like(self.theta) if adaptive else None
        self._g = torch.empty_like(self.theta)
        self._lc = torch.empty_like(self.theta) if adaptive else None

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        lc: Tensor | float = self.lc
        if self.ms is not None:
            self.ms.mul_(self.ms_decay).addcmul_(message, message, value=1.0 - self.ms_decay)
            lc = torch.add(self.ms, self.eps, out=self._lc).rsqrt_().mul_(self.lc)
        g = delay_compensate(message, self.theta, self.sent[worker], lc, self._g)
        momentum_step(self.theta, self.v, g, self.momentum, lr)
        return True


@dataclass(frozen=True, kw_only=True)
class DcAsgd(MomentumAlgorithm):
    """ASGD with DC-ASGD's delay compensation (constant or adaptive coefficient)."""

    name = "dc-asgd"
    summary = "delay-compensated ASGD: g + lc*g*g*(theta - p_i), optional momentum"
    master_rule = DcAsgdMaster

    lc: float = 0.04
    adaptive: bool = False
    ms_decay: float = 0.95
    eps: float = 1e-7

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(
            lc=check_nonnegative("lc", self.lc),
            adaptive=bool(self.adaptive),
            ms_decay=check_decay("ms_decay", self.ms_decay),
            eps=check_positive("eps", self.eps),
        )
