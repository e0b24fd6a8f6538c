"""OrMo: ordered momentum for asynchronous SGD, and its delay-adaptive variant.

Shi, Yang, Li, "Ordered Momentum for Asynchronous SGD" (NeurIPS 2024, arXiv 2407.19234).
Synchronous momentum SGD with ``K`` workers takes one heavy-ball step per iteration of
``K`` gradients; its momentum weights a gradient of iteration ``j`` by ``m**(I - j)`` at
iteration ``I`` (the paper's Figure 1, ``K = 4``). OrMo keeps that order in asynchronous
SGD: the master counts iterations as **groups** of ``K`` pushes (``K = group``, default
the worker count ``k``), a gradient belongs to the group in progress at its worker's
pull (``j``), and a push in group ``I`` (``s = I - j``):

1. catches up the group steps it missed: ``theta -= lr*(1 - m**s)/(1 - m)*g``;
2. enters the momentum with the weight it has now: ``u += m**s*lr*g``;
3. the group's first push takes the group's momentum step with it, ``theta -= u``; every
   other push only its own share, ``theta -= m**s*lr*g``;
4. the group's last push decays the momentum: ``u *= m``.

So the momentum steps once per group of ``K`` pushes (at the group's first push, so that
one worker is heavy-ball momentum SGD, ``torch.optim.SGD(momentum=m)``), with ``m = 0``
it is ASGD, and after any pushes a gradient of group ``j`` has moved ``theta`` by
``lr*g*(1 - m**(c - j + 1))/(1 - m)`` (``c``: the group of the last push), whatever its
arrival. With ``K = 1`` it is the per-push rule ``ormo-push`` exactly (the same
arithmetic), where the momentum steps at every push. Algorithm 1 of the paper was not at
hand: docs/ALGORITHMS.md says what is read from where and what is open.

``ormo-da`` (and ``ormo-da-push``) use the delay-adaptive rate ``lr*min(1, C/tau)`` of
Mishchenko et al. 2022 (:func:`dana.algorithms.delay.delay_adaptive_scale`, ``tau`` the
push's delay in pushes, ``C`` the concurrency, default ``k``) for steps 1 to 3.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("ormo", momentum=0.5).master(torch.zeros(1), workers=2)
    >>> out = torch.empty(1)
    >>> _ = master.pull(0, 1.0, out), master.pull(1, 1.0, out)
    >>> _ = master.push(0, torch.ones(1), lr=1.0)  # group 0 opens: theta = -1, u = 1
    >>> _ = master.push(1, torch.ones(1), lr=1.0)  # group 0 closes: theta = -2, u = 0.5*2
    >>> _ = master.pull(0, 1.0, out), master.pull(1, 1.0, out)  # both in group 1
    >>> _ = master.push(0, torch.ones(1), lr=1.0)  # momentum step 1 and its own 1
    >>> master.theta
    tensor([-4.])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.delay import (
    CountsUpdates,
    DelayAdaptive,
    check_threshold,
    delay_adaptive_scale,
)


class OrMoMaster(CountsUpdates, MasterRule):
    """OrMo's master (Shi, Yang, Li, NeurIPS 2024), iterations as groups of ``K`` pushes:
    a push of group delay ``s`` catches up ``theta -= lr*(1 - m**s)/(1 - m)*g`` and
    enters ``u += m**s*lr*g``; a group's first push steps ``theta -= u``, the others
    ``theta -= m**s*lr*g``; a group's last push sets ``u *= m``. With ``concurrency``
    (``ormo-da``) the rate is ``lr*min(1, C/tau)`` (Mishchenko et al., NeurIPS 2022),
    ``tau`` the delay in pushes. Pulls send ``theta``."""

    state_keys = ("theta", "u", "pulled_at", "updates")

    def __init__(
        self,
        params: Tensor,
        workers: int,
        momentum: float,
        group: int | None = None,
        concurrency: int | None = None,
    ):
        super().__init__(params, workers)
        self.momentum = momentum
        self.group = workers if group is None else group
        self.adaptive = concurrency is not None
        self.concurrency = concurrency
        self.u = torch.zeros_like(self.theta)
        self.init_counts()

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.record_pull(worker)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        K, m, t = self.group, self.momentum, self.updates
        if self.adaptive:
            lr = lr * delay_adaptive_scale(self.staleness(worker), self.concurrency)
        s = t // K - int(self.pulled_at[worker]) // K  # groups since the pull
        if s > 0:  # the weights m**0 + ... + m**(s-1) of the group steps it missed
            self.theta.add_(message, alpha=-lr * (1.0 - m**s) / (1.0 - m))
        self.u.add_(message, alpha=lr * m**s)
        if t % K == 0:  # the group's momentum step, with this gradient's share
            self.theta.sub_(self.u)
        else:
            self.theta.add_(message, alpha=-lr * m**s)
        if t % K == K - 1:
            self.u.mul_(m)
        self.updates += 1
        return True


@dataclass(frozen=True, kw_only=True)
class OrMo(MomentumAlgorithm):
    """Asynchronous SGD with the momentum ordered by iteration, an iteration a group of
    ``K`` pushes."""

    name = "ormo"
    summary = "ordered momentum: gradients weighted by iteration, one per K pushes (K = k)"
    master_rule = OrMoMaster

    group: int | None = None  # K; None: k

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("group", self.group)


@dataclass(frozen=True, kw_only=True)
class OrMoDa(DelayAdaptive, OrMo):
    """OrMo with the delay-adaptive rate ``lr*min(1, C/tau)``."""

    name = "ormo-da"
    summary = "OrMo with the delay-adaptive rate lr*min(1, C/delay), C default k"

    def master(self, params: Tensor, workers: int) -> MasterRule:
        c = self.concurrency_for(workers)
        return OrMoMaster(params, workers, self.momentum, self.group, concurrency=c)


class OrMoPush(MomentumAlgorithm):
    """OrMo with one iteration per push: the momentum steps at every push (``ormo``'s
    master with ``K = 1``)."""

    name = "ormo-push"
    summary = "OrMo read per push: the momentum steps once per push (ormo with group=1)"
    master_rule = OrMoMaster

    def master(self, params: Tensor, workers: int) -> MasterRule:
        return OrMoMaster(params, workers, self.momentum, group=1)


@dataclass(frozen=True, kw_only=True)
class OrMoDaPush(DelayAdaptive, MomentumAlgorithm):
    """``ormo-push`` with the delay-adaptive rate ``lr*min(1, C/s)``."""

    name = "ormo-da-push"
    summary = "ormo-push with the delay-adaptive rate lr*min(1, C/delay), C default k"
    master_rule = OrMoMaster

    def master(self, params: Tensor, workers: int) -> MasterRule:
        c = self.concurrency_for(workers)
        return OrMoMaster(params, workers, self.momentum, group=1, concurrency=c)
