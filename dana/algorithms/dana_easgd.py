"""DANA-EASGD: elastic exchanges against where the center will be when they land.

DANA's idea (Hakimi et al., arXiv 1907.11612: compute where the master will be, not
where it was) applied to EAMSGD (:mod:`dana.algorithms.easgd`). In EAMSGD a worker's
exchange ``e = alpha*(x_i - c~)`` uses the center ``c~`` read at its pull, one cycle
(``tau`` local steps) before the exchange lands; by then the other workers' exchanges
have moved the center to ``c_land``. Here the pull sends an estimate of ``c_land``; the
worker rule is EAMSGD's, unchanged (it uses what it pulled as ``c~``).

The estimate (derivation in docs/ALGORITHMS.md, "dana-easgd"). The center moves only by
exchanges, and an exchange of worker ``j`` made against the right center moves it a
fraction ``alpha`` of the way to ``x_j``. If ``m`` exchanges land during worker ``i``'s
cycle, from workers whose parameters average ``y``, then
``c_land = y + (1 - alpha)**m * (c - y)``. The master knows each worker's parameters
from its last exchange (``x_j = c~_j + e_j/alpha`` before it, ``x_j - e_j`` after it);
it predicts where each will be at its next one as that position plus ``rho`` times the
displacement of its last cycle; ``rho`` is the measured persistence of those
displacements (a running regression of each displacement on the previous one, over all
workers, clipped to ``[0, 1]``: near 1 while the workers descend together, near 0 once
their motion is noise). ``y`` is the mean of those predictions over the other workers,
and ``m`` the number of exchanges that landed during ``i``'s previous cycle (its last
staleness). The pull sends ``c + (1 - (1 - alpha)**m) * (y - c)``.

State: three ``(k, d)`` tensors (the estimate sent to each worker, its position, its
last displacement), their running sums over workers (kept current in O(d) per push),
the update count at each pull and each worker's last cycle length. With one worker (or
``alpha = 0``) the pull sends the center: it is EAMSGD exactly. The simulator's gap,
``RMS(c_land - pulled)``, is then the estimate's error.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("dana-easgd", alpha=0.5).master(torch.zeros(1), workers=2)
    >>> out = torch.empty(1)
    >>> _ = master.pull(0, 0.1, out), master.pull(1, 0.1, out)
    >>> _ = master.push(1, torch.tensor([0.5]), lr=0.1)  # worker 1 at 1.0: now 0.5
    >>> _ = master.push(0, torch.tensor([0.2]), lr=0.1)  # worker 0's cycle saw 1 exchange
    >>> master.pull(0, 0.1, out)  # expect one more: 0.7 + 0.5*(0.5 - 0.7)
    tensor([0.6000])
"""

from __future__ import annotations

import torch
from torch import Tensor

from dana.algorithms.base import MasterRule
from dana.algorithms.easgd import Eamsgd

#: Decay of the running sums that measure the persistence ``rho`` of displacements.
PERSISTENCE_DECAY = 0.99


class DanaEasgdMaster(MasterRule):
    """DANA-EASGD's master: DANA's look-ahead (Hakimi et al., arXiv 1907.11612) on
    EAMSGD's center (Zhang et al., NIPS 2015). The center ``c <- c + e`` for every
    exchange ``e``; the workers' positions as their exchanges reveal them; a pull sends
    the estimate of the center when the worker's next exchange lands,
    ``c + (1 - (1 - alpha)**m) * (y - c)`` (module docstring; docs/ALGORITHMS.md,
    "dana-easgd")."""

    state_keys = (
        "theta",
        "sent",
        "position",
        "displacement",
        "position_sum",
        "displacement_sum",
        "covariance",
        "variance",
        "pulled_at",
        "cycle",
        "updates",
    )

    def __init__(self, params: Tensor, workers: int, alpha: float):
        super().__init__(params, workers)
        self.alpha = alpha
        k, d = workers, self.d
        self.sent = self.theta.new_zeros(k, d)  # the estimate each worker pulled
        self.position = self.theta.expand(k, d).clone()  # after its last exchange
        self.displacement = self.theta.new_zeros(k, d)  # over its last cycle
        self.position_sum = self.position.sum(0)
        self.displacement_sum = torch.zeros_like(self.theta)
        self.covariance = self.variance = 0.0  # running <w_n, w_{n-1}>, |w_{n-1}|^2
        self.pulled_at = torch.zeros(k, dtype=torch.int64)
        self.cycle = torch.zeros(k, dtype=torch.int64)  # exchanges landed in its last cycle
        self.updates = 0

    def persistence(self) -> float:
        """``rho``: how much of a worker's last displacement its next one repeats."""
        if self.variance <= 0:
            return 0.0
        return min(max(self.covariance / self.variance, 0.0), 1.0)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.pulled_at[worker] = self.updates
        m, k = int(self.cycle[worker]), self.workers
        if k == 1 or m == 0 or self.alpha == 0:
            out.copy_(self.theta)
        else:  # c + (1 - (1-alpha)^m) * (y - c), y = mean over j != i of x_j + rho*w_j
            y = torch.sub(self.position_sum, self.position[worker], out=out)
            y.add_(self.displacement_sum, alpha=self.persistence())
            y.add_(self.displacement[worker], alpha=-self.persistence()).div_(k - 1)
            y.sub_(self.theta).mul_(1 - (1 - self.alpha) ** m).add_(self.theta)
        self.sent[worker].copy_(out)
        return out

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        self.cycle[worker] = self.updates - int(self.pulled_at[worker])
        if self.alpha > 0:
            self._observe(worker, message)
        self.theta.add_(message)
        self.updates += 1
        return True

    def _observe(self, worker: int, e: Tensor) -> None:
        """Learn ``worker``'s parameters from its exchange ``e = alpha*(x - sent)``."""
        position, old = self.position[worker], self.displacement[worker]
        before = torch.add(self.sent[worker], e, alpha=1 / self.alpha)  # x, before exchanging
        new = before.sub_(position)  # displacement over the cycle just ended
        if bool(old.any()):
            decay = PERSISTENCE_DECAY
            self.covariance = decay * self.covariance + (1 - decay) * float(new @ old)
            self.variance = decay * self.variance + (1 - decay) * float(old @ old)
        self.displacement_sum.add_(new).sub_(old)
        self.position_sum.add_(new).sub_(e)  # position <- position + new - e
        position.add_(new).sub_(e)
        old.copy_(new)


class DanaEasgd(Eamsgd):
    """EAMSGD whose pulls send the center's predicted position when the exchange lands."""

    name = "dana-easgd"
    summary = "EAMSGD exchanging against the center's predicted position at landing"
    master_rule = DanaEasgdMaster
    elementwise = False  # rho: one persistence, from dot products over the whole vector

    def _elastic_master_hparams(self, alpha: float) -> dict[str, float]:
        return {"alpha": alpha}
