"""The rules' arithmetic, each piece written once (as ``torch.optim``'s ``_single_tensor_sgd``).

Every function works in place on flat tensors (or rows of a ``(k, d)`` state tensor)
and returns what it wrote; the master and worker rules are built from them:

- :func:`momentum_update`: a momentum buffer's update ``v = m*v + s*g`` (heavy ball's
  ``s = 1``, Sutskever's ``s = -lr``, a moving average's ``s = 1 - m``);
- :func:`momentum_step`: heavy ball, ``v = m*v + s*g; theta -= lr*v`` (``v is None``:
  plain ``theta -= lr*s*g``);
- :func:`momentum_sum`: keeps ``S = sum_j v_j`` current as ``v_i`` takes its update;
- :func:`nesterov_pull`: the look-ahead a pull sends, ``theta - lr*m*v`` (``steps``
  momentum steps ahead: ``theta - lr*m*steps*v``);
- :func:`delay_compensate`: DC-ASGD's ``g + lc*g*g*(theta - p_i)``;
- :func:`gap_penalty`: Gap-Aware's ``g / (1 + |q_i - p_i| / C)``.

    >>> import torch
    >>> theta, v = torch.zeros(2), torch.ones(2)
    >>> momentum_step(theta, v, torch.ones(2), momentum=0.5, lr=0.1)
    tensor([-0.1500, -0.1500])
    >>> nesterov_pull(theta, v, lr=0.1, momentum=0.5, out=torch.empty(2))
    tensor([-0.2250, -0.2250])
"""

from __future__ import annotations

import torch
from torch import Tensor


def momentum_update(v: Tensor, g: Tensor, momentum: float, scale: float = 1.0) -> Tensor:
    """A momentum buffer's update ``v = m*v + scale*g``, in place; returns ``v``.

    Heavy ball's buffer (Polyak 1964; ``torch.optim.SGD``'s) with ``scale = 1``, the
    Sutskever et al. (2013) velocity with ``scale = -lr``, an exponential moving average
    with ``momentum = beta, scale = 1 - beta``."""
    return v.mul_(momentum).add_(g, alpha=scale)


def momentum_step(
    theta: Tensor,
    v: Tensor | None,
    g: Tensor,
    momentum: float,
    lr: float,
    scale: float = 1.0,
) -> Tensor:
    """Heavy-ball momentum (Polyak 1964): ``v = m*v + scale*g; theta -= lr*v``; without a
    buffer (``v is None``, ``m = 0``) ``theta -= lr*scale*g``. Returns ``theta``."""
    if v is None:
        return theta.add_(g, alpha=-lr * scale)
    momentum_update(v, g, momentum, scale)
    return theta.add_(v, alpha=-lr)


def momentum_sum(S: Tensor, v: Tensor, g: Tensor, momentum: float) -> Tensor:
    """``S += (m - 1)*v + g``: keeps ``S = sum_j v_j`` current in O(d) when ``v``, one of
    the ``v_j``, is about to take the update ``v = m*v + g`` (``S += v_new - v_old``,
    never re-summed; DANA's sum of the workers' momenta, Hakimi et al., arXiv
    1907.11612). Call it before updating ``v``; returns ``S``."""
    return S.add_(v, alpha=momentum - 1.0).add_(g)


def nesterov_pull(
    theta: Tensor, v: Tensor, lr: float, momentum: float, out: Tensor, steps: float = 1.0
) -> Tensor:
    """The Nesterov look-ahead ``theta - lr*m*v`` written into ``out`` (Sutskever et al.
    2013's form: where the momentum will carry ``theta``). ``steps``: the look-ahead
    ``theta - lr*m*steps*v`` that many momentum steps ahead, with ``v`` held (SMEGA2's
    estimate, Cohen et al. 2022; with ``m = 1`` the linear weight prediction
    ``theta - lr*D*v`` of Kosson et al. 2021)."""
    return torch.add(theta, v, alpha=-lr * momentum * steps, out=out)


def delay_compensate(g: Tensor, theta: Tensor, sent: Tensor, lc: Tensor | float, out: Tensor):
    """``out = g + lc * g * g * (theta - sent)``: DC-ASGD's first-order correction of a
    stale gradient with a diagonal estimate ``lc * g*g`` of the Hessian (Zheng et al.,
    ICML 2017); ``lc`` a number or a tensor (the adaptive coefficient)."""
    torch.sub(theta, sent, out=out)
    out.mul_(g).mul_(g).mul_(lc)
    return out.add_(g)


def gap_penalty(g: Tensor, lookahead: Tensor, sent: Tensor, scale: Tensor, out: Tensor) -> Tensor:
    """``out = g / (1 + |lookahead - sent| / scale)``: Gap-Aware's penalty (Barkai et al.,
    ICLR 2020), ``lookahead`` what a pull would send now, ``sent`` what the worker got,
    ``scale`` the typical size of one step per parameter. ``lookahead`` is overwritten
    (it may be ``out`` itself)."""
    G = lookahead.sub_(sent).abs_().div_(scale).add_(1.0)
    return torch.div(g, G, out=out)
