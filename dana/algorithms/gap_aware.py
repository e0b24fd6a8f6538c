"""Gap-Aware: a staleness penalty proportional to how far the master moved.

Barkai, Hakimi, Schuster, "Gap Aware Mitigation of Gradient Staleness" (ICLR 2020).
Each gradient is divided element-wise by ``G = 1 + |q_i - p_i| / C``, where ``q_i`` is
what the master would send worker ``i`` now (NAG-ASGD's look-ahead ``theta - lr*m*v``,
DANA-Zero's ``theta - lr*m*S``) and ``p_i`` what it sent: zero when no push landed in
between, so a fresh push is not penalised and with one worker ``gap-aware`` is NAG-ASGD
and ``dana-ga`` DANA-Zero (the paper stores the look-ahead as the parameters, so its gap
is this one). ``C = lr_max * (sqrt(ema) + eps)`` is the typical size of one step per parameter:
``ema`` is a bias-corrected moving average (decay 0.999) of the squared step direction
(the momentum buffer, or the gradient when ``m = 0``) and ``lr_max`` the largest learning
rate seen so far. The weight-decay part of ``g`` is penalised the same way, since it is
part of ``g``. Before any step there is no scale yet and no penalty.

``gap-aware`` applies the penalty to NAG-ASGD; ``dana-ga`` (in :mod:`dana.algorithms.dana`)
to DANA-Zero.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("gap-aware", momentum=0.9).master(torch.zeros(2), workers=2)
    >>> _ = master.pull(0, 0.1, torch.empty(2)), master.pull(1, 0.1, torch.empty(2))
    >>> master.push(0, torch.ones(2), lr=0.1)
    True
    >>> master.theta  # worker 1 computed at the old theta: its push is damped below
    tensor([-0.1000, -0.1000])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.asgd import NagAsgdMaster
from dana.algorithms.base import (
    MomentumAlgorithm,
    RemembersPulls,
    check_decay,
    check_positive,
)
from dana.algorithms.functional import gap_penalty


class GapPenalty:
    """The penalty's state and arithmetic, mixed into a master that has ``theta`` and
    remembers its pulls (:class:`~dana.algorithms.base.RemembersPulls`)."""

    theta: Tensor
    workers: int
    sent: Tensor
    peek: Callable[[int, float, Tensor], Tensor]

    def __init__(self, ema_decay: float, eps: float):
        self.ema_decay, self.eps = ema_decay, eps
        self.sent = self.per_worker_zeros()
        self.ema = torch.zeros_like(self.theta)
        self.ema_steps = 0
        self.lr_max = 0.0
        self._penalty = torch.empty_like(self.theta)
        self._scaled = torch.empty_like(self.theta)

    def penalize(self, worker: int, g: Tensor, lr: float) -> Tensor:
        """``g / (1 + |q_i - p_i| / C)``, in a buffer of the master's."""
        self.lr_max = max(self.lr_max, float(lr))
        if self.ema_steps == 0:
            return g
        bias = 1.0 - self.ema_decay**self.ema_steps
        C = self._penalty
        torch.div(self.ema, bias, out=C).sqrt_().add_(self.eps).mul_(self.lr_max)
        q = self.peek(worker, lr, self._scaled)
        return gap_penalty(g, q, self.sent[worker], C, out=self._scaled)

    def observe(self, direction: Tensor) -> None:
        """Fold this step's direction into the moving average of its square."""
        self.ema.mul_(self.ema_decay).addcmul_(direction, direction, value=1.0 - self.ema_decay)
        self.ema_steps += 1


class GapAwareMaster(RemembersPulls, NagAsgdMaster, GapPenalty):
    """Gap-Aware's master (Barkai et al., ICLR 2020): NAG-ASGD's, each gradient first
    divided by ``1 + |q_i - p_i| / C`` (:func:`~dana.algorithms.functional.gap_penalty`);
    the scale follows the momentum buffer (the gradient when ``m = 0``)."""

    state_keys = ("theta", "v", "sent", "ema", "ema_steps", "lr_max")

    def __init__(self, params: Tensor, workers: int, momentum: float, ema_decay: float, eps: float):
        NagAsgdMaster.__init__(self, params, workers, momentum)
        GapPenalty.__init__(self, ema_decay, eps)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        g = self.penalize(worker, message, lr)
        super().push(worker, g, lr)
        self.observe(self.v if self.momentum > 0 else g)
        return True


@dataclass(frozen=True, kw_only=True)
class GapPenaltyAlgorithm(MomentumAlgorithm):
    """The penalty's hyper-parameters (``gap-aware``, ``dana-ga``): the decay of the moving
    average of squared steps, and the ``eps`` added to its square root."""

    ema_decay: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(
            ema_decay=check_decay("ema_decay", self.ema_decay),
            eps=check_positive("eps", self.eps),
        )


class GapAware(GapPenaltyAlgorithm):
    """NAG-ASGD with each gradient divided by its normalised gap."""

    name = "gap-aware"
    summary = "NAG-ASGD with the Gap-Aware penalty g / (1 + |q_i - p_i| / C)"
    master_rule = GapAwareMaster
