"""OrMo: ordered momentum for asynchronous SGD, and its delay-adaptive variant.

Shi, Yang, Li, "Ordered Momentum for Asynchronous SGD" (NeurIPS 2024). In momentum SGD
a gradient computed at iteration ``j`` enters every later step ``t >= j`` with weight
``lr * m**(t - j)``. OrMo keeps that order in asynchronous SGD: a gradient is added to
the momentum by the iteration index of the parameters it was computed at, not by when it
arrives. The master keeps ``theta``, one momentum ``u`` (in units of parameters: the
rate is inside it), its update count and the count at each worker's pull. A push of
delay ``s`` (``j = t - s``):

1. catch up the steps it missed: ``theta -= lr * (1 - m**s)/(1 - m) * g``;
2. enter the momentum with the weight it has at step ``t``: ``u += m**s * lr * g``;
3. the momentum step: ``theta -= u; u *= m``.

A fresh push (``s = 0``) is a step of heavy-ball momentum SGD, so with one worker (and
a constant rate) ``ormo`` is ``torch.optim.SGD(momentum=m)``, and with ``m = 0`` it is
ASGD; every gradient's total
weight over the run is ``lr/(1 - m)``, as in momentum SGD, whatever its delay. The
paper's text was not at hand in full while this was written: this is the rule as its
stated principle (momentum ordered by iteration index) determines it; docs/ALGORITHMS.md
says what is left open.

``ormo-da`` uses the delay-adaptive rate ``lr*min(1, C/s)`` of Mishchenko et al. 2022
(:func:`dana.algorithms.delay.delay_adaptive_scale`, ``C`` the concurrency, default
``k``) for the push's steps 1 and 2.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("ormo", momentum=0.5).master(torch.zeros(1), workers=2)
    >>> out = torch.empty(1)
    >>> _ = master.pull(0, 1.0, out), master.pull(1, 1.0, out)
    >>> _ = master.push(0, torch.ones(1), lr=1.0)  # fresh: theta = -1, u = 0.5
    >>> _ = master.push(1, torch.ones(1), lr=1.0)  # delay 1: catch up 1, u = 0.5 + 0.5
    >>> master.theta
    tensor([-3.])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.delay import CountsUpdates, check_threshold, delay_adaptive_scale


class OrMoMaster(CountsUpdates, MasterRule):
    """OrMo's master (Shi, Yang, Li, NeurIPS 2024): a push of delay ``s`` catches up the
    steps it missed, ``theta -= lr*(1 - m**s)/(1 - m)*g``, enters the momentum with the
    weight it has now, ``u += m**s*lr*g``, then ``theta -= u; u *= m``. With
    ``concurrency`` (``ormo-da``) the rate is ``lr*min(1, C/s)`` (Mishchenko et al.,
    NeurIPS 2022). Pulls send ``theta``."""

    state_keys = ("theta", "u", "pulled_at", "updates")

    def __init__(
        self, params: Tensor, workers: int, momentum: float, concurrency: int | None = None
    ):
        super().__init__(params, workers)
        self.momentum = momentum
        self.adaptive = concurrency is not None
        self.concurrency = concurrency
        self.u = torch.zeros_like(self.theta)
        self.init_counts()

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.record_pull(worker)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        s, m = self.staleness(worker), self.momentum
        if self.adaptive:
            lr = lr * delay_adaptive_scale(s, self.concurrency)
        if s > 0:  # the weights m**0 + ... + m**(s-1) of the steps it missed
            self.theta.add_(message, alpha=-lr * (1.0 - m**s) / (1.0 - m))
        self.u.add_(message, alpha=lr * m**s)
        self.theta.sub_(self.u)
        self.u.mul_(m)
        self.updates += 1
        return True


class OrMo(MomentumAlgorithm):
    """Asynchronous SGD with the momentum ordered by the gradients' iteration indexes."""

    name = "ormo"
    summary = "ordered momentum: each gradient enters the momentum by its iteration index"
    master_rule = OrMoMaster


@dataclass(frozen=True, kw_only=True)
class OrMoDa(MomentumAlgorithm):
    """OrMo with the delay-adaptive rate ``lr*min(1, C/s)``."""

    name = "ormo-da"
    summary = "OrMo with the delay-adaptive rate lr*min(1, C/delay), C default k"
    master_rule = OrMoMaster

    concurrency: int | None = None  # None: k

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("concurrency", self.concurrency)

    def master(self, params: Tensor, workers: int) -> MasterRule:
        c = workers if self.concurrency is None else self.concurrency
        return OrMoMaster(params, workers, self.momentum, concurrency=c)
