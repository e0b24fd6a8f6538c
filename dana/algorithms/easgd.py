"""EASGD and EAMSGD: workers on their own parameters, tied to a center by an elastic force.

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD" (NIPS 2015),
asynchronous versions (their Algorithms 1 and 2). Each worker ``i`` keeps parameters
``x_i`` and takes local steps; the master keeps the center ``c`` (the evaluated params).
Every ``tau`` local steps (at steps ``0, tau, 2*tau, ...`` of the worker's counter ``t``)
a worker exchanges the elastic difference ``e = alpha*(x_i - c~)`` against the center
``c~`` it read, and the step reads ``x_i <- x_i - e - lr*g(x_i)`` (``easgd``) or, with
Nesterov momentum ``m`` (``eamsgd``, Sutskever form, ``g`` at the look-ahead):
``v_i <- m*v_i - lr*g(x_i + m*v_i); x_i <- x_i - e + v_i``. The master applies
``c <- c + e``.

The three events: the worker sends ``e`` as its message (``None`` for the other
``tau - 1`` steps: local steps, no pull); a pull gives the center, which the worker
uses as ``c~`` at its next exchange (the pull follows its previous exchange); compute
at ``x_i`` (``x_i + m*v_i``). A worker starts from the center of its first pull. For
``eamsgd`` the workers store the look-ahead ``x_i + m*v_i`` and ``v_i``, so that
``compute_at`` needs no buffer. Local steps use the learning rate the runner passes
through :meth:`~dana.algorithms.base.WorkerRule.set_lr`.

Defaults, from the paper: ``alpha = beta / k`` with the moving rate ``beta = 0.9`` (its
choice ``beta = k*alpha`` keeps the center's total pull independent of ``k``), and
``tau = 10`` (its ImageNet setting; CIFAR used 1 to 64). ``alpha`` may be given
instead. ``k`` is the run's number of workers: the rules take it from the runner
(``dana train`` passes it as the hyper-parameter ``workers``, which a runner that
builds one worker rule per process needs). The paper ran EAMSGD with ``m = 0.99``; the
default here is 0.9, as for every momentum method in this package.

With ``alpha = 0`` the workers are independent local SGD (Nesterov SGD for
``eamsgd``, exactly ``torch.optim.SGD(momentum=m, nesterov=True)``'s parameters).

``dana-easgd`` (:mod:`dana.algorithms.dana_easgd`) exchanges against an estimate of
where the center will be when the exchange lands.

Example::

    >>> import torch, dana.algorithms as A
    >>> algo = A.build("easgd", tau=2, alpha=0.5)
    >>> master, workers = algo.master(torch.zeros(1), 1), algo.worker(1, 1)
    >>> center = master.pull(0, 0.1, torch.empty(1))
    >>> workers.set_lr(0.1)
    >>> for g in (1.0, 1.0, 1.0):  # exchange, local step, exchange
    ...     x = workers.compute_at(0, center)
    ...     e = workers.message(0, torch.tensor([g]))
    ...     if e is not None:
    ...         _ = master.push(0, e, 0.1), master.pull(0, 0.1, center)
    >>> workers.x, master.theta  # the last exchange: e = 0.5*(-0.2 - 0) = -0.1
    (tensor([[-0.2000]]), tensor([-0.1000]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import (
    Algorithm,
    LocalStepWorkers,
    MasterRule,
    MomentumAlgorithm,
    WorkerRule,
    check_count,
    check_nonnegative,
    check_workers,
    per_worker_zeros,
)
from dana.algorithms.functional import momentum_update


class ElasticMaster(MasterRule):
    """EASGD's center (Zhang et al., NIPS 2015, Algorithms 1 and 2): ``c <- c + e`` for
    every elastic difference ``e`` pushed; pulls send ``c``."""

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.theta.add_(message)
        return True


class ElasticWorkers(LocalStepWorkers):
    """EASGD's and EAMSGD's workers (Zhang et al., NIPS 2015): parameters of their own
    (the look-ahead ``x_i + m*v_i`` with momentum), local steps, and every ``tau``
    steps the elastic difference ``e = alpha*(x_i - c~)`` as the message. ``x`` holds
    ``x_i + m*v_i`` (``x_i`` when ``m = 0``), ``pulled`` the center ``c~`` of the last pull."""

    state_keys = ("x", "v", "t")

    def __init__(
        self, workers: int, d: int, dtype: torch.dtype, tau: int, alpha: float, momentum: float
    ):
        super().__init__(workers, d, dtype)
        self.tau, self.alpha, self.momentum = tau, alpha, momentum
        self.v = per_worker_zeros(workers, d, dtype) if momentum > 0 else None
        self._e = torch.empty(d, dtype=dtype)  # message buffer, reused

    def message(self, worker: int, grad: Tensor) -> Tensor | None:
        lr = self.step_lr()
        t = int(self.t[worker])
        self.t[worker] = t + 1
        x, m = self.x[worker], self.momentum
        e = None
        if t % self.tau == 0:  # e = alpha*(x_i - c~), x_i before this step
            e = torch.sub(x, self.pulled, out=self._e)
            if self.v is not None:
                e.add_(self.v[worker], alpha=-m)
            e.mul_(self.alpha)
        if self.v is None:
            x.add_(grad, alpha=-lr)
            if e is not None:
                x.sub_(e)
            return e
        # look-ahead X = x + m*v:  X <- X - m*v - e + (1 + m)*v',  v' = m*v - lr*g
        v = self.v[worker]
        x.add_(v, alpha=-m)
        if e is not None:
            x.sub_(e)
        momentum_update(v, grad, m, -lr)
        x.add_(v, alpha=1 + m)
        return e

    def leave(self, worker: int) -> None:
        """The departed worker's parameters, momentum and step counter are lost: zero. It
        joins again as at the start: its counter at 0, so that its next computation
        starts from the center it pulls and its first step exchanges a zero difference."""
        self.x[worker].zero_()
        if self.v is not None:
            self.v[worker].zero_()
        self.t[worker] = 0


@dataclass(frozen=True, kw_only=True)
class ElasticAlgorithm(Algorithm):
    """Hyper-parameters shared by the elastic-averaging algorithms, and ``alpha = beta/k``."""

    master_rule = ElasticMaster
    worker_rule = ElasticWorkers

    tau: int = 10  # local steps between exchanges
    beta: float = 0.9  # the moving rate: alpha = beta/k
    alpha: float | None = None  # None: beta/k
    workers: int | None = None  # k, for a runner that builds one worker rule per process

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(tau=check_count("tau", self.tau), beta=check_nonnegative("beta", self.beta))
        if self.alpha is not None:
            alpha = check_nonnegative("alpha", self.alpha)
            if alpha > 1:
                raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
            self._set(alpha=alpha)
        if self.workers is not None:
            check_workers(self.workers)
            self.elastic_alpha(self.workers)

    def elastic_alpha(self, k: int) -> float:
        """The coefficient of the elastic difference for ``k`` workers."""
        if self.alpha is not None:
            return self.alpha
        alpha = self.beta / k
        if alpha > 1:
            raise ValueError(
                f"alpha = beta/k = {self.beta}/{k} must be <= 1; lower beta or give alpha"
            )
        return alpha

    def master(self, params: Tensor, workers: int) -> MasterRule:
        check_workers(workers)  # before beta / workers
        if self.workers is not None and workers != self.workers:
            raise ValueError(
                f"{self.name} was built for workers={self.workers}, not {workers} (alpha = beta/k)"
            )
        alpha = self.elastic_alpha(workers)  # (validated here, whoever takes it)
        return self.master_rule(params, workers, **self._elastic_master_hparams(alpha))

    def _elastic_master_hparams(self, alpha: float) -> dict[str, float]:
        """What the master rule takes: EASGD's center takes nothing (``alpha`` is the
        workers'); :mod:`dana.algorithms.dana_easgd`'s takes ``alpha``."""
        return {}

    def worker(self, workers: int, d: int, dtype: torch.dtype = torch.float32) -> WorkerRule:
        check_workers(workers)  # before beta / workers
        k = workers if self.workers is None else self.workers
        if workers > k:
            raise ValueError(f"{self.name} was built for workers={k}; cannot hold {workers}")
        momentum = getattr(self, "momentum", 0.0)  # eamsgd's; easgd's workers have none
        return self.worker_rule(workers, d, dtype, self.tau, self.elastic_alpha(k), momentum)


class Easgd(ElasticAlgorithm):
    """Asynchronous EASGD: local SGD, an elastic exchange with the center every ``tau`` steps."""

    name = "easgd"
    summary = "elastic averaging SGD: local SGD, elastic exchange with the center every tau"


@dataclass(frozen=True, kw_only=True)
class Eamsgd(ElasticAlgorithm, MomentumAlgorithm):
    """Asynchronous EAMSGD: EASGD with Nesterov momentum in the workers' local steps."""

    name = "eamsgd"
    summary = "elastic averaging with Nesterov momentum in the workers' local steps"
