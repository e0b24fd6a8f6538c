"""DANA: gradients computed where the master will be when they land.

Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous
Environment" (arXiv 1907.11612).

- ``dana-zero``: the master keeps ``theta``, a momentum ``v_i`` per worker and their sum
  ``S``. A push of worker ``i`` does ``v_i = m*v_i + g; theta -= lr*v_i`` and keeps
  ``S`` current in O(d) (``S += v_i_new - v_i_old``, never re-summed). A pull sends the
  estimate of the future position ``theta - lr*m*S``.
- ``dana-slim``: the same algorithm rewritten with ``Theta = theta - lr*m*S``
  (Bengio-Nesterov). Each worker keeps its own ``v_i`` and sends
  ``u = g + m*v_i`` after ``v_i = m*v_i + g``; the master does ASGD's work only,
  ``Theta -= lr*u``, and keeps nothing per worker. With a constant ``lr`` both send
  every worker the same parameters; with one worker ``dana-slim`` is exactly
  ``torch.optim.SGD(momentum=m, nesterov=True)``.
- ``dana-dc``: DC-ASGD's delay compensation ``g~ = g + lc*g*g*(theta - p_i)`` on top
  of ``dana-zero`` (``lc = 2`` as in the authors' code).
- ``dana-ga``: the Gap-Aware penalty (see :mod:`dana.algorithms.gap_aware`) on top of
  ``dana-zero``.

Example::

    >>> import torch, dana.algorithms as A
    >>> algo = A.build("dana-slim", momentum=0.9)
    >>> master, workers = algo.master(torch.zeros(2), 4), algo.worker(4, 2)
    >>> master.push(0, workers.message(0, torch.ones(2)), lr=0.1)
    True
    >>> master.params()
    tensor([-0.1900, -0.1900])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import (
    MasterRule,
    MomentumAlgorithm,
    RemembersPulls,
    WorkerRule,
    blocks,
    check_nonnegative,
    per_worker_zeros,
)
from dana.algorithms.functional import delay_compensate, momentum_sum, nesterov_pull
from dana.algorithms.gap_aware import GapPenalty, GapPenaltyAlgorithm


class DanaZeroMaster(MasterRule):
    """DANA-Zero's master (Hakimi et al., arXiv 1907.11612): a momentum per
    worker, ``v_i = m*v_i + g; theta -= lr*v_i``, and their sum ``S`` kept current in
    O(d); a pull sends the estimate of the future position ``theta - lr*m*S``
    (:func:`~dana.algorithms.functional.nesterov_pull` of ``S``)."""

    state_keys = ("theta", "v", "S")

    def __init__(self, params: Tensor, workers: int, momentum: float):
        super().__init__(params, workers)
        self.momentum = momentum
        self.v = self.per_worker_zeros()
        self.S = torch.zeros_like(self.theta)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        return nesterov_pull(self.theta, self.S, lr, self.momentum, out)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        m = self.momentum
        # S += v_new - v_old, with v_new = m*v_old + g; by cache-sized blocks (BLOCK).
        for S, v, g, theta in zip(
            blocks(self.S), blocks(self.v[worker]), blocks(message), blocks(self.theta)
        ):
            momentum_sum(S, v, g, m)
            torch.add(g, v, alpha=m, out=v)  # v = m*v + g, fused (one rounding)
            theta.add_(v, alpha=-lr)
        return True

    def leave(self, worker: int, lr: float) -> bool:
        """The departed worker's momentum ``v_i`` leaves the sum: ``S`` is summed afresh
        over the workers (a departed worker's row is zero), so that it stays exactly
        the sum of the live workers' momenta. First ``theta -= lr*m*v_i``: the step of
        ``v_i`` that the pulls' look-ahead ``theta - lr*m*S`` already promised, so that
        a pull sends the same parameters just before and just after the departure (and
        ``dana-slim``, whose master keeps that look-ahead, stays ``dana-zero``). It joins
        again with ``v_i = 0``. Not an update: returns False."""
        v = self.v[worker]
        self.theta.add_(v, alpha=-lr * self.momentum)
        v.zero_()
        torch.sum(self.v, dim=0, out=self.S)
        return False


class DanaZero(MomentumAlgorithm):
    """DANA with the momenta at the master; pulls see ``theta - lr*m*sum_i v_i``."""

    name = "dana-zero"
    summary = "DANA: per-worker momenta at the master, pull at theta - lr*m*sum(v)"
    master_rule = DanaZeroMaster


class DanaSlimMaster(MasterRule):
    """DANA-Slim's master (Hakimi et al., arXiv 1907.11612): it holds the
    look-ahead ``Theta = theta - lr*m*S`` and does ASGD's work, ``Theta -= lr*u``; pulls
    send ``Theta``. It takes no momentum: the workers keep theirs."""

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.theta.add_(message, alpha=-lr)
        return True


class DanaSlimWorkers(WorkerRule):
    """DANA-Slim's workers (arXiv 1907.11612): each keeps its momentum
    ``v_i`` and sends ``u = g + m*v_i`` after ``v_i = m*v_i + g``.

    When it holds several workers (the simulator), it also keeps ``S = sum_i v_i``
    current so that the master's true ``theta = Theta + lr*m*S`` can be measured.
    """

    state_keys = ("v", "S")

    def __init__(self, workers: int, d: int, dtype: torch.dtype, momentum: float):
        super().__init__(workers, d, dtype)
        self.momentum = momentum
        self.v = per_worker_zeros(workers, d, dtype)
        self.S = torch.zeros(d, dtype=dtype) if workers > 1 else None

    def message(self, worker: int, grad: Tensor) -> Tensor:
        """``v_i = m*v_i + g``, then ``g + m*v_i``, written over ``grad``."""
        m = self.momentum
        # Block by block, so that each block of v_i, g (and S) is read from memory once
        # for the three or four passes over it (element-wise: the same result).
        v_blocks, g_blocks = blocks(self.v[worker]), blocks(grad)
        S_blocks = blocks(self.S) if self.S is not None else (None,) * len(v_blocks)
        for v, g, S in zip(v_blocks, g_blocks, S_blocks):
            if S is not None:
                momentum_sum(S, v, g, m)
            torch.add(g, v, alpha=m, out=v)  # v = m*v + g, fused (one rounding)
            g.add_(v, alpha=m)
        return grad

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Older checkpoints also hold the message buffer "u", which is not state.
        super().load_state_dict({k: v for k, v in state.items() if k != "u"})

    def leave(self, worker: int) -> None:
        """The departed worker's momentum ``v_i`` is lost with its machine: zero (it joins
        again with ``v_i = 0``), and ``S`` is summed afresh over the workers. The master
        keeps ``Theta`` as it is: the look-ahead ``-lr*m*v_i`` it holds is then applied
        for good, the step ``dana-zero``'s master takes at the departure."""
        self.v[worker].zero_()
        if self.S is not None:
            torch.sum(self.v, dim=0, out=self.S)

    def theta_offset(self, lr: float) -> Tensor:
        return self._sum() * (lr * self.momentum)

    def true_params(self, stored: Tensor, lr: float, out: Tensor) -> Tensor:
        return torch.add(stored, self._sum(), alpha=lr * self.momentum, out=out)

    def _sum(self) -> Tensor:
        return self.S if self.S is not None else self.v[0]


class DanaSlim(MomentumAlgorithm):
    """DANA with the momenta in the workers; the master is as cheap as ASGD's."""

    name = "dana-slim"
    summary = "DANA with momenta in the workers; the master does only ASGD's work"
    master_rule = DanaSlimMaster
    worker_rule = DanaSlimWorkers

    def _master_hparams(self) -> dict:
        return {}

    def _worker_hparams(self) -> dict:
        return {"momentum": self.momentum}


class DanaDcMaster(RemembersPulls, DanaZeroMaster):
    """DANA-DC: DANA-Zero's master, each gradient first delay-compensated against the
    parameters the worker pulled, ``g + lc*g*g*(theta - p_i)``
    (:func:`~dana.algorithms.functional.delay_compensate`; Zheng et al., ICML 2017)."""

    state_keys = ("theta", "v", "S", "sent")

    def __init__(self, params: Tensor, workers: int, momentum: float, lc: float):
        super().__init__(params, workers, momentum)
        self.lc = lc
        self.sent = self.per_worker_zeros()
        self._g = torch.empty_like(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        compensated = delay_compensate(message, self.theta, self.sent[worker], self.lc, self._g)
        return super().push(worker, compensated, lr)


@dataclass(frozen=True, kw_only=True)
class DanaDc(MomentumAlgorithm):
    """DANA-Zero with DC-ASGD's delay compensation of each gradient."""

    name = "dana-dc"
    summary = "DANA-Zero plus DC-ASGD delay compensation g + lc*g*g*(theta - p_i)"
    master_rule = DanaDcMaster

    lc: float = 2.0  # the authors' code

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(lc=check_nonnegative("lc", self.lc))


class DanaGaMaster(RemembersPulls, DanaZeroMaster, GapPenalty):
    """DANA-GA: DANA-Zero's master, each gradient first divided by its normalised gap
    (:class:`~dana.algorithms.gap_aware.GapPenalty`; Barkai et al., ICLR 2020); the
    penalty's scale follows the pushing worker's momentum ``v_i``."""

    state_keys = ("theta", "v", "S", "sent", "ema", "ema_steps", "lr_max")

    def __init__(self, params: Tensor, workers: int, momentum: float, ema_decay: float, eps: float):
        DanaZeroMaster.__init__(self, params, workers, momentum)
        GapPenalty.__init__(self, ema_decay, eps)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        super().push(worker, self.penalize(worker, message, lr), lr)
        self.observe(self.v[worker])
        return True


class DanaGa(GapPenaltyAlgorithm):
    """DANA-Zero with the Gap-Aware penalty on each gradient."""

    name = "dana-ga"
    summary = "DANA-Zero plus the Gap-Aware staleness penalty"
    master_rule = DanaGaMaster
