"""YellowFin: momentum SGD that tunes its own learning rate and momentum, and its closed loop.

Zhang, Mitliagkas, "YellowFin and the Art of Momentum Tuning" (arXiv 1706.03471, 2017;
SysML 2019). The master keeps the tuner's estimates and applies heavy-ball momentum
``x_{t+1} = x_t - alpha*g + mu*(x_t - x_{t-1})``, kept as the displacement
``delta = x_t - x_{t-1}``: ``delta <- mu*delta - alpha*g; theta <- theta + delta``.
Workers send their gradients. Per push, with ``n`` pushes so far (this one included)
and the bias correction ``b = 1 - beta**n`` of every moving average (decay ``beta``):

1. step with the ``alpha`` and ``mu`` tuned after the previous push (``mu`` starts at 0,
   ``alpha`` at the learning rate the runner passes with the first push);
2. update the estimates with ``g`` (the paper's Algorithms 2-4):
   curvature range: ``h = ||g||^2``; ``h_min``, ``h_max`` = moving averages of the min and
   max of ``h`` over the last ``window`` pushes; variance ``C = avg(||g||^2) - ||avg(g)||^2``;
   distance to the optimum ``D = avg(avg(||g||) / avg(||g||^2))``;
3. from the second push on, SingleStep (:func:`single_step`) gives ``mu_t, alpha_t`` and
   ``mu <- beta*mu + (1-beta)*mu_t``, ``alpha <- beta*alpha + (1-beta)*alpha_t`` (the
   authors' implementations smooth them so; the first gradient's variance is 0).

After the first push the runner's ``lr`` is ignored: YellowFin sets its own (its
schedule, warm-up and decay do not apply). Its state is global (norms over all of
``theta``, a median), so it is not element-wise (``elementwise = False``): a Ray run
does not shard it over several parameter servers.

``yellowfin-cl`` closes the momentum loop for asynchrony (the paper's Section 5,
Algorithm 5). Staleness adds momentum of its own, so the total momentum ``mu_T`` the
system shows differs from the algorithmic ``mu_a`` the master applies. A gradient that
lands now was computed at ``x_u``, the parameters of the worker's pull; had it been
applied fresh, the step leaving ``x_u`` would have been
``x_{u+1} - x_u = mu_T*(x_u - x_{u-1}) - alpha*g``. The master remembers, for each
worker, ``x_u - x_{u-1}`` at its pull and the step ``x_{u+1} - x_u`` taken right after
(with its ``alpha``), and measures ``mu_T`` as the element-wise median of
``(x_{u+1} - x_u + alpha*g) / (x_u - x_{u-1})`` (elements with a zero denominator left
out; the lower middle value for an even count). Then
``mu_a <- clip(mu_a + gamma*(mu - mu_T), -0.999, 0.999)``, ``mu`` being the tuner's
target, ``gamma = 0.01``. Steps use ``mu_a``. With staleness 0 the measurement returns
``mu_a`` itself, so one worker is the open-loop tuner with its momentum lagging the
target by the loop's first-order filter.

Example::

    >>> import torch, dana.algorithms as A
    >>> master = A.build("yellowfin").master(torch.zeros(2), workers=1)
    >>> master.push(0, torch.tensor([1.0, 2.0]), lr=0.1)  # first step: SGD at the lr given
    True
    >>> master.theta
    tensor([-0.1000, -0.2000])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, MasterRule, check_decay, check_positive
from dana.algorithms.functional import momentum_update

#: Floor of the curvature and variance estimates (avoids dividing by zero).
EPS = 1e-12
MU_BOUND = 0.999


def cubic_root(p: float) -> float:
    """The root ``x`` in ``[0, 1]`` of ``(1 - x)**3 = p*x`` (``p > 0``).

    SingleStep minimises ``x^2 D^2 + (1 - x)^4 C / h_min^2`` over ``x = sqrt(mu)``; its
    stationary point solves this cubic with ``p = D^2 h_min^2 / (2C)``. With ``s = 1 - x``
    it is ``s^3 + p*s - p = 0``, whose real root is Cardano's ``s = A - p/(3A)``,
    ``A = cbrt(p/2 + sqrt(p^2/4 + p^3/27))``, computed without cancellation as
    ``s = p / (A^2 + p/3 + (p/(3A))^2)``; then ``x = 1 - s``, or ``x = s^3/p`` when ``x``
    is small.

        >>> round(cubic_root(1.0), 6)  # (1 - x)^3 = x
        0.317672
    """
    if not p > 0:
        raise ValueError(f"p must be > 0, got {p!r}")
    if math.isinf(p):
        return 0.0
    a = (p / 2 + p * math.sqrt(0.25 + p / 27)) ** (1 / 3)
    b = p / (3 * a)
    s = p / (a * a + p / 3 + b * b)
    return 1.0 - s if s < 0.5 else s**3 / p  # x = s^3/p keeps x's precision when small


def single_step(
    h_min: float, h_max: float, variance: float, distance: float
) -> tuple[float, float]:
    """The paper's SingleStep: ``(mu, alpha)`` from the curvature range, variance, distance.

    ``mu = max(x^2, ((sqrt(h_max/h_min) - 1) / (sqrt(h_max/h_min) + 1))^2)`` with ``x``
    the :func:`cubic_root` of ``p = D^2 h_min^2 / (2C)``, and
    ``alpha = (1 - sqrt(mu))^2 / h_min``.

        >>> mu, alpha = single_step(h_min=1.0, h_max=9.0, variance=1.0, distance=1.0)
        >>> round(mu, 4), round(alpha, 4)  # the curvature range binds: ((3-1)/(3+1))^2
        (0.25, 0.25)
    """
    h_min = max(h_min, EPS)
    ratio = math.sqrt(max(h_max / h_min, 1.0))
    x = cubic_root(distance * distance * h_min * h_min / (2 * max(variance, EPS)))
    mu = max(x * x, ((ratio - 1) / (ratio + 1)) ** 2)
    return mu, (1 - math.sqrt(mu)) ** 2 / h_min


class YellowFinMaster(MasterRule):
    """YellowFin's master (Zhang & Mitliagkas, SysML 2019): heavy-ball steps
    ``delta = mu*delta - alpha*g; theta += delta`` with ``mu`` and ``alpha`` tuned from
    the gradients; with ``gamma`` set, the closed loop (their Algorithm 5) steers the
    applied momentum so that the total one meets ``mu``."""

    state_keys = (
        "theta",
        "delta",
        "g_avg",
        "window",
        "n",
        "hmin_avg",
        "hmax_avg",
        "sq_avg",
        "norm_avg",
        "dist_avg",
        "mu",
        "alpha",
        "mu_alg",
        "before",
        "after",
        "after_alpha",
        "pending",
    )

    def __init__(
        self, params: Tensor, workers: int, beta: float, window: int, gamma: float | None = None
    ):
        super().__init__(params, workers)
        self.beta, self.gamma = beta, gamma
        self.delta = torch.zeros_like(self.theta)  # x_t - x_{t-1}
        self.g_avg = torch.zeros_like(self.theta)
        self.window = torch.zeros(window, dtype=torch.float64)  # recent ||g||^2
        self.n = 0  # gradients seen
        self.hmin_avg = self.hmax_avg = self.sq_avg = self.norm_avg = self.dist_avg = 0.0
        self.mu = 0.0  # the tuner's momentum (the target, in the closed loop)
        self.alpha = 0.0  # the tuner's learning rate (seeded by the first push's lr)
        self.mu_alg = 0.0  # the momentum applied by the closed loop
        closed = gamma is not None
        # Closed loop, per worker: x_u - x_{u-1} at its pull, the step x_{u+1} - x_u taken
        # after it and that step's alpha, and whether that step is still to come.
        self.before = self.per_worker_zeros() if closed else None
        self.after = self.per_worker_zeros() if closed else None
        self.after_alpha = torch.zeros(workers, dtype=torch.float64) if closed else None
        self.pending = torch.zeros(workers, dtype=torch.bool) if closed else None

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        if self.before is not None:
            self.before[worker].copy_(self.delta)
            self.pending[worker] = True
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        if self.n == 0:
            self.alpha = float(lr)
        mu = self.mu if self.gamma is None else self.mu_alg
        alpha = self.alpha
        momentum_update(self.delta, message, mu, -alpha)  # delta = mu*delta - alpha*g
        self.theta.add_(self.delta)
        if self.gamma is not None:
            waiting = self.pending.nonzero().flatten()
            if len(waiting):
                self.after[waiting] = self.delta
                self.after_alpha[waiting] = alpha
                self.pending[waiting] = False
        self.tune(message)
        if self.gamma is not None:
            mu_total = self.total_momentum(worker, message)
            if mu_total is not None:
                mu_alg = self.mu_alg + self.gamma * (self.mu - mu_total)
                self.mu_alg = min(max(mu_alg, -MU_BOUND), MU_BOUND)
        return True

    def tune(self, g: Tensor) -> None:
        """Fold ``g`` into the estimates and, from the second gradient on, retune."""
        beta = self.beta
        self.n += 1
        h = float(torch.dot(g, g))
        self.window[(self.n - 1) % len(self.window)] = h
        seen = self.window[: min(self.n, len(self.window))]
        self.hmin_avg = beta * self.hmin_avg + (1 - beta) * float(seen.min())
        self.hmax_avg = beta * self.hmax_avg + (1 - beta) * float(seen.max())
        momentum_update(self.g_avg, g, beta, 1 - beta)  # the moving average of g
        self.sq_avg = beta * self.sq_avg + (1 - beta) * h
        self.norm_avg = beta * self.norm_avg + (1 - beta) * math.sqrt(h)
        bias = 1 - beta**self.n
        sq = self.sq_avg / bias
        self.dist_avg = beta * self.dist_avg + (1 - beta) * (self.norm_avg / bias) / max(sq, EPS)
        if self.n < 2:
            return
        variance = sq - float(torch.dot(self.g_avg, self.g_avg)) / (bias * bias)
        mu, alpha = single_step(
            self.hmin_avg / bias, self.hmax_avg / bias, variance, self.dist_avg / bias
        )
        self.mu = beta * self.mu + (1 - beta) * mu
        self.alpha = beta * self.alpha + (1 - beta) * alpha

    def total_momentum(self, worker: int, g: Tensor) -> float | None:
        """``median((x_{u+1} - x_u + alpha*g) / (x_u - x_{u-1}))`` for ``worker``'s pull ``u``."""
        before = self.before[worker]
        used = before != 0
        if not bool(used.any()):
            return None
        step = torch.add(self.after[worker], g, alpha=float(self.after_alpha[worker]))
        return float((step[used] / before[used]).median())


@dataclass(frozen=True, kw_only=True)
class YellowFin(Algorithm):
    """Open-loop YellowFin at the master: heavy ball with tuned ``alpha`` and ``mu``."""

    name = "yellowfin"
    summary = "YellowFin: heavy-ball momentum, lr and momentum tuned at the master"
    master_rule = YellowFinMaster
    elementwise = False  # the tuner's norms and median span the whole vector

    beta: float = 0.999  # the decay of every moving average
    window: int = 20  # the gradients the curvature range spans

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(beta=check_decay("beta", self.beta))
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"window must be an integer >= 1, got {w!r}")


@dataclass(frozen=True, kw_only=True)
class YellowFinClosedLoop(YellowFin):
    """Closed-loop YellowFin: steers the applied momentum so the total meets the target."""

    name = "yellowfin-cl"
    summary = "closed-loop YellowFin: measures total momentum, feeds back on the applied one"

    gamma: float = 0.01  # the loop's gain

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(gamma=check_positive("gamma", self.gamma))
