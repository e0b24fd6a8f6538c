"""DiLoCo: synchronous Local-SGD with an outer Nesterov step.

Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, "DiLoCo:
Distributed Low-Communication Training of Language Models" (2023), Algorithm 1. Every
worker starts a round from the parameters ``theta`` all pulled, takes ``H`` steps of its
inner optimizer (AdamW by default, its state kept across rounds) and pushes the outer
gradient ``Delta_i = theta - x_i``; when every worker has pushed, the master takes one
outer Nesterov step on their mean (``torch.optim.SGD(nesterov=True)``, the paper's
``OuterOpt``): ``v = mu*v + mean(Delta); theta -= outer_lr*(mean(Delta) + mu*v)``, with
``outer_lr = 0.7`` and ``mu = 0.9`` (the paper's Section 3). Workers wait for the
slowest: runners drive it in rounds, as ``ssgd``. With one worker and ``H = 1`` it is
the inner optimizer under an outer Nesterov step of its single updates.

Example::

    >>> import torch, dana.algorithms as A
    >>> algo = A.build("diloco", inner="sgd", local_steps=1, outer_lr=1.0, momentum=0.0)
    >>> master, workers = algo.master(torch.zeros(1), 2), algo.worker(2, 1)
    >>> workers.set_lr(0.1)
    >>> for i, g in enumerate((1.0, 3.0)):
    ...     x = workers.compute_at(i, master.pull(i, 0.1, torch.empty(1)))
    ...     pushed = master.push(i, workers.message(i, torch.tensor([g])), 0.1)
    >>> pushed, master.theta  # the mean outer gradient, 0.2
    (True, tensor([-0.2000]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from dana.algorithms.functional import momentum_update
from dana.algorithms.local_sgd import OuterMomentumAlgorithm
from dana.algorithms.ssgd import SsgdMaster


class DilocoMaster(SsgdMaster):
    """DiLoCo's master (Douillard et al. 2023): the round of
    :class:`~dana.algorithms.ssgd.SsgdMaster` (its membership too), closed by one outer
    Nesterov step on the mean outer gradient in ``torch.optim.SGD(nesterov=True)``'s
    order: ``v = mu*v + D; theta -= outer_lr*(D + mu*v)``, ``D`` the mean. Pulls send
    ``theta``."""

    def __init__(self, params: Tensor, workers: int, outer_lr: float, momentum: float):
        super().__init__(params, workers, momentum, nesterov=False)
        self.outer_lr = outer_lr

    def _update(self, lr: float) -> None:
        mean, v, mu = self.acc.div_(self.received), self.v, self.momentum
        momentum_update(v, mean, mu)
        self.theta.add_(mean.add_(v, alpha=mu), alpha=-self.outer_lr)


@dataclass(frozen=True, kw_only=True)
class Diloco(OuterMomentumAlgorithm):
    """Synchronous DiLoCo: rounds of ``H`` inner AdamW steps per worker, then one outer
    Nesterov step (``outer_lr`` 0.7, ``momentum`` 0.9: Douillard et al. 2023) on the mean
    outer gradient. ``momentum`` is the outer one; the inner AdamW's is ``beta1``.
    """

    name = "diloco"
    summary = "synchronous DiLoCo: H inner AdamW steps per round, outer Nesterov (0.7, 0.9)"
    synchronous = True
    master_rule = DilocoMaster

    inner: str = "adamw"  # the paper's inner optimizer
    outer_lr: float = 0.7  # the paper's outer rate
    outer_weight: float | None = 1.0  # (the mean: no further weight)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dynamic_steps:
            raise ValueError(
                "diloco is synchronous: every worker takes H steps a round, so Dynamic Local "
                "Updates (dynamic_steps) do not apply; use local-dn or dana-local with it"
            )
        if self.outer_weight != 1.0:
            raise ValueError(
                f"diloco averages the outer gradients of a round (outer_weight 1), got "
                f"outer_weight {self.outer_weight!r}; scale outer_lr instead"
            )

    @property
    def round_steps(self) -> int:
        return self.local_steps

    def _master_hparams(self) -> dict[str, Any]:
        return {"outer_lr": self.outer_lr, "momentum": self.momentum}
