"""Asynchronous Local-SGD: ``H`` local steps per push, and an outer optimizer at the master.

Liu, Chhaparia, Douillard, Kale, Rusu, Shen, Szlam, Ranzato, "Asynchronous Local-SGD
Training for Language Modeling" (2024); DiLoCo: Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models" (2023). Each worker starts a cycle from
the parameters ``p`` it pulled, takes ``H = local_steps`` steps of its inner optimizer on
its own copy ``x_i`` and pushes the outer gradient ``Delta = p - x_i``; the master
applies it with an outer optimizer at its own constant rate (the runner's scheduled
``lr`` is the inner rate).

Inner optimizers (the worker's state persists across cycles, as in DiLoCo):
``inner="sgd"``: ``u_i = m_in*u_i + g; x_i -= lr*u_i`` (``torch.optim.SGD``; plain SGD
when ``m_in = 0``); ``inner="adamw"``: ``torch.optim.AdamW`` with ``beta1``, ``beta2``,
``eps`` and bias correction over the worker's own steps. Both apply the decoupled decay
``x_i *= 1 - lr*inner_decay`` (default 0); the runner's ``--weight-decay`` still comes in
the gradient, as for every rule.

Outer optimizers (one registry name each). ``momentum`` is the method's momentum: the
inner one for ``local-sgd``, which has no outer momentum; the outer ``mu`` for the others,
whose inner momentum ``inner_momentum`` defaults to 0 (the momentum is the master's, as
in DANA; both at 0.9 compound and diverge). Each outer gradient is applied at the rate
``outer_lr * w`` (:func:`outer_rate`; ``w = outer_weight``, by default ``sqrt(k)/k``,
the asynchronous Local-SGD notebook's ``sync_weight``); the defaults are the reference
codes' (docs/ALGORITHMS.md gives each source):

- ``local-sgd``: ``theta -= outer_lr*w*Delta``; ``outer_lr = 0.7`` (the notebook's outer
  SGD). With one worker (``w = 1``) and ``outer_lr = 1`` the master follows the worker:
  it is the inner optimizer run alone, for any ``H``; with ``H = 1``, ``outer_lr = 1``
  and ``outer_weight = 1`` it is ``multi-asgd`` (the momenta in the workers).
- ``local-nesterov``: DiLoCo's outer Nesterov, ``v = mu*v + Delta;
  theta -= outer_lr*w*(Delta + mu*v)`` (``torch.optim.SGD(nesterov=True)`` on
  ``w*Delta``), ``outer_lr = 0.07`` (the notebook's asynchronous rate); with ``H = 1``,
  plain inner SGD, ``outer_lr = 1``, ``outer_weight = 1`` and a constant rate its pulls
  are ``nag-asgd``'s.
- ``local-dn``: Delayed Nesterov (the paper's; the reference implementation is
  utnslab/halos, ``src/halos/opt.py``): the outer momentum is updated only every ``N``
  pushes, ``v = mu*v + (sum of those N Deltas)/N``, and each push applies
  ``eta*(c*mu*v + Delta/N)`` (at the ``N``-th: ``eta*((1 - c*N + c)*mu*v + Delta/N)``,
  after the update); ``eta = 0.05*N`` (halos' example, no weight). ``N = period``
  defaults to ``k``; ``N = 1`` is ``local-nesterov``.
- ``dana-local``: DANA on the outer step (derivation in docs/ALGORITHMS.md): a momentum
  ``v_j`` per worker, ``v_i = mu*v_i + Delta; theta -= eta*v_i``, and a pull sends
  ``theta - eta*mu*sum_j v_j``, where the outer momenta will have taken the master when
  the worker's outer gradient lands; ``local-nesterov``'s rate. With ``H = 1``, plain
  inner SGD, ``outer_lr = 1``, ``outer_weight = 1`` and a constant ``lr`` it is
  ``dana-zero`` (the outer gradient is ``lr*g``).

Dynamic Local Updates (the paper's DyLU; ``dynamic_steps=True``, on every outer rule):
worker ``i`` takes ``H_i = max(1, floor(H*s_i))`` local steps per push, where ``s_i``
is its speed relative to the fastest worker's, which the runner gives the worker rule
(:meth:`~dana.algorithms.base.WorkerRule.set_speed`; from the timing model's mean step
times), so that every worker's local phase lasts about ``H`` of the fastest worker's
steps. With equal speeds every ``H_i`` is ``H``: the rule without the option.

A push of ``H`` local steps costs ``H`` gradient computations and consumes ``H`` batches
in every runner: the ``H - 1`` steps before it are local steps of the worker rule
(:meth:`~dana.algorithms.base.WorkerRule.message` returns ``None``), which the simulator
and the Ray workers count and time like any computation.

Example::

    >>> import torch, dana.algorithms as A
    >>> algo = A.build("local-sgd", momentum=0.0, local_steps=2, outer_lr=1.0)
    >>> master, workers = algo.master(torch.zeros(1), 1), algo.worker(1, 1)
    >>> pulled = master.pull(0, 0.1, torch.empty(1))
    >>> workers.set_lr(0.1)
    >>> for g in (1.0, 2.0):
    ...     x = workers.compute_at(0, pulled)
    ...     delta = workers.message(0, torch.tensor([g]))
    >>> delta, master.push(0, delta, 0.1), master.theta  # two steps: -0.1 - 0.2
    (tensor([0.3000]), True, tensor([-0.3000]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import (
    LocalStepWorkers,
    MasterRule,
    MomentumAlgorithm,
    check_count,
    check_decay,
    check_nonnegative,
    check_positive,
    per_worker_zeros,
)
from dana.algorithms.delay import check_threshold
from dana.algorithms.functional import (
    momentum_step,
    momentum_sum,
    momentum_update,
    nesterov_pull,
)

#: Delayed Nesterov's rate per push on ``Delta`` (halos' ``GLR``): ``outer_lr = 0.05*N``.
DN_RATE_PER_PUSH = 0.05

INNER = ("sgd", "adamw")


class LocalWorkers(LocalStepWorkers):
    """Asynchronous Local-SGD's workers (Liu et al. 2024; DiLoCo, Douillard et al. 2023):
    from the parameters ``p`` of each pull, ``H`` steps of the inner optimizer on the
    worker's own ``x_i`` (SGD with momentum, ``u_i = m*u_i + g; x_i -= lr*u_i``:
    :func:`~dana.algorithms.functional.momentum_step`; or AdamW), then the outer gradient
    ``Delta = p - x_i`` as the message; the ``H - 1`` steps before it are local steps.
    ``dynamic``: ``H_i = max(1, floor(H*s_i))`` for relative speed ``s_i`` (DyLU). ``t_i``
    counts the local steps of the cycle, ``pulled`` is the ``p`` it started from."""

    state_keys = ("x", "u", "s", "t", "n")

    def __init__(
        self,
        workers: int,
        d: int,
        dtype: torch.dtype,
        H: int,
        inner: str,
        momentum: float,
        beta2: float,
        eps: float,
        inner_decay: float,
        dynamic: bool = False,
    ):
        super().__init__(workers, d, dtype)
        self.H, self.inner, self.momentum = H, inner, momentum
        self.dynamic = dynamic
        #: H_i, each worker's local steps per push (H for all until set_speed says otherwise)
        self.steps = [H] * workers
        self.beta2, self.eps, self.inner_decay = beta2, eps, inner_decay
        adam = inner == "adamw"
        self.u = per_worker_zeros(workers, d, dtype) if adam or momentum > 0 else None
        self.s = per_worker_zeros(workers, d, dtype) if adam else None
        self.n = torch.zeros(workers, dtype=torch.int64)  # steps ever (Adam's bias correction)
        self._scratch = torch.empty(d, dtype=dtype) if adam else None

    def set_speed(self, worker: int, speed: float) -> None:
        """Dynamic Local Updates: ``H_i = max(1, floor(H*s_i))`` for relative speed ``s_i``."""
        if not (isinstance(speed, int | float) and 0.0 < speed <= 1.0):
            raise ValueError(
                f"a worker's relative speed must be in (0, 1] (its speed over the fastest "
                f"worker's), got {speed!r}"
            )
        if self.dynamic:
            self.steps[worker] = dynamic_local_steps(self.H, speed)

    def message(self, worker: int, grad: Tensor) -> Tensor | None:
        x, lr = self.x[worker], self.step_lr()
        if self.inner_decay:
            x.mul_(1.0 - lr * self.inner_decay)
        if self.inner == "adamw":
            self._adam_step(worker, x, grad, lr)
        else:
            u = None if self.u is None else self.u[worker]
            momentum_step(x, u, grad, self.momentum, lr)
        t = int(self.t[worker]) + 1
        if t < self.steps[worker]:
            self.t[worker] = t
            return None
        self.t[worker] = 0
        return torch.sub(self.pulled, x, out=grad)  # the outer gradient, over grad

    def leave(self, worker: int) -> None:
        """The departed worker's copy ``x_i``, inner optimizer state and counters are
        lost: zero. It joins again as at the start: its next computation starts a cycle
        from what it pulls (its ``H_i``, set from its speed, is kept)."""
        for state in (self.x, self.u, self.s):
            if state is not None:
                state[worker].zero_()
        self.t[worker] = 0
        self.n[worker] = 0

    def _adam_step(self, worker: int, x: Tensor, g: Tensor, lr: float) -> None:
        b1, b2 = self.momentum, self.beta2
        n = int(self.n[worker]) + 1
        self.n[worker] = n
        m, v = self.u[worker], self.s[worker]
        momentum_update(m, g, b1, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = torch.div(v, 1.0 - b2**n, out=self._scratch).sqrt_().add_(self.eps)
        x.addcdiv_(m, denom, value=-lr / (1.0 - b1**n))


def outer_rate(outer_lr: float, weight: float | None, workers: int) -> float:
    """The rate each outer gradient is applied at: ``outer_lr * w``, ``w`` the outer
    gradient's weight (``None``: ``sqrt(k)/k``, the asynchronous Local-SGD notebook's
    ``sync_weight``, its ``constant`` method: google-deepmind/asyncdiloco,
    ``AsyncLocalSGDToyExample.ipynb``, ``AsyncExperiment.get_sync_weight``). The notebook
    sets ``p.grad = w*Delta`` before its outer optimizer's step; every outer step here is
    linear in ``Delta``, so the weight folds into the rate."""
    return outer_lr * (math.sqrt(workers) / workers if weight is None else weight)


class OuterSgdMaster(MasterRule):
    """Asynchronous Local-SGD's plain outer step (Liu et al. 2024): each outer gradient
    at the master's own rate, ``theta -= outer_lr*w*Delta`` (``w``: :func:`outer_rate`).
    Pulls send ``theta``."""

    def __init__(self, params: Tensor, workers: int, outer_lr: float, weight: float | None):
        super().__init__(params, workers)
        self.rate = outer_rate(outer_lr, weight, workers)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.theta.add_(message, alpha=-self.rate)
        return True


class DelayedNesterovMaster(MasterRule):
    """Delayed Nesterov over outer gradients (Liu et al. 2024; utnslab/halos,
    ``src/halos/opt.py``, ``DelayedNesterovOptimizer.step``): the outer momentum is
    updated every ``N = period`` pushes, ``v = mu*v + (sum of their Deltas)/N``
    (:func:`~dana.algorithms.functional.momentum_update`), and each push applies
    ``theta -= eta*(c*mu*v + Delta/N)`` (the ``N``-th: ``eta*((1 - c*N + c)*mu*v +
    Delta/N)``), ``eta`` the rate of :func:`outer_rate` (``outer_lr = None``: halos'
    ``0.05*N``, see :class:`LocalDelayedNesterov`). ``period = 1``: DiLoCo's outer
    Nesterov (Douillard et al. 2023), ``v = mu*v + Delta; theta -= eta*(Delta +
    mu*v)``. Pulls send ``theta``."""

    state_keys = ("theta", "v", "acc", "pushes")

    def __init__(
        self,
        params: Tensor,
        workers: int,
        outer_lr: float | None,
        momentum: float,
        period: int | None,
        c: float,
        weight: float | None,
    ):
        super().__init__(params, workers)
        self.mu, self.c = momentum, c
        self.period = workers if period is None else period
        if self.period > 1 and c > 1.0 / (self.period - 1):
            # the N-th push's weight on the momentum, 1 - c*N + c, would turn negative
            raise ValueError(
                f"local-dn: c must be at most 1/(N - 1) = {1.0 / (self.period - 1):g} with "
                f"N = {self.period} pushes per momentum update, got {c!r}; lower c or N"
            )
        if outer_lr is None:  # halos: the rate per push times N
            outer_lr = DN_RATE_PER_PUSH * self.period
        self.rate = outer_rate(outer_lr, weight, workers)
        self.v = torch.zeros_like(self.theta)
        self.acc = torch.zeros_like(self.theta) if self.period > 1 else None
        self.pushes = 0

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        N, mu, c, eta = self.period, self.mu, self.c, self.rate
        self.pushes += 1
        if self.acc is not None:
            self.acc.add_(message)
        if self.pushes % N == 0:
            momentum_update(self.v, message if self.acc is None else self.acc, mu, 1.0 / N)
            self.theta.add_(self.v, alpha=-eta * (1.0 - c * N + c) * mu)
            if self.acc is not None:
                self.acc.zero_()
        elif c:
            self.theta.add_(self.v, alpha=-eta * c * mu)
        self.theta.add_(message, alpha=-eta / N)
        return True


class DanaLocalMaster(MasterRule):
    """DANA-Local's master: DANA-Zero's rule (Hakimi et al., arXiv 1907.11612) on the outer
    step of asynchronous Local-SGD (Liu et al. 2024). An outer momentum per worker,
    ``v_i = mu*v_i + Delta; theta -= eta*v_i``
    (:func:`~dana.algorithms.functional.momentum_step`), their sum ``S`` kept current
    (:func:`~dana.algorithms.functional.momentum_sum`); a pull sends
    ``theta - eta*mu*S`` (:func:`~dana.algorithms.functional.nesterov_pull`); ``eta``
    the rate of :func:`outer_rate`."""

    state_keys = ("theta", "v", "S")

    def __init__(
        self, params: Tensor, workers: int, outer_lr: float, momentum: float, weight: float | None
    ):
        super().__init__(params, workers)
        self.rate, self.mu = outer_rate(outer_lr, weight, workers), momentum
        self.v = self.per_worker_zeros()
        self.S = torch.zeros_like(self.theta)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        return nesterov_pull(self.theta, self.S, self.rate, self.mu, out)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        v = self.v[worker]
        momentum_sum(self.S, v, message, self.mu)
        momentum_step(self.theta, v, message, self.mu, self.rate)
        return True

    def leave(self, worker: int, lr: float) -> bool:
        """As ``dana-zero``'s master: ``theta -= eta*mu*v_i`` (the step the pulls'
        look-ahead already promised: a pull sends the same parameters just before and
        after the departure), then ``v_i = 0`` and ``S`` summed afresh over the workers,
        exactly the sum of the live workers' outer momenta. Returns False."""
        v = self.v[worker]
        self.theta.add_(v, alpha=-self.rate * self.mu)
        v.zero_()
        torch.sum(self.v, dim=0, out=self.S)
        return False


def dynamic_local_steps(H: int, speed: float) -> int:
    """``max(1, floor(H*speed))``: the local steps of a worker at relative speed ``speed``
    (the floor taken to ``1e-9``, so that a product exact on paper, 0.7*10, is not lost to
    rounding: ``7``, not ``6``)."""
    return max(1, math.floor(H * speed + 1e-9))


@dataclass(frozen=True, kw_only=True)
class LocalAlgorithm(MomentumAlgorithm):
    """The hyper-parameters of every outer rule: the inner optimizer's and ``outer_lr``.

    ``momentum`` is the method's momentum: here the inner optimizer's (``local-sgd`` has
    no outer momentum); :class:`OuterMomentumAlgorithm` makes it the outer one.
    """

    worker_rule = LocalWorkers

    local_steps: int = 10  # H
    inner: str = "sgd"  # or "adamw"
    outer_lr: float = 0.7  # the notebook's outer SGD (see LocalSgd)
    outer_weight: float | None = None  # w on each Delta; None: sqrt(k)/k (outer_rate)
    beta1: float = 0.9  # AdamW's
    beta2: float = 0.999  # AdamW's
    eps: float = 1e-8  # AdamW's
    inner_decay: float = 0.0  # decoupled: x_i *= 1 - lr*inner_decay
    dynamic_steps: bool = False  # DyLU: H_i = max(1, floor(H*s_i))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_count("local_steps", self.local_steps)
        if not isinstance(self.dynamic_steps, bool):
            raise ValueError(f"dynamic_steps must be true or false, got {self.dynamic_steps!r}")
        if self.inner not in INNER:
            raise ValueError(f"inner must be one of {', '.join(INNER)}, got {self.inner!r}")
        self._set(
            beta1=check_decay("beta1", self.beta1),
            beta2=check_decay("beta2", self.beta2),
            eps=check_positive("eps", self.eps),
            inner_decay=check_nonnegative("inner_decay", self.inner_decay),
        )
        if self.outer_lr is not None:
            self._set(outer_lr=check_positive("outer_lr", self.outer_lr))
        if self.outer_weight is not None:
            self._set(outer_weight=check_positive("outer_weight", self.outer_weight))

    @property
    def uses_speed(self) -> bool:  # type: ignore[override]
        return self.dynamic_steps

    def _master_hparams(self) -> dict[str, Any]:
        return {"outer_lr": self.outer_lr, "weight": self.outer_weight}

    def _inner_momentum(self) -> float:
        """The inner SGD's momentum: ``local-sgd``'s is its ``momentum``."""
        return self.momentum

    def _worker_hparams(self) -> dict[str, Any]:
        return {
            "H": self.local_steps,
            "inner": self.inner,
            "momentum": self.beta1 if self.inner == "adamw" else self._inner_momentum(),
            "beta2": self.beta2,
            "eps": self.eps,
            "inner_decay": self.inner_decay,
            "dynamic": self.dynamic_steps,
        }


class LocalSgd(LocalAlgorithm):
    """Asynchronous Local-SGD with the plain outer step ``theta -= outer_lr*w*Delta``.

    ``momentum`` is the inner optimizer's (there is no outer momentum). The defaults are
    the asynchronous Local-SGD notebook's outer SGD (google-deepmind/asyncdiloco,
    ``AsyncLocalSGDToyExample.ipynb``: ``AsyncExperiment(outer_opt_kwargs=dict(lr=0.7,
    momentum=0.0))``, "AdamW + SGD (no momentum on the outer loop)"), with its
    ``sync_weight`` ``w = sqrt(k)/k``: each push moves the master by ``0.7/sqrt(k)``
    outer gradients.
    """

    name = "local-sgd"
    summary = "async Local-SGD: H inner momentum-SGD steps per push, theta -= 0.7/sqrt(k)*Delta"
    master_rule = OuterSgdMaster


@dataclass(frozen=True, kw_only=True)
class OuterMomentumAlgorithm(LocalAlgorithm):
    """Local-SGD whose outer optimizer has the momentum ``momentum`` (``mu``); the inner
    optimizer's is ``inner_momentum`` (0: plain SGD)."""

    inner_momentum: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(inner_momentum=check_decay("inner_momentum", self.inner_momentum))

    def _master_hparams(self) -> dict[str, Any]:
        return {**super()._master_hparams(), "momentum": self.momentum}

    def _inner_momentum(self) -> float:
        return self.inner_momentum


@dataclass(frozen=True, kw_only=True)
class LocalNesterov(OuterMomentumAlgorithm):
    """Asynchronous Local-SGD with DiLoCo's outer Nesterov momentum.

    The defaults are the asynchronous Local-SGD notebook's (google-deepmind/asyncdiloco,
    ``AsyncLocalSGDToyExample.ipynb``: ``AsyncExperiment(outer_opt_kwargs=dict(lr=0.07,
    momentum=0.9))``, chosen from its asynchronous grid 0.05 to 0.2, where synchronous
    DiLoCo takes 0.7), with its ``sync_weight`` ``w = sqrt(k)/k``: over the run each
    outer gradient moves the master by ``0.07/(1 - 0.9)/sqrt(k) = 0.7/sqrt(k)``.
    """

    name = "local-nesterov"
    summary = "async Local-SGD with an outer Nesterov step (outer_lr 0.07, mu 0.9, w sqrt(k)/k)"
    master_rule = DelayedNesterovMaster

    outer_lr: float = 0.07  # the notebook's asynchronous rate

    def _master_hparams(self) -> dict[str, Any]:
        return {**super()._master_hparams(), "period": 1, "c": 0.0}


@dataclass(frozen=True, kw_only=True)
class LocalDelayedNesterov(OuterMomentumAlgorithm):
    """Asynchronous Local-SGD with the Delayed Nesterov outer step.

    The rate is halos' (utnslab/halos, ``examples/run_async_local_sgd.sh``: ``GLR=0.05``,
    ``GBETA=0.9``, the optimizer's ``lr`` = ``GLR * GMUD`` with ``GMUD`` its ``N``):
    ``outer_lr = None`` gives ``0.05*N``, so each push applies ``0.05*Delta`` at once and
    over the run each outer gradient moves the master by ``0.05/(1 - 0.9) = 0.5``,
    whatever ``N`` and ``k``. halos weighs no outer gradient (``outer_weight = 1``).
    ``N = period`` defaults to ``k`` (the notebook's delayed outer step updates once per
    round of ``k`` pushes; halos' example uses 32 with 16 workers).
    """

    name = "local-dn"
    summary = "async Local-SGD, Delayed Nesterov outer step: momentum updated every N = k pushes"
    master_rule = DelayedNesterovMaster

    outer_lr: float | None = None  # None: halos' 0.05*N
    outer_weight: float | None = 1.0  # halos: no weight
    period: int | None = None  # N; None: k
    c: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_threshold("period", self.period)
        if not 0.0 <= self.c <= 1.0:
            raise ValueError(f"c must be in [0, 1], got {self.c!r}")
        self._set(c=float(self.c))

    def _master_hparams(self) -> dict[str, Any]:
        return {**super()._master_hparams(), "period": self.period, "c": self.c}


@dataclass(frozen=True, kw_only=True)
class DanaLocal(OuterMomentumAlgorithm):
    """Asynchronous Local-SGD whose pulls see where the outer momenta take the master.

    No paper or code gives its outer step: it takes ``local-nesterov``'s (the notebook's
    ``lr=0.07, momentum=0.9`` with ``w = sqrt(k)/k``), the outer momentum step it adds
    DANA's look-ahead to, so that each outer gradient moves the master as far over the
    run (``0.7/sqrt(k)``) as under ``local-nesterov``.
    """

    name = "dana-local"
    summary = (
        "async Local-SGD with DANA's look-ahead on the outer momentum step (as local-nesterov's)"
    )
    master_rule = DanaLocalMaster

    outer_lr: float = 0.07  # local-nesterov's
