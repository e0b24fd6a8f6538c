"""SSGD: synchronous data-parallel SGD with momentum, the baseline for speed.

The master waits for all ``k`` gradients computed at the same ``theta``, averages them
and takes one momentum step ``v = m*v + mean(g); theta -= lr*v`` (Nesterov:
pulls see ``theta - lr*m*v``, Sutskever form). Runners drive it in rounds: every worker
pulls the same parameters, and a round costs the slowest worker's time. With one worker
it is momentum SGD (or Nesterov SGD).

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("ssgd", momentum=0.0).master(torch.zeros(1), workers=2)
    >>> master.push(0, torch.tensor([1.0]), lr=0.1), master.push(1, torch.tensor([3.0]), lr=0.1)
    (False, True)
    >>> master.theta
    tensor([-0.2000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule, MomentumAlgorithm
from dana.algorithms.functional import momentum_step, nesterov_pull


class SsgdMaster(MasterRule):
    """SSGD's master (synchronous data-parallel SGD, as in Goyal et al. 2017): sums the
    ``k`` gradients of a round, then one momentum step with their mean,
    ``v = m*v + mean(g); theta -= lr*v``
    (:func:`~dana.algorithms.functional.momentum_step`); ``nesterov``: pulls send
    ``theta - lr*m*v`` (:func:`~dana.algorithms.functional.nesterov_pull`).

    Membership: a round ends when every live worker has pushed (all ``k`` while none has
    left). A departed worker's gradient of the open round is kept if it was already
    pushed (it was computed at the round's parameters), and the round no longer waits
    for it otherwise; the mean is over the gradients summed. A departure that leaves
    only workers that have pushed completes the round (at the rate of its pushes, and
    :meth:`leave` returns True). A worker that joins is live at once: the open round
    waits for its push too (it pulls the round's parameters)."""

    state_keys = ("theta", "v", "acc", "received", "live", "got", "round_lr")

    def __init__(self, params: Tensor, workers: int, momentum: float, nesterov: bool):
        super().__init__(params, workers)
        self.momentum, self.nesterov = momentum, nesterov
        self.v = torch.zeros_like(self.theta)
        self.acc = torch.zeros_like(self.theta)
        self.received = 0
        self.live = torch.ones(workers, dtype=torch.bool)  # in the run
        self.got = torch.zeros(workers, dtype=torch.bool)  # pushed in the open round
        self.round_lr = 0.0  # the rate the open round's pushes carry
        self._counts()

    def _counts(self) -> None:
        """The live workers, and those of them that pushed in the open round."""
        self.n_live = int(self.live.sum())
        self.live_got = int((self.live & self.got).sum())

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        if self.nesterov:
            return nesterov_pull(self.theta, self.v, lr, self.momentum, out)
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.acc.add_(message)
        self.received += 1
        self.got[worker] = True
        self.live_got += 1
        self.round_lr = lr
        if self.live_got < self.n_live:
            return False
        return self._step(lr)

    def _step(self, lr: float) -> bool:
        """Close the round with its update."""
        self._update(lr)
        self.acc.zero_()
        self.received = 0
        self.got.zero_()
        self.live_got = 0
        return True

    def _update(self, lr: float) -> None:
        """The round's update: one momentum step with the mean of its gradients."""
        momentum_step(self.theta, self.v, self.acc, self.momentum, lr, 1.0 / self.received)

    def leave(self, worker: int, lr: float) -> bool:
        self.live[worker] = False
        self._counts()
        if self.received and self.live_got == self.n_live:
            return self._step(self.round_lr)
        return False

    def join(self, worker: int) -> None:
        self.live[worker] = True
        self._counts()

    def load_state_dict(self, state: dict) -> None:
        # Checkpoints from before membership: every worker live; the round's pushes, as
        # many as were received (a runner pushes a round's k gradients at once).
        k = self.workers
        got = torch.zeros(k, dtype=torch.bool)
        got[: int(state.get("received", 0))] = True
        defaults = {"live": torch.ones(k, dtype=torch.bool), "got": got, "round_lr": 0.0}
        super().load_state_dict({**defaults, **state})
        self._counts()


@dataclass(frozen=True, kw_only=True)
class Ssgd(MomentumAlgorithm):
    """Synchronous SGD: one averaged momentum step per round of ``k`` gradients."""

    name = "ssgd"
    summary = "synchronous SGD: average k gradients per round, one momentum step"
    synchronous = True
    master_rule = SsgdMaster

    nesterov: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(nesterov=bool(self.nesterov))
